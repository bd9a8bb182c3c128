"""What /proc says of a process of this host: when it started, whether it still runs, its command line, which
processes hold a flock on a file. Each answers None, False, [] or "?" where /proc cannot say (another user's
process, a pid gone)."""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path


@functools.cache
def _boot_time() -> float:
    """When this host booted (seconds since the epoch): read once, it does not change."""
    return next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (/proc's stat, field 22); None where /proc cannot
    say."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])  # counted after the name
    except (OSError, ValueError, IndexError):
        return None


def process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, against /proc's whole-second boot time: the same
    figure at every call, so a pid's start can be compared for equality); else None."""
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    try:
        return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return None


def pid_alive(pid: int, since: float) -> bool:
    """Whether ``pid`` on this host still runs the process that wrote a lock at ``since`` (a pid
    reused by a process started later is not it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user's process
    started = process_start(pid)
    return started is None or started <= since + 2.0  # /proc's boot time is rounded to the second


def holders(path: Path) -> list[int]:
    """The processes of this host that hold a flock on the file ``path`` (its descriptor's ``lock:`` line in /proc),
    as far as this user may read them; the kernel's own table (/proc/locks) names only the process that took the
    lock, which may be gone while a child it forked keeps it."""
    try:
        wanted = os.stat(path)
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{entry}/fd/{fd}")
                    if (st.st_dev, st.st_ino) == (wanted.st_dev, wanted.st_ino) and \
                            "FLOCK" in Path(f"/proc/{entry}/fdinfo/{fd}").read_text():
                        found.append(int(entry))
                        break
    return sorted(found)


def command_line(pid: int, limit: int | None = 120) -> str:
    """A process's command line as one line (cut to ``limit`` characters; None: whole), or its name; "?" where it is
    gone."""
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        text = text or Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
    return text if limit is None or len(text) <= limit else text[:limit - 1] + "~"
