"""XID events of one GPU, heard through NVML while the suite runs.

NVML delivers the driver's critical XID errors to every process that registered for them
(``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents(..., nvmlEventTypeXidCriticalError, ...)``);
a watcher thread waits on the event set in short slices (the wait is a C call that releases the GIL)
and keeps every event with its time. Where NVML cannot deliver events (a VM, vGPU, an old driver)
``status`` says why and ``listening`` is False: the count is then unknown, not zero.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

NVML_ERROR_TIMEOUT = 10
XID_CRITICAL_EVENT = 0x8
"""nvmlEventTypeXidCriticalError (nvml.h)."""


class XidWatcher:
    def __init__(self, nvml: Any, handle: Any, poll_ms: int = 500) -> None:
        self.nvml, self.handle, self.poll_ms = nvml, handle, poll_ms
        self.events: list[dict[str, Any]] = []
        self.status = "not started"
        self.listening = False
        self._set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> XidWatcher:
        nvml = self.nvml
        try:
            self._set = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(self.handle, getattr(nvml, "nvmlEventTypeXidCriticalError",
                                                               XID_CRITICAL_EVENT), self._set)
        except nvml.NVMLError as exc:
            self.status = f"NVML cannot deliver XID events here: {type(exc).__name__}: {exc}"
            self._free()
            return self
        self.listening = True
        self.status = "listening"
        self._thread = threading.Thread(target=self._loop, name="clustergate-xid-watcher", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        nvml = self.nvml
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, self.poll_ms)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == NVML_ERROR_TIMEOUT:
                    continue
                self.status = f"stopped listening: {type(exc).__name__}: {exc}"
                self.listening = False
                return
            if int(data.eventType) & XID_CRITICAL_EVENT:
                self.events.append({"code": int(data.eventData), "time": time.time()})

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.poll_ms / 1000)
        self._free()

    def _free(self) -> None:
        if self._set is not None and (self._thread is None or not self._thread.is_alive()):
            with contextlib.suppress(Exception):  # freeing at the end of a session must never fail the run
                self.nvml.nvmlEventSetFree(self._set)
            self._set = None

    def summary(self) -> dict[str, Any]:
        return {"listening": self.listening, "status": self.status, "events": list(self.events)}


def watch(device: Any) -> XidWatcher | str:
    """A started watcher for a CUDA device, or why there is none."""
    from workloads.clocks import device_handle, init_nvml

    if getattr(device, "type", "cpu") != "cuda":
        return "no GPU on this rank"
    try:
        nvml = init_nvml()
        return XidWatcher(nvml, device_handle(nvml, device)).start()
    except Exception as exc:  # ImportError, NVMLError
        return f"NVML unavailable: {type(exc).__name__}: {exc}"
