"""progress.jsonl: a line when each test starts and ends, flushed as it happens.

A run that dies (a rank killed, a node lost) still says which test it was in.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class Progress:
    def __init__(self, path: Path | None) -> None:
        self._file = open(path, "a", buffering=1) if path is not None else None  # noqa: SIM115

    def event(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        line = {"time": time.time(), "event": event, **fields}
        # Flushed to the OS at once: a process that dies loses nothing. (No fsync: that guards
        # against a machine crash, and costs milliseconds per test on a busy disk.)
        self._file.write(json.dumps(line, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
