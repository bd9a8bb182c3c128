"""A stand-in for the pynvml module, for the NVML readers' unit tests (the plugin is never faked).

It answers like one H100 SXM with 18 NVLinks; ``counters`` holds every error counter it reports, so a
test plants an increase between two reads by changing a number. ``unsupported`` names functions that
answer NVML_ERROR_NOT_SUPPORTED, ``fail`` functions that answer another NVML error; ``answers`` the
identity and state of the GPU (``FakeNvml.ANSWERS``), ``state`` its health (``FakeNvml.STATE``).

``FakeNode`` is a node of several such GPUs behind NVML's handles; tests/helpers/fake_nvml/pynvml.py makes one
from a JSON description, as the ``pynvml`` module a subprocess imports (``clustergate health``).
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
        return {2: "Invalid Argument", 3: "Not Supported", 9: "Driver Not Loaded", 10: "Timeout",
                12: "NVML Shared Library Not Found", 15: "GPU is lost"}.get(self.value, "Unknown")


class FabricInfo(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("status", ctypes.c_uint), ("state", ctypes.c_uint)]


class FakeNvml:
    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 0x8
    c_nvmlGpuFabricInfoV_t = FabricInfo

    ANSWERS: dict[str, Any] = {
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3", "nvmlDeviceGetUUID": "GPU-5e1f",
        "nvmlDeviceGetSerial": "1652923017345", "nvmlDeviceGetIndex": 3,
        "nvmlDeviceGetPciInfo": SimpleNamespace(busId=b"00000000:18:00.0"),
        "nvmlDeviceGetVbiosVersion": "96.00.74.00.0D", "nvmlDeviceGetBoardPartNumber": "692-2G520-0200-000",
        "nvmlDeviceGetInforomImageVersion": "G520.0200.00.05", "nvmlDeviceGetInforomVersion": "1.1",
        "nvmlSystemGetDriverVersion": "550.54.15",
        "nvmlSystemGetCudaDriverVersion": 12040,
    }
    STATE: dict[str, Any] = {
        "memory_total": 85520809984, "ecc_mode": (1, 1), "clock_reasons": 0x1, "mig_mode": (0, 0),
        "pcie": {"gen": 1, "width": 16, "gen_max": 5, "width_max": 16, "gpu_gen_max": 5},  # at idle: Gen1, full width
        "temperature": 31, "slowdown_temperature": 92, "power_mw": 71000, "power_limit_mw": 700000,
        "power_default_mw": 700000, "power_constraints_mw": (200000, 700000), "margin_temperature": 50,
        "clocks": {1: 345, 2: 2619}, "max_clocks": {1: 1980, 2: 2619}, "links_down": [],
        "compute": {}, "graphics": {}, "remap_failure": 0,
    }
    """A healthy H100 SXM at idle; a test changes an entry (``state["ecc_mode"] = (0, 0)``) to plant a fault."""

    def __init__(self, *, links: int = 18, field_values: bool = True) -> None:
        self.answers = dict(self.ANSWERS)
        self.state = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.STATE.items()}
        self.process_names: dict[int, str] = {}
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
        if name in self.fail or "*" in self.fail:  # "*": every call (a GPU that fell off the bus)
            raise NVMLError(self.fail.get(name, self.fail.get("*", 999)))
        if name in self.unsupported:
            raise NVMLError(NOT_SUPPORTED)

    def __getattr__(self, name: str) -> Any:
        answers = self.__dict__.get("answers", self.ANSWERS)
        if name not in answers:
            raise AttributeError(name)

        def fn(*args: Any) -> Any:
            self._check(name)
            return answers[name]
        return fn

    def _state(self, name: str, key: str) -> Any:
        self._check(name)
        return self.state[key]

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        total = self._state("nvmlDeviceGetMemoryInfo", "memory_total")
        return SimpleNamespace(total=total, free=total - (512 << 20), used=512 << 20)

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        return list(self._state("nvmlDeviceGetEccMode", "ecc_mode"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return int(self._state("nvmlDeviceGetCurrentClocksEventReasons", "clock_reasons"))

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return list(self._state("nvmlDeviceGetMigMode", "mig_mode"))

    def _pcie(self, name: str, key: str) -> int:
        return int(self._state(name, "pcie")[key])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._pcie("nvmlDeviceGetCurrPcieLinkGeneration", "gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._pcie("nvmlDeviceGetCurrPcieLinkWidth", "width")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._pcie("nvmlDeviceGetMaxPcieLinkGeneration", "gen_max")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._pcie("nvmlDeviceGetMaxPcieLinkWidth", "width_max")

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._pcie("nvmlDeviceGetGpuMaxPcieLinkGeneration", "gpu_gen_max")

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(self._state("nvmlDeviceGetTemperature", "temperature"))

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, kind: int) -> int:
        return int(self._state("nvmlDeviceGetTemperatureThreshold", "slowdown_temperature"))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._state("nvmlDeviceGetPowerUsage", "power_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._state("nvmlDeviceGetEnforcedPowerLimit", "power_limit_mw"))

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return int(self._state("nvmlDeviceGetPowerManagementDefaultLimit", "power_default_mw"))

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        return list(self._state("nvmlDeviceGetPowerManagementLimitConstraints", "power_constraints_mw"))

    def nvmlDeviceGetMarginTemperature(self, handle: Any) -> int:
        """As nvidia-ml-py 13 answers: degrees C to the nearest slowdown threshold."""
        return int(self._state("nvmlDeviceGetMarginTemperature", "margin_temperature"))

    def nvmlDeviceGetClockInfo(self, handle: Any, kind: int) -> int:
        return int(self._state("nvmlDeviceGetClockInfo", "clocks")[kind])

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, kind: int) -> int:
        return int(self._state("nvmlDeviceGetMaxClockInfo", "max_clocks")[kind])

    def _processes(self, name: str, key: str) -> list[Any]:
        return [SimpleNamespace(pid=int(pid), usedGpuMemory=used) for pid, used in self._state(name, key).items()]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses", "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", "graphics")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._check("nvmlDeviceGetMPSComputeRunningProcesses")
        return []

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        if pid not in self.process_names:
            raise NVMLError(NOT_SUPPORTED)
        return self.process_names[pid]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, kind: int, counter: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors")
        return self.counters["ecc_uncorrected" if kind == 1 else "ecc_corrected"]

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        self._check("nvmlDeviceGetRemappedRows")
        c = self.counters
        return c["remapped_correctable"], c["remapped_uncorrectable"], c["remap_pending"], self.state["remap_failure"]

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
        return 0 if link in self.state["links_down"] else 1

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


class FakeNode:
    """NVML on a node of several GPUs: the handle of GPU i is i, and each device call goes to ``gpus[i]``
    (a ``FakeNvml``); system calls answer from the first. ``init_error`` makes nvmlInit fail with that code
    (9: the driver is not loaded; 12: the library is not found)."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 0x8
    c_nvmlGpuFabricInfoV_t = FabricInfo

    def __init__(self, gpus: list[FakeNvml], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(INVALID_ARGUMENT)
        self.gpus[index]._check("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for gpu in self.gpus:
            if pid in gpu.process_names:
                return gpu.process_names[pid]
        raise NVMLError(NOT_SUPPORTED)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvmlSystem"):
            return getattr(self.gpus[0], name)
        if not name.startswith("nvmlDevice"):
            raise AttributeError(name)

        def on_gpu(handle: int, *args: Any) -> Any:
            self.calls += 1
            return getattr(self.gpus[handle], name)(handle, *args)
        return on_gpu


def node_from(spec: dict[str, Any]) -> FakeNode:
    """A FakeNode from plain data: {"init_error": code?, "gpus": [{"answers": {...}, "state": {...},
    "counters": {...}, "fail": {function: code}, "unsupported": [function], "process_names": {pid: name},
    "fabric": [state, status], "persistence": 0|1, "links": n}]}. Answers given as text for NVML's
    structures: "pci_bus_id" for nvmlDeviceGetPciInfo."""
    gpus = []
    for raw in spec.get("gpus", []):
        gpu = FakeNvml(links=int(raw.get("links", 18)))
        answers = dict(raw.get("answers", {}))
        if "pci_bus_id" in answers:
            gpu.answers["nvmlDeviceGetPciInfo"] = SimpleNamespace(busId=answers.pop("pci_bus_id").encode())
        gpu.answers.update(answers)
        for key, value in raw.get("state", {}).items():
            if key in ("clocks", "max_clocks"):
                value = {int(k): v for k, v in value.items()}
            gpu.state[key] = {**gpu.state[key], **value} if key == "pcie" else value
        gpu.counters.update(raw.get("counters", {}))
        gpu.fail.update(raw.get("fail", {}))
        gpu.unsupported.update(raw.get("unsupported", []))
        gpu.process_names.update({int(k): v for k, v in raw.get("process_names", {}).items()})
        if "fabric" in raw:
            gpu.fabric = tuple(raw["fabric"])
        if "persistence" in raw:
            gpu.persistence = int(raw["persistence"])
        gpus.append(gpu)
    return FakeNode(gpus, spec.get("init_error"))
