"""``clustergate record``: record finished runs, merges and sign-offs into the store.

    clustergate record [--store PATH] [--wait S] RESULTS [RESULTS ...]

Each RESULTS is a run's results.json, a merge's cluster results.json, a signoff.json, or a report directory
(its results.json, and its signoff.json where there is one). Recording is idempotent: a file already
stored is named with its number and left as it is. This is how runs made before the store existed, or whose
recording failed, join the store later. The store is ``--store``, else ``$CLUSTERGATE_STORE``.

Exit status: 0 every file is stored; 2 no store given, a file that cannot be stored (not a results file,
a run that still says running, another version of a run already stored) or a store that cannot be used;
4 the store stayed locked by another process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clustergate.common.exit_codes import Exit
from clustergate.common.terminal import main_guarded
from clustergate.record.resultsfile import ResultsFileError
from clustergate.store import Store, StoreBusy, StoreError
from clustergate.store.command import command_parser, with_store

PROG = "clustergate record"
DIRECTORY_FILES = ("results.json", "signoff.json")
"""What a report directory holds that the store keeps (a run's or merge's results, a sign-off)."""


def parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, __doc__)
    p.add_argument("paths", nargs="+", type=Path, metavar="RESULTS",
                   help="results.json, cluster results.json, signoff.json, or a report directory")
    return p


def files(path: Path) -> list[Path]:
    """The files to record for one argument (ResultsFileError when a directory holds none)."""
    if not path.is_dir():
        return [path]
    found = [path / name for name in DIRECTORY_FILES if (path / name).is_file()]
    if not found:
        raise ResultsFileError(f"{path}: a directory without {' or '.join(DIRECTORY_FILES)}: not a report directory")
    return found


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def record(store: Store) -> int:
        status = Exit.ACCEPT
        for arg in args.paths:
            try:
                for path in files(arg):
                    done = store.record_file(path)
                    said = "recorded" if done.new else "already stored"
                    print(f"{path}: {said} as {done.kind} #{done.run} in {store.path}")
            except StoreBusy:
                raise  # the store, not this file: no later file would fare better
            except (StoreError, ResultsFileError) as exc:
                print(f"{PROG}: {exc}", file=sys.stderr)
                status = Exit.USAGE
        return status

    return main_guarded(PROG, lambda: with_store(PROG, args, record))


if __name__ == "__main__":
    sys.exit(main())
