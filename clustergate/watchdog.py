"""Per-test time limit that works even when the main thread is stuck inside a collective.

A signal cannot interrupt a collective blocked in C++, so a thread watches the deadline. When
it passes, the thread calls ``on_expiry`` (which writes what is known: test, rank, host, which
ranks had not finished) and ends the process with ``os._exit``; torchrun then stops the rest.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable

EXIT_TIMEOUT = 3


class Watchdog:
    def __init__(self, on_expiry: Callable[[str, float], None]) -> None:
        self._on_expiry = on_expiry
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._label = ""
        self._limit = 0.0
        self._thread = threading.Thread(target=self._watch, name="clustergate-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str, seconds: float) -> None:
        with self._cond:
            self._label, self._limit = label, seconds
            self._deadline = time.monotonic() + seconds
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(timeout=left)
                    continue
                label, limit = self._label, self._limit
                break
        try:
            self._on_expiry(label, limit)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        finally:
            sys.stderr.flush()
            os._exit(EXIT_TIMEOUT)
