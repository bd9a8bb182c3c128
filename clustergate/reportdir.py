"""The report directory: usable on every rank, held by one run at a time, and free of an earlier run's outputs.

- ``problem``: why a rank cannot use the directory (cannot be made, not writable, no room), or None.
  Checked by writing a file there: permission bits say nothing about a read-only mount or root.
- ``RunLock``: an advisory lock (flock) on ``.clustergate.lock`` for the whole run; the kernel drops
  it when the process ends, however it ends, so a killed run never leaves a stale lock.
- ``move_aside``: the outputs of an earlier run go to ``earlier/<time>/``, so no report.html of
  another run can be read as this run's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
from datetime import datetime, timezone
from pathlib import Path

OUTPUTS = ("results.json", "report.html", "junit.xml", "progress.jsonl", "report-rerendered.html")
"""What a run writes into the directory (and the report command's default re-render)."""

MIN_FREE_BYTES = 64 * 2**20
"""Room the outputs need: report.html with its figures runs to a few MiB on a large cluster."""

LOCK_NAME = ".clustergate.lock"


def problem(path: Path) -> str | None:
    """Why this rank cannot write its outputs under ``path`` (None: it can)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create it ({exc.strerror or exc})"
    probe = path / f".clustergate-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        with open(probe, "w") as f:
            f.write("probe\n")
    except OSError as exc:
        return f"cannot write in it ({exc.strerror or exc})"
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    free = shutil.disk_usage(path).free
    if free < MIN_FREE_BYTES:
        return f"only {free / 2**20:.1f} MiB free there; the outputs need {MIN_FREE_BYTES // 2**20} MiB"
    return None


class RunLock:
    """Held by rank 0 from start to exit; a second run into the same directory gets ``held_by``."""

    def __init__(self, path: Path) -> None:
        self.path = path / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """None once held; else who holds it (host, pid, since when)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 512).decode(errors="replace").strip() or "another process"
            os.close(fd)
            return holder
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started "
                     f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}\n".encode())
        self._fd = fd
        return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def move_aside(path: Path) -> dict[Path, Path]:
    """Move an earlier run's outputs to ``earlier/<UTC time>/``; returns where each went."""
    found = [path / name for name in OUTPUTS if (path / name).exists()]
    if not found:
        return {}
    newest = max(p.stat().st_mtime for p in found)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(newest))
    target = path / "earlier" / stamp
    n = 1
    while target.exists():
        n += 1
        target = path / "earlier" / f"{stamp}-{n}"
    target.mkdir(parents=True)
    moved = {}
    for old in found:
        new = target / old.name
        os.replace(old, new)
        moved[old] = new
    return moved
