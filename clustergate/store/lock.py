"""The store's lock: one process at a time reads or writes the store, whichever host it runs on.

SQLite's own locks are POSIX advisory locks, which a network file system may not carry between hosts
(an NFS mount with ``nolock`` keeps them local; SQLite's documentation warns that locking over NFS is
unreliable), and its WAL mode needs memory shared between the processes, which hosts do not share. So
every access to the store holds ``STORE.lock``, a file made with ``O_CREAT | O_EXCL``
(``clustergate.common.ownerfile``, the run lock's own where flock does not work): NFS v3 and later
create a file exclusively on the server, so of two hosts that try at once exactly one makes it. The
holder writes its pid, host, boot id and pid namespace into it and removes it when done.

A lock whose holder is gone is stale. Only a holder of this host, this boot and this pid namespace can be
seen to be gone (its pid no longer runs the process that took the lock): such a lock is taken over. One
held from another host (or another container on this one) cannot be judged from here: after the
timeout the caller is refused with the holder's name and the file to remove if that holder is gone. A
write holds the lock for milliseconds, so a lock that outlives the timeout is a holder that died.
"""

from __future__ import annotations

import errno
import os
import random
import re
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType

from clustergate.common.ownerfile import OwnerFile
from clustergate.common.procfs import pid_alive

SUFFIX = ".lock"
LINE = re.compile(r"pid (\d+) on (\S+) boot (\S+) pidns (\S+) since (\S+)")


class StoreError(Exception):
    """The store cannot be used: the message names the file and says what to do."""


class DocumentError(StoreError):
    """This document cannot be stored (it still says running, is not strict JSON, or another version of it is
    stored); the store itself is fine, and other documents may be."""


class StoreBusy(StoreError):
    """Another process held the store's lock for the whole timeout."""


class LockNotWritable(StoreError):
    """The lock file cannot be made: the store's directory is read-only to this user (reads may go ahead)."""


NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or "-"
    except OSError:
        return "-"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").replace(" ", "")
    except OSError:
        return "-"


def holder_line() -> str:
    """What this process writes into a lock it holds."""
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return f"pid {os.getpid()} on {socket.gethostname()} boot {_boot_id()} pidns {_pid_namespace()} since {since}\n"


def _err(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{name}: {exc.strerror}" if name and exc.strerror else str(exc)


class StoreLock:
    """``with StoreLock(store, timeout_s):`` holds ``STORE.lock`` for the block."""

    def __init__(self, store: Path, timeout_s: float) -> None:
        self.store = store
        self.path = store.with_name(store.name + SUFFIX)
        self.timeout_s = timeout_s
        self._file = OwnerFile(self.path, 0o644)
        self.took_over: str | None = None
        """The holder of a stale lock this process replaced, or None."""

    @property
    def held(self) -> bool:
        return self._file.held

    def acquire(self) -> None:
        """Hold the lock; StoreBusy after ``timeout_s``, StoreError when it cannot be made at all."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.005
        while True:
            try:
                made = self._file.take(holder_line())
            except OSError as exc:
                kind = LockNotWritable if exc.errno in NOT_WRITABLE else StoreError
                raise kind(f"{self.store}: cannot make its lock file {self.path} ({_err(exc)}); the store's "
                           "directory must be writable by whoever records into it") from None
            if not made:
                holder = self._check_holder()
                if holder is None:
                    continue  # stale, removed, or released just now: try again at once
                if time.monotonic() >= deadline:
                    raise StoreBusy(
                        f"{self.store}: another process held the store for {self.timeout_s:g} s ({holder}; "
                        f"lock file {self.path}). Try again; if that process is gone (a host that crashed while "
                        f"recording), remove {self.path}") from None
                time.sleep(delay * random.uniform(0.5, 1.5))  # unequal waits: waiters do not retry in step
                delay = min(delay * 2, 0.25)
                continue
            return

    def _check_holder(self) -> str | None:
        """Who holds the lock, or None when it is gone or was stale (then removed)."""
        try:
            text, st = self._file.holder()
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError(f"{self.store}: its lock file {self.path} is a symbolic link; remove it "
                                 "(clustergate makes its lock itself and follows no link there)") from None
            raise StoreError(f"{self.store}: its lock file {self.path} cannot be read ({_err(exc)})") from None
        m = LINE.fullmatch(text)
        if m is None:  # being written just now, or not ours: never taken for stale
            return text or "a holder that has not written its name yet"
        pid, host, boot, pidns = int(m[1]), m[2], m[3], m[4]
        here = (host, boot, pidns) == (socket.gethostname(), _boot_id(), _pid_namespace())
        if here and not pid_alive(pid, st.st_mtime):
            self._remove_stale(st.st_ino)
            self.took_over = text
            return None
        return f"pid {pid} on {host} since {m[5]}"

    def _remove_stale(self, ino: int) -> None:
        """Remove a stale lock unless another process has replaced it meanwhile."""
        self._file.remove_stale(ino)

    def release(self) -> None:
        self._file.release()

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
