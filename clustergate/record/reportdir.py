"""The report directory: usable on every rank, held by one run at a time, and free of an earlier run's outputs.

- ``problem``: why a rank cannot use the directory (cannot be made, not writable, no room, an output
  name that is a symbolic link), or None. Checked by writing a file there: permission bits say nothing
  about a read-only mount or root.
- ``RunLock``: an advisory lock (flock) on ``.clustergate.lock`` for the whole run; the kernel drops
  it when the process ends, however it ends, so a killed run never leaves a stale lock. A process forked by
  the run does not keep it (a flock belongs to every descriptor of its open file, a forked child's copy too:
  a child a test left running held the directory after the run); a run refused because the lock is held names
  the process that holds it, read from /proc, not only the run the lock file names. The file is
  0600 and must be the user's own: flock needs only a file one can open, so a lock file others can
  read lets any of them block every run with a read lock. Where the file system has no flock (some
  NFS and FUSE mounts answer ENOLCK, EOPNOTSUPP or EINVAL) the run holds ``.clustergate.lock.owner``
  instead, made with O_EXCL and naming pid and host; one whose pid is gone on this host is stale.
- ``move_aside``: the outputs of an earlier run go to ``earlier/<time>/``, so no report of another run
  can be read as this run's.

A file is written whole, never in place of what is not a regular file, by ``clustergate.common.files``; what /proc
says of a process is read by ``clustergate.common.procfs``; the lock file where flock does not work is
``clustergate.common.ownerfile``'s.

Files and folders a run makes get the user's umask (report.html and junit.xml, which pytest writes,
do too); the lock file is always 0600.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import pwd
import re
import shutil
import socket
import stat
import tempfile
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from clustergate.common import inputfile
from clustergate.common.files import NotAFile, not_a_file, not_files, refuse_not_a_directory, write_atomic
from clustergate.common.ownerfile import OwnerFile
from clustergate.common.procfs import command_line, holders, pid_alive
from clustergate.secrets.redact import Scrubber

OUTPUTS = ("results.json", "report.html", "junit.xml", "progress.jsonl", "metrics.prom", "report-rerendered.html",
           "nvidia-smi-q.txt")
"""What a run writes into the directory (and the report command's default re-render, and ``nvidia-smi -q`` as the
launcher captures it after the run, for an evidence bundle)."""

MIN_FREE_BYTES = 64 * 2**20
"""Room the outputs need: report.html with its figures runs to a few MiB on a large cluster."""

LOCK_NAME = ".clustergate.lock"
OWNER_NAME = ".clustergate.lock.owner"
"""The lock where flock does not work: it exists while a run holds the directory."""

NOT_LINKS = (*OUTPUTS, "earlier", LOCK_NAME, OWNER_NAME)
"""Names in the directory a run writes or moves into: none of them may be a symbolic link."""

NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})
"""flock's answers on a file system that does not support it (as the ``filelock`` library reads them)."""

Flock = Callable[[int, int], None]


def _err(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{name}: {exc.strerror}" if name and exc.strerror else str(exc)


def links(path: Path, names: tuple[str, ...] = NOT_LINKS) -> list[str]:
    """'NAME (a link to TARGET)' for each name a run writes (``names``) that is a symbolic link in ``path``."""
    found = []
    for name in names:
        with contextlib.suppress(OSError):
            found.append(f"{name} (a link to {os.readlink(path / name)})")
    return found


def problem(path: Path) -> str | None:
    """Why this rank cannot write its outputs under ``path`` (None: it can)."""
    try:
        refuse_not_a_directory(path)
        path.mkdir(parents=True, exist_ok=True)
    except NotAFile as exc:
        return f"it is {exc.kind}, not a directory; name a directory (it is made where it does not exist)"
    except OSError as exc:
        return f"cannot create it ({exc.strerror or exc})"
    linked = links(path)
    if linked:
        return (f"{linked[0]} is a symbolic link there; clustergate writes no output through a link (it "
                "could overwrite another file): remove the link")
    odd = not_files(path, (*OUTPUTS, LOCK_NAME, OWNER_NAME))
    if odd:
        return (f"{odd[0].filename} is {odd[0].kind} there, not a regular file; clustergate never replaces one "
                "under an output's name: remove it, or choose another --report-dir")
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".clustergate-probe-")
    except OSError as exc:
        return f"cannot write in it ({exc.strerror or exc})"
    try:
        os.write(fd, b"probe\n")
    except OSError as exc:
        return f"cannot write in it ({exc.strerror or exc})"
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    free = shutil.disk_usage(path).free
    if free < MIN_FREE_BYTES:
        return f"only {free / 2**20:.1f} MiB free there; the outputs need {MIN_FREE_BYTES // 2**20} MiB"
    return None


