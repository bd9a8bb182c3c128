"""What every command that uses the store shares: its options, and one way of turning the store's refusals
into exit statuses (clustergate.common.exit_codes): no store or an unusable one 2, a store held too long by
another process 4."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from clustergate.common.exit_codes import Exit
from clustergate.record.outputs import Parser
from clustergate.record.resultsfile import ResultsFileError
from clustergate.store import STORE_ENV, Store, StoreBusy, StoreError, store_path
from clustergate.store.db import TIMEOUT_S


def command_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A parser whose help is the command module's docstring (``prog``: what it does, then the rest), with the
    store's options."""
    head, _, rest = doc.partition("\n\n")
    what = head.split(": ", 1)[1]
    p = Parser(prog=prog, description=what[0].upper() + what[1:], epilog=rest,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add_store_options(p)
    return p


def add_store_options(p: argparse.ArgumentParser) -> None:
    """``--store PATH`` and ``--wait S``."""
    p.add_argument("--store", metavar="PATH",
                   help=f"the store's file (default ${STORE_ENV}; --store '' uses none)")
    p.add_argument("--wait", type=float, default=TIMEOUT_S, metavar="S",
                   help=f"seconds to wait while another process holds the store (default {TIMEOUT_S:g})")


def with_store(prog: str, args: argparse.Namespace, work: Callable[[Store], int]) -> int:
    """``work(store)``'s status, or the status of why it could not be done (said on stderr)."""
    path = store_path(args.store)
    if path is None:
        print(f"{prog}: no store: pass --store PATH or set {STORE_ENV}", file=sys.stderr)
        return Exit.USAGE
    try:
        return work(Store(path, timeout_s=args.wait))
    except StoreBusy as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return Exit.COULD_NOT_RUN
    except (StoreError, ResultsFileError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return Exit.USAGE
