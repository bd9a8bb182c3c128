"""``clustergate history``: each stored figure's history, oldest run first.

    clustergate history [HOST|SERIAL|UUID] [--metric M] [--json] [--store PATH] [--wait S]

With a host, every figure measured on that host (its GPUs as they were then, and its per-node figures);
with a GPU serial or UUID, every figure of that GPU on whichever host it was; with neither, every figure.
A host's history also lists what each recorded merge and sign-off decided of it. The store is ``--store``,
else ``$CLUSTERGATE_STORE``.

Exit status: 0 the history was printed (an empty one too); 2 no store given, or one that cannot be used
(missing, not a store, damaged, of a newer schema); 4 the store stayed locked by another process.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clustergate.common.exit_codes import Exit
from clustergate.common.numbers import number
from clustergate.common.terminal import main_guarded, printable
from clustergate.store import Decision, Store, StoredFigure
from clustergate.store.command import command_parser, with_store

PROG = "clustergate history"
COLUMNS = ("time", "run", "host", "gpu", "serial", "metric", "value", "unit", "verdict")


def parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, __doc__)
    p.add_argument("who", nargs="?", metavar="HOST|SERIAL|UUID",
                   help="a host, or a GPU's serial or UUID (default: every part)")
    p.add_argument("--metric", metavar="M", help="only this metric (e.g. matmul_bf16_tflops)")
    p.add_argument("--json", action="store_true", help="print JSON: {store, query, figures, decisions}")
    return p


def part(f: StoredFigure) -> str:
    """The GPU column: the GPU's index; a per-rank figure without one (a CPU run's) by its rank, as metrics.prom
    names it, so rank 0's history is not rank 1's."""
    if f.gpu_index is not None:
        return str(f.gpu_index)
    return f"rank {f.rank}" if f.scope == "gpu" and f.rank is not None else ""


def cells(f: StoredFigure) -> list[str]:
    gpu = part(f)
    return [f.time or "?", f"#{f.run}", printable(f.host or "(whole job)"), gpu, printable(f.serial or ""), f.metric,
            number(f.value), printable(f.unit), f.verdict]


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> list[str]:
    """Left-aligned columns as wide as their widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in (list(header), *rows)]


def decision_line(d: Decision) -> str:
    why = f": {'; '.join(printable(r) for r in d.reasons)}" if d.reasons else ""
    phase = f" ({d.phase} phase)" if d.phase else ""
    return f"{d.time or '?'}  #{d.run}  {d.kind}: {printable(d.host)} {d.status}{phase}{why}"


@dataclass(frozen=True, slots=True)
class History:
    """What one query found."""

    store: str
    who: str | None
    metric: str | None
    figures: list[StoredFigure]
    decisions: list[Decision]

    @classmethod
    def of(cls, store: Store, who: str | None, metric: str | None) -> History:
        decisions = store.decisions(who) if who is not None and metric is None else []
        return cls(str(store.path), who, metric, store.history(who, metric), decisions)

    def as_json(self) -> dict[str, Any]:
        return {"store": self.store, "query": {"who": self.who, "metric": self.metric},
                "figures": [f.as_json() for f in self.figures], "decisions": [d.as_json() for d in self.decisions]}

    def lines(self) -> list[str]:
        what = " ".join(filter(None, [printable(self.who or ""), f"metric {self.metric}" if self.metric else ""]))
        out = [f"store: {printable(self.store)}"]
        if self.figures:
            runs = len({f.run for f in self.figures})
            out.append(f"{len(self.figures)} figures from {runs} run{'s' if runs != 1 else ''}"
                       + (f" ({what})" if what else ""))
            out += table([cells(f) for f in self.figures], [c.upper() for c in COLUMNS])
        else:
            out.append(f"no figures recorded{' for ' + what if what else ''}")
        if self.decisions:
            out.append("merges and sign-offs:")
            out += [f"  {decision_line(d)}" for d in self.decisions]
        return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def show(store: Store) -> int:
        found = History.of(store, args.who, args.metric)
        print(json.dumps(found.as_json(), indent=2) if args.json else "\n".join(found.lines()))
        return Exit.ACCEPT

    return main_guarded(PROG, lambda: with_store(PROG, args, show))


if __name__ == "__main__":
    sys.exit(main())
