"""Per-test time limit that works even when the main thread is stuck inside a collective.

A signal cannot interrupt a collective blocked in C++, so a thread watches the deadline. When it passes,
the thread calls ``on_expiry``, which hands the run its ending (``Run.end``: what is known is written,
test, rank, host, which ranks had not finished, then the process ends; torchrun then stops the rest).
While a test runs the thread also calls ``on_poll`` every ``POLL_S``, so the run can notice a test that
can never finish (blocked in a collective a failed peer will never join) long before its limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from clustergate.run.limits import POLL_S


class Watchdog:
    def __init__(self, on_expiry: Callable[[str, float], None], on_poll: Callable[[], None] | None = None) -> None:
        self._on_expiry = on_expiry
        self._on_poll = on_poll
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._label = ""
        self._limit = 0.0
        self._expiry = on_expiry
        self._thread = threading.Thread(target=self._watch, name="clustergate-watchdog", daemon=True)
        self._thread.start()

    def arm(self, label: str, seconds: float, on_expiry: Callable[[str, float], None] | None = None) -> None:
        """Watch ``label`` for ``seconds``; ``on_expiry`` instead of the watchdog's own for this one."""
        with self._cond:
            self._label, self._limit = label, seconds
            self._expiry = on_expiry or self._on_expiry
            self._deadline = time.monotonic() + seconds
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None
            self._cond.notify()

    @property
    def deadline(self) -> float | None:
        return self._deadline

    def _watch(self) -> None:
        while True:
            with self._cond:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left <= 0:
                    label, limit, expiry = self._label, self._limit, self._expiry
                    self._deadline = None
                    break
                self._cond.wait(timeout=min(left, POLL_S))
                armed = self._deadline is not None
            if armed and self._on_poll is not None:
                self._on_poll()  # outside the lock: it may read the store
        expiry(label, limit)  # ends the process (Run.end)
