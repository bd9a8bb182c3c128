"""A stand-in for the pynvml module, for the NVML readers' unit tests (the plugin is never faked).

It answers like one H100 SXM with 18 NVLinks; ``counters`` holds every error counter it reports, so a
test plants an increase between two reads by changing a number. ``unsupported`` names functions that
answer NVML_ERROR_NOT_SUPPORTED, ``fail`` functions that answer another NVML error.
"""

from __future__ import annotations

import ctypes
import queue
from types import SimpleNamespace
from typing import Any

NOT_SUPPORTED, INVALID_ARGUMENT, TIMEOUT, GPU_IS_LOST = 3, 2, 10, 15
FIELD_IDS = {161: "replay", 162: "recovery", 163: "crc"}
LEGACY = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        return {2: "Invalid Argument", 3: "Not Supported", 10: "Timeout", 15: "GPU is lost"}.get(self.value, "Unknown")


class FabricInfo(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("status", ctypes.c_uint), ("state", ctypes.c_uint)]


class FakeNvml:
    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 0x8
    c_nvmlGpuFabricInfoV_t = FabricInfo

    def __init__(self, *, links: int = 18, field_values: bool = True) -> None:
        self.links = links
        self.field_values = field_values
        self.counters: dict[str, int] = {
            "ecc_corrected": 4, "ecc_uncorrected": 0, "remapped_correctable": 1, "remapped_uncorrectable": 0,
            "remap_pending": 0, "pcie_replay": 12,
        }
        self.link_counters = {link: {"replay": 0, "recovery": 0, "crc_flit": 3, "crc_data": 0}
                              for link in range(links)}
        self.unsupported: set[str] = {"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"}
        self.fail: dict[str, int] = {}
        self.fabric = (3, 0)  # completed, NVML_SUCCESS
        self.persistence = 1
        self.events: queue.Queue[int] = queue.Queue()
        self.freed = False

    def _check(self, name: str) -> None:
        if name in self.fail:
            raise NVMLError(self.fail[name])
        if name in self.unsupported:
            raise NVMLError(NOT_SUPPORTED)

    def __getattr__(self, name: str) -> Any:
        answers = {
            "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3", "nvmlDeviceGetUUID": "GPU-5e1f",
            "nvmlDeviceGetSerial": "1652923017345", "nvmlDeviceGetIndex": 3,
            "nvmlDeviceGetPciInfo": SimpleNamespace(busId=b"00000000:18:00.0"),
            "nvmlDeviceGetVbiosVersion": "96.00.74.00.0D", "nvmlDeviceGetBoardPartNumber": "692-2G520-0200-000",
            "nvmlDeviceGetInforomImageVersion": "G520.0200.00.05", "nvmlSystemGetDriverVersion": "550.54.15",
            "nvmlSystemGetCudaDriverVersion": 12040,
        }
        if name not in answers:
            raise AttributeError(name)

        def fn(*args: Any) -> Any:
            self._check(name)
            return answers[name]
        return fn

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, kind: int, counter: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors")
        return self.counters["ecc_uncorrected" if kind == 1 else "ecc_corrected"]

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        self._check("nvmlDeviceGetRemappedRows")
        c = self.counters
        return c["remapped_correctable"], c["remapped_uncorrectable"], c["remap_pending"], 0

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        self._check("nvmlDeviceGetRetiredPages")
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        self._check("nvmlDeviceGetRetiredPagesPendingStatus")
        return 0

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        self._check("nvmlDeviceGetPcieReplayCounter")
        return self.counters["pcie_replay"]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState")
        if link >= self.links:
            raise NVMLError(INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetFieldValues(self, handle: Any, ids: list[tuple[int, int]]) -> list[Any]:
        if not self.field_values:
            raise NVMLError(NOT_SUPPORTED)
        out = []
        for field, link in ids:
            c = self.link_counters[link]
            value = c["crc_flit"] + c["crc_data"] if FIELD_IDS[field] == "crc" else c[FIELD_IDS[field]]
            out.append(SimpleNamespace(nvmlReturn=0, valueType=3, value=SimpleNamespace(ullVal=value)))
        return out

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        self._check("nvmlDeviceGetNvLinkErrorCounter")
        return self.link_counters[link][LEGACY[counter]]

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        self._check("nvmlDeviceGetPersistenceMode")
        return self.persistence

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, ref: Any) -> int:
        self._check("nvmlDeviceGetGpuFabricInfoV")
        info = ref._obj
        info.state, info.status = self.fabric
        return 0

    # XID events: a test puts codes on ``events``; the watcher's wait returns them one by one.
    def nvmlEventSetCreate(self) -> str:
        self._check("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Any, kinds: int, event_set: Any) -> None:
        self._check("nvmlDeviceRegisterEvents")

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        try:
            code = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(TIMEOUT) from None
        return SimpleNamespace(eventType=0x8, eventData=code)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.freed = True