def _holder_line() -> str:
    return (f"pid {os.getpid()} on {socket.gethostname()}, started "
            f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}\n")


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


_HELD: weakref.WeakSet[RunLock] = weakref.WeakSet()
"""The locks this process holds: a process it forks lets go of its copies (``_leave_locks``)."""


def _leave_locks() -> None:
    """In a forked child: close its copy of every held lock's descriptor (the parent keeps the lock), and forget
    the lock file made where flock does not work (the child never removes it)."""
    for lock in list(_HELD):
        if lock._fd is not None:
            with contextlib.suppress(OSError):
                os.close(lock._fd)
        lock._fd = lock._owner.ino = None
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_leave_locks)


class RunLock:
    """Held by rank 0 from start to exit. ``acquire`` says why not when it cannot be held."""

    def __init__(self, path: Path, flock: Flock = fcntl.flock) -> None:
        self.path = path / LOCK_NAME
        self.owner_path = path / OWNER_NAME
        self._flock = flock
        self._fd: int | None = None
        self._owner = OwnerFile(self.owner_path)
        self.no_flock: str | None = None
        """Why flock could not be used (the lock file holds the directory instead), or None."""
        self.took_over: str | None = None
        """The holder of a stale lock file this run replaced, or None."""
        self.holder: str | None = None
        """Who holds the directory when ``acquire`` found another run there (pid, host, since when)."""

    @property
    def held(self) -> bool:
        return self._fd is not None or self._owner.held

    def acquire(self) -> str | None:
        """None once held; else the rest of a sentence after "--report-dir DIR": another run holds it
        ("is in use by another clustergate run (pid, host, since when); ..."), or why it cannot be held."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return (f"cannot be held: its lock file {self.path} is a symbolic link; remove it (clustergate "
                        "opens no file there through a link)")
            owner = ""
            with contextlib.suppress(OSError):
                owner = f", which belongs to {_user(os.lstat(self.path).st_uid)}"
            return f"cannot be held: its lock file {self.path} cannot be opened ({_err(exc)}){owner}"
        try:
            refusal = self._lock(fd)
        except BaseException:
            os.close(fd)
            raise
        if refusal is not None or self._fd is None:
            os.close(fd)
        return refusal

    def _lock(self, fd: int) -> str | None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"cannot be held: {NotAFile(self.path, not_a_file(self.path) or 'not a regular file')}"
        if st.st_uid != os.geteuid():
            return (f"cannot be held: its lock file {self.path} belongs to {_user(st.st_uid)}, not to this "
                    "user; whoever can open it can block every run by locking it, so clustergate uses only "
                    "its own. Remove it, or choose another --report-dir")
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)  # made by an older clustergate: others could open it and hold a read lock
        try:
            self._flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return self._held_by(os.read(fd, 512).decode(errors="replace").strip())
            if exc.errno in NO_FLOCK:
                self.no_flock = _err(exc)
                return self._acquire_owner_file()
            return (f"cannot be held: flock on its lock file {self.path} failed ({_err(exc)}); this is not "
                    "another run holding it. Choose a --report-dir on another file system")
        os.ftruncate(fd, 0)
        os.write(fd, _holder_line().encode())
        self._fd = fd
        _HELD.add(self)
        return None

    def _held_by(self, written: str) -> str:
        """The refusal of a directory whose lock another process holds: the run its lock file names, where that run
        holds it; else the processes that do (a process the named run started, which kept the lock)."""
        named = re.match(r"pid (\d+) on (\S+),", written)
        found = holders(self.path)
        here = named is not None and named.group(2) == socket.gethostname()
        if here and int(named.group(1)) not in found and (found or not os.path.exists(f"/proc/{named.group(1)}")):
            self.holder = f"pid {found[0]} on {socket.gethostname()}" if found else written
            who = "; ".join(f"pid {pid} ({command_line(pid)})" for pid in found) or "a process this user cannot see"
            end = f"end {'it' if len(found) == 1 else 'them'} (kill {' '.join(map(str, found))})" if found else "end it"
            return (f"is held by {who}, which keeps its lock file {self.path} locked; the run that took it "
                    f"({written}) has ended: {end} or choose another --report-dir")
        self.holder = written or (f"pid {found[0]} ({command_line(found[0])})" if found else "another process")
        return (f"is in use by another clustergate run ({self.holder}); wait for it to end or choose another "
                "--report-dir")

    # ---- where flock does not work ---------------------------------------------------------
    def _acquire_owner_file(self) -> str | None:
        how = (f"held through the lock file {self.owner_path}, as flock does not work on this file system "
               f"({self.no_flock})")
        for _ in range(5):
            try:
                made = self._owner.take(_holder_line())
            except OSError as exc:
                return f"cannot be held: flock does not work there ({self.no_flock}) and {self.owner_path} " \
                       f"cannot be made ({_err(exc)})"
            if made:
                _HELD.add(self)
                # No kernel drops this one: a run that ends before pytest unconfigures (an unknown option)
                # removes it at exit. Only a killed run leaves it, for the next run to find stale.
                atexit.register(self.release)
                return None
            try:
                holder, ino, alive, here = self._read_owner()
            except FileNotFoundError:
                continue  # its holder just released it: try again
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return f"cannot be held: its lock file {self.owner_path} is a symbolic link; remove it"
                return f"cannot be held: its lock file {self.owner_path} cannot be read ({_err(exc)})"
            self.holder = holder if alive or not here else None
            if alive:
                return f"is in use by another clustergate run ({holder}; {how}); wait for it to end or " \
                       "choose another --report-dir"
            if not here:
                return (f"is in use by another clustergate run ({holder}; {how}); that host is not this one, "
                        f"so clustergate cannot tell whether it still runs: if it does not, remove "
                        f"{self.owner_path}")
            self._remove_stale(ino)
            self.took_over = holder
        return f"cannot be held: its lock file {self.owner_path} kept changing ({how})"

    def _read_owner(self) -> tuple[str, int, bool, bool]:
        """(holder, inode, alive, on this host) of the lock file another run made."""
        text, st = self._owner.holder()
        m = re.match(r"pid (\d+) on (\S+),", text)
        if m is None:  # being written just now, or not ours: never taken for stale
            return text or "a holder that has not written its name yet", st.st_ino, True, True
        here = m.group(2) == socket.gethostname()
        return text, st.st_ino, here and pid_alive(int(m.group(1)), st.st_mtime), here

    def _remove_stale(self, ino: int) -> None:
        """Remove the lock file of a run that is gone, unless another run has replaced it meanwhile."""
        self._owner.remove_stale(ino)

    def release(self) -> None:
        _HELD.discard(self)
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
        self._owner.release()


def move_aside(path: Path, names: tuple[str, ...] = OUTPUTS, directories: tuple[str, ...] = ()) -> dict[Path, Path]:
    """Move an earlier run's outputs (``names``: a run's, or a cluster command's; those of ``directories`` among
    them are directories, merge's evidence bundles) to ``earlier/<UTC time>/``; returns where each went.

    Refuses (OSError) when an output name or ``earlier`` is a symbolic link: ``problem`` says so; and (NotAFile)
    when an output name is not what it is written as (a regular file, or a directory), or ``earlier`` is not a
    directory."""
    linked = links(path, (*NOT_LINKS, *names))
    if linked:
        raise OSError(errno.ELOOP, f"{linked[0]} is a symbolic link there")
    # A device or a FIFO under an output's name is no earlier output: left alone.
    odd = not_files(path, tuple(name for name in names if name not in directories))
    if odd:
        raise odd[0]
    for name in directories:
        refuse_not_a_directory(path / name)
    refuse_not_a_directory(path / "earlier")
    found = [path / name for name in names if (path / name).exists()]
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


def stale_note(path: Path, why: str | None) -> str | None:
    """What an error must add when an earlier run's results.json stays in ``path`` (None: none there); ``why`` it
    could not be moved, or None: the run was refused before it wrote anything, and left it as it was."""
    results = path / "results.json"
    if not results.exists() and not results.is_symlink() or not_a_file(results) is not None:
        return None  # nothing there, or no run's record (a FIFO, a device): the error itself names it
    said = ""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        data = json.loads(inputfile.read_text(results, "results"))
        said = f" (verdict {data.get('verdict')!r}, started {data.get('started')})"
    if why is None:
        return (f"NOTE: {results}{said} is an earlier run's, NOT the result of this run, which was refused before "
                "it wrote anything: the directory is left as it was")
    return (f"NOTE: {results}{said} is an earlier run's, NOT the result of this run, which stopped before "
            f"its first test; it could not be moved to {path / 'earlier'}/ ({why})")


def scrub_file(path: Path, scrub: Scrubber | None = None) -> bool:
    """Scrub a written page in place (junit.xml, report.html): ``Scrubber.in_markup``; True if it held a secret."""
    scrub = Scrubber.from_environment() if scrub is None else scrub
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    clean = scrub.in_markup(text)
    if clean == text:
        return False
    write_atomic(path, clean)  # through a random temporary name: no link planted as X.tmp is followed
    return True


def node_directory(stored: str, run_dir: Path) -> Path:
    """A node directory as merge recorded it: relative to the run's directory (one that lay inside it), else as
    given to merge (absolute, or relative to where an older merge ran). The run's own copy comes first: a run
    directory copied elsewhere is judged by the node files it holds, not by the original's."""
    path = Path(stored)
    if path.is_absolute():
        return path
    inside = run_dir / path
    return inside if inside.exists() or not path.exists() else path
