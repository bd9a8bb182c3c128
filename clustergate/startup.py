"""What the run checks before any test: the numbers on the command line, and the report directory on
every rank (usable, held by this run alone, cleared of an earlier run's outputs). Each problem is one
pytest.UsageError naming the option or path and what to do, raised alike on every rank.
"""

from __future__ import annotations

import math
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from clustergate import control, reportdir
from clustergate.control import Step, within
from clustergate.session import STARTUP_S
from clustergate.world import World

LOCK = pytest.StashKey[reportdir.RunLock]()
"""The report directory's lock, held by rank 0 until the run ends."""


def check_seconds(what: str, value: float | None) -> None:
    """A time limit must be a finite number of seconds above 0 (0 would silently mean the default)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise pytest.UsageError(f"{what} {value}: a time limit must be a finite number of seconds above 0")


def given_or(given: float | None, default: float) -> float:
    return default if given is None else given


def prepare_report_dir(config: pytest.Config, world: World, root: Path) -> Path:
    """Rank 0 names the directory (its clock) and every rank uses that name. Every rank must be able to
    write there; rank 0 then holds it for this run and moves an earlier run's outputs aside."""
    try:
        return _prepare(config, world, root)
    except control.ControlLost as exc:  # a rank died during start-up: one clear line, not a traceback
        raise pytest.UsageError(f"the run could not start: {exc}") from None


def _prepare(config: pytest.Config, world: World, root: Path) -> Path:
    chosen = config.getoption("report_dir")
    if chosen is None and world.is_leader:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        chosen = str(root / "reports" / stamp)
    chosen = control.broadcast_from_leader(world, chosen, Step(None, "report directory", within(STARTUP_S)))
    path = Path(chosen)
    problems = control.all_gather(world, (world.host, reportdir.problem(path)),
                                  Step(None, "report directory check", within(STARTUP_S)))
    bad = [(r, host, why) for r, (host, why) in enumerate(problems) if why]
    if bad:
        r, host, why = bad[0]
        where = f" on rank {r} ({host})" + (f" and {len(bad) - 1} other ranks" if len(bad) > 1 else "") \
            if world.launched else ""
        raise pytest.UsageError(f"--report-dir {path}: {why}{where}; choose a directory every rank can "
                                "write to (--report-dir DIR)")
    held_by = None
    if world.is_leader:
        lock = reportdir.RunLock(path)
        held_by = lock.acquire()
        if held_by is None:
            config.stash[LOCK] = lock
            move_earlier_outputs(config, path)
    held_by = control.broadcast_from_leader(world, held_by, Step(None, "report directory lock", within(STARTUP_S)))
    if held_by:
        raise pytest.UsageError(f"--report-dir {path} is in use by another clustergate run ({held_by}); wait "
                                "for it to end or choose another --report-dir")
    return path


def move_earlier_outputs(config: pytest.Config, path: Path) -> None:
    """No report of an earlier run may be read as this run's; a --baseline among them follows it."""
    moved = reportdir.move_aside(path)
    if not moved:
        return
    baseline = config.getoption("baseline", None)
    if baseline:
        source = Path(baseline) / "results.json" if Path(baseline).is_dir() else Path(baseline)
        for old, new in moved.items():
            if source.resolve() == old.resolve():
                config.option.baseline = str(new)
    sys.stderr.write(f"clustergate: an earlier run's outputs in {path} were moved to "
                     f"{next(iter(moved.values())).parent}\n")
