"""progress.jsonl: a line when each test starts and ends, flushed as it happens.

A run that dies (a rank killed, a node lost) still says which test it was in. Lines are redacted
like every output (``clustergate.redact``). A failed write raises: the session treats it as the end
of the run, never as something to skip.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from clustergate.redact import redact


class Progress:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._file = open(path, "a", buffering=1) if path is not None else None  # noqa: SIM115
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
