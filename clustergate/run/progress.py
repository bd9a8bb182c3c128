"""progress.jsonl: a line when each test starts and ends, flushed as it happens.

A run that dies (a rank killed, a node lost) still says which test it was in. Lines are redacted
like every output (``clustergate.secrets.redact``). A failed write raises: the session treats it as the end
of the run, never as something to skip.

The file is new for every run (the earlier run's was moved aside before): it is made with O_EXCL and
O_NOFOLLOW, so a link or a file planted under its name is refused, never written through.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from clustergate.secrets.redact import redact


class Progress:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file = os.fdopen(_create(path), "a", buffering=1) if path is not None else None
        self._lock = threading.Lock()  # the watchdog and signal threads write endings too

    def event(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = redact({"time": time.time(), "event": event, **fields})
        # Flushed to the OS at once: a process that dies loses nothing. (No fsync: that guards
        # against a machine crash, and costs milliseconds per test on a busy disk.)
        with self._lock:
            if self._file is None:
                return  # closed: the session has ended
            self._file.write(json.dumps(line, default=str) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _create(path: Path) -> int:
    """A new progress.jsonl with the user's umask; an OSError saying what is in the way otherwise."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o666)
    except FileExistsError:
        if path.is_symlink():
            raise OSError(errno.ELOOP, f"{path} is a symbolic link (to {os.readlink(path)}); clustergate "
                                       "writes no output through a link: remove it") from None
        raise OSError(errno.EEXIST, f"{path} already exists although this run moved the earlier outputs "
                                    "aside when it started: another process writes into --report-dir") from None
