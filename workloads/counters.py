"""Counter snapshots before and after a run, and what changed between them: one rule for every reader.

A snapshot is ``{part: {counter: value}}`` (a part is what the counter belongs to: a PCI device, an
InfiniBand port, a GPU). ``diff`` pairs two snapshots counter by counter and says how much each grew,
with the cases a plain subtraction gets wrong said out loud: a counter that went down (the device was
reset or the driver reloaded during the run: the growth is at least the new value), a counter stuck at
its width's maximum (it saturates instead of wrapping, so it can no longer show growth), and a part
that was there before and is gone after (a device that fell off the bus, a port that vanished).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

Snapshot = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True, slots=True)
class Change:
    part: str
    counter: str
    before: int | None
    after: int | None
    delta: int | None
    """Growth over the run; None where it cannot be known (saturated before, or the part is gone)."""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """'symbol_error 12 -> 40 (+28)', with the note when there is one."""
        grew = "" if self.delta is None else f" (+{self.delta})"
        return f"{self.counter} {self.before} -> {self.after}{grew}" + (f" [{self.note}]" if self.note else "")


def diff(before: Snapshot, after: Snapshot, widths: Mapping[str, int] | None = None) -> list[Change]:
    """Every counter of every part seen before the run, paired with its value after.

    ``widths``: bits of counters that saturate (InfiniBand's PortCounters: symbol_error is 16 bits,
    link_downed 8): a value at the maximum before the run means the counter cannot show growth.
    """
    widths = widths or {}
    out: list[Change] = []
    for part in sorted(before):
        now = after.get(part)
        for counter in sorted(before[part]):
            old = int(before[part][counter])
            if now is None or counter not in now:
                out.append(Change(part, counter, old, None, None, "gone after the run: the device or port vanished"))
                continue
            new = int(now[counter])
            top = (1 << widths[counter]) - 1 if counter in widths else None
            if top is not None and old >= top:
                out.append(Change(part, counter, old, new, None,
                                  f"saturated at {top} before the run, so it cannot show growth: clear it "
                                  "(perfquery -x -R) and run again"))
            elif new < old:
                out.append(Change(part, counter, old, new, new,
                                  f"went down from {old}: the device was reset or the driver reloaded during the run"))
            else:
                out.append(Change(part, counter, old, new, new - old))
    return out


def grown(changes: list[Change]) -> list[Change]:
    """The changes that count against a part: growth, or a part that vanished."""
    return [c for c in changes if (c.delta or 0) > 0 or c.after is None]
