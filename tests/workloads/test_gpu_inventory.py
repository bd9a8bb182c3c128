"""NVML collection against a fake NVML, clock summaries (workloads.clocks), the acceptance helpers' verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from acceptance import gpu_helpers
from clustergate.criteria.thresholds import REQUIRED, ThresholdsError
from clustergate.run.recorder import Recorder, fact_of
from workloads import clocks
from workloads.gpu import inventory as inv
from workloads.gpu.health import Check
from workloads.result import Metric, Result, WorkloadError


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        return {2: "Invalid Argument", 3: "Not Supported", 13: "Function Not Found", 15: "GPU is lost"}[self.value]


def fake_nvml(*, fail: dict[str, int] | None = None, links: int = 18, down: tuple[int, ...] = ()) -> Any:
    """An NVML module answering like an H100; ``fail`` maps function names to NVML error codes."""
    fail = fail or {}

    def answer(name: str, value: Any) -> Any:
        def fn(*args: Any) -> Any:
            if name in fail:
                raise NVMLError(fail[name])
            return value(*args) if callable(value) else value
        return fn

    def link_state(handle: Any, link: int) -> int:
        if link >= links:
            raise NVMLError(2)
        return 0 if link in down else 1

    calls = {
        "nvmlDeviceGetName": b"NVIDIA H100 80GB HBM3", "nvmlDeviceGetUUID": "GPU-abc", "nvmlDeviceGetSerial": "165",
        "nvmlDeviceGetIndex": 3, "nvmlDeviceGetPciInfo": SimpleNamespace(busId=b"00000000:3A:00.0"),
        "nvmlDeviceGetVbiosVersion": "96.00", "nvmlDeviceGetMemoryInfo": SimpleNamespace(total=85520809984),
        "nvmlDeviceGetEccMode": [1, 1], "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 0,
        "nvmlDeviceGetRetiredPagesPendingStatus": 0, "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetCurrentClocksEventReasons": 0x1, "nvmlDeviceGetCurrPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16, "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetMaxPcieLinkWidth": 16, "nvmlDeviceGetGpuMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetMigMode": [0, 0], "nvmlDeviceGetTemperature": 35, "nvmlDeviceGetTemperatureThreshold": 90,
        "nvmlDeviceGetPowerUsage": 71500, "nvmlDeviceGetEnforcedPowerLimit": 700000,
        "nvmlDeviceGetPowerManagementDefaultLimit": 700000,
        "nvmlDeviceGetPowerManagementLimitConstraints": [200000, 700000],
        "nvmlDeviceGetInforomImageVersion": "G520.0282.02.02", "nvmlDeviceGetInforomVersion": b"1.1",
        "nvmlDeviceGetClockInfo": lambda h, kind: {1: 1980, 2: 2619}[kind],
        "nvmlDeviceGetMaxClockInfo": lambda h, kind: {1: 1980, 2: 2619}[kind],
    }
    ns = SimpleNamespace(NVMLError=NVMLError, NVML_NVLINK_MAX_LINKS=36, nvmlDeviceGetNvLinkState=link_state)
    for name, value in calls.items():
        setattr(ns, name, answer(name, value))
    if "nvmlDeviceGetNvLinkState" in fail:
        ns.nvmlDeviceGetNvLinkState = answer("nvmlDeviceGetNvLinkState", 1)
    return ns


def test_read_gpu_healthy_h100() -> None:
    values, unsupported, errors = inv.read_gpu(fake_nvml(), handle=object())
    assert not unsupported and not errors
    assert values["name"] == "NVIDIA H100 80GB HBM3" and values["pci_bus_id"] == "00000000:3A:00.0"
    assert values["ecc_mode_current"] is True and values["remap_failure"] is False
    assert values["power_w"] == 71.5 and values["sm_clock_mhz"] == 1980 and values["mem_clock_mhz"] == 2619
    assert len(values["nvlink_states"]) == 18 and all(s["active"] for s in values["nvlink_states"])
    json.dumps(values)


def test_not_supported_and_errors_are_sorted_field_by_field() -> None:
    nvml = fake_nvml(fail={"nvmlDeviceGetEccMode": 3, "nvmlDeviceGetRetiredPagesPendingStatus": 13,
                           "nvmlDeviceGetCurrentClocksEventReasons": 15, "nvmlDeviceGetNvLinkState": 3})
    values, unsupported, errors = inv.read_gpu(nvml, handle=object())
    assert set(unsupported) == {"ecc_mode_current", "ecc_mode_pending", "retired_pages_pending", "nvlink_states"}
    assert all(reason.startswith("not supported") for reason in unsupported.values())
    assert "GPU is lost" in errors["clock_event_reasons"]
    assert "ecc_mode_current" not in values and values["ecc_uncorrected_volatile"] == 0


def test_down_link_and_link_error() -> None:
    values, _, _ = inv.read_gpu(fake_nvml(down=(4,)), handle=object())
    assert [s["link"] for s in values["nvlink_states"] if not s["active"]] == [4]
    nvml = fake_nvml()
    nvml.nvmlDeviceGetNvLinkState = lambda h, link: (_ for _ in ()).throw(NVMLError(15))
    _, _, errors = inv.read_gpu(nvml, handle=object())
    assert "link 0" in errors["nvlink_states"]


def test_snapshot_on_cpu_says_why_there_is_no_gpu() -> None:
    snap = inv.snapshot(torch.device("cpu"))
    assert snap["gpu"] is None and "sees no CUDA device" in snap["nvml"]["error"]
    json.dumps(snap)


def test_clock_summary_and_bad_events() -> None:
    samples = [{"sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "reasons": 0x4, "power_w": 690.0, "temperature_c": 70},
               {"sm_clock_mhz": 1410, "mem_clock_mhz": 2619, "reasons": 0x40 | 0x4, "power_w": 700.0,
                "temperature_c": 91}]
    out = clocks.summarize_clock_samples(samples)
    assert out["sm_clock_mhz"] == {"min": 1410, "median": 1695.0, "max": 1980}
    assert out["clock_event_reasons"] == {"sw_power_cap": 1.0, "hw_thermal_slowdown": 0.5}
    assert out["bad_clock_events"] == ["hw_thermal_slowdown"]
    assert clocks.summarize_clock_samples([], "not applicable: CPU device") == {"status": "not applicable: CPU device"}


def test_clock_sampler_on_cpu_is_inert() -> None:
    with clocks.ClockSampler(torch.device("cpu")) as sampler:
        pass
    assert sampler.summary()["status"].startswith("not applicable")


# ---- acceptance helpers, with a stand-in for the cg fixture -------------------------------

class FakeCg:
    def __init__(self, rank: int, world: int, settings: dict[str, Any], device: str = "cpu",
                 peers: list[Any] | None = None) -> None:
        self.rank, self.world_size, self.settings = rank, world, settings
        self.device = torch.device(device)
        self.profile_name = "test-profile"
        self.identities = [{"rank": r, "host": f"h{r // 2}", "gpu": {"index": r % 2, "serial": f"S{r}"}}
                           for r in range(world)]
        self.peers = peers
        self.details: dict[str, Any] = {}
        self.metrics: list[Metric] = []

    def setting(self, name: str, default: Any = REQUIRED) -> Any:
        """As Recorder.setting: ``default`` when given and the profile lacks the setting, else an error."""
        if name not in self.settings and default is not REQUIRED:
            return default
        if name not in self.settings:
            raise ThresholdsError(f"no settings.{name}")
        return self.settings[name]

    def all_ranks(self, value: Any) -> list[Any]:
        out = list(self.peers) if self.peers is not None else [value] * self.world_size
        out[self.rank] = value
        return out

    def record_result(self, result: Result) -> None:
        self.metrics += result.metrics
        self.details.update(result.details)

    skip = Recorder.skip  # the run's own: a skip carries its fact


def test_settle_fails_only_the_bad_rank_and_records_the_table() -> None:
    checks = [Check("ok", "fine"), Check("fail", "3 uncorrectable"), Check("ok", "fine")]
    good, bad = FakeCg(0, 3, {}), FakeCg(1, 3, {})
    gpu_helpers.settle(good, checks, "ecc")  # passes: rank 1 carries the failure
    with pytest.raises(pytest.fail.Exception, match="ecc: 3 uncorrectable"):
        gpu_helpers.settle(bad, checks, "ecc")
    assert [row["status"] for row in good.details["ecc"]] == ["ok", "fail", "ok"]
    assert good.details["ecc"][1]["gpu_serial"] == "S1"


def test_settle_skips_everywhere_when_unsupported() -> None:
    checks = [Check("ok", "fine"), Check("unsupported", "NVML ecc: not supported")]
    for rank in (0, 1):
        with pytest.raises(pytest.skip.Exception, match="not supported on 1/2 ranks") as skipped:
            gpu_helpers.settle(FakeCg(rank, 2, {}), checks, "ecc")
        assert fact_of(skipped.value) == {"fact": "unsupported"}


def test_cpu_profile_skips_gpu_only_tests() -> None:
    with pytest.raises(pytest.skip.Exception, match="cpu profile: no GPU") as skipped:
        gpu_helpers.require_device(FakeCg(0, 1, {"gpus_per_node": 0}), gpu_only=True)
    assert fact_of(skipped.value) == {"fact": "no_gpu"}
    gpu_helpers.require_device(FakeCg(0, 1, {"gpus_per_node": 0}))  # compute tests run on the CPU


def test_gpu_profile_without_gpu_fails_with_the_reason() -> None:
    with pytest.raises(pytest.fail.Exception, match="expects a GPU per rank, but this rank has none"):
        gpu_helpers.require_device(FakeCg(0, 2, {"gpus_per_node": 8}))
    assert gpu_helpers.expects_gpu(FakeCg(0, 1, {}))  # a profile without gpus_per_node is a GPU profile


def test_measure_gathers_before_raising() -> None:
    def broken() -> Result:
        raise WorkloadError("copy wrong at element 7")

    cg = FakeCg(0, 2, {})
    with pytest.raises(pytest.fail.Exception, match="copy wrong at element 7"):
        gpu_helpers.measure(cg, broken)
    cg = FakeCg(1, 2, {}, peers=[{"error": "WorkloadError: x"}, None])
    result = Result(metrics=(Metric("hbm_bandwidth_tbps", 3.0, "TB/s"),), details={"sizes": [1], "intervals": [1]})
    gpu_helpers.measure(cg, lambda: result)
    assert cg.metrics[0].value == 3.0
    assert cg.details["per_rank"][0]["error"] == "WorkloadError: x"
    assert "intervals" not in cg.details["per_rank"][1] and cg.details["intervals"] == [1]


DATA = Path(__file__).parents[1] / "data" / "gpu"


def test_captured_snapshots_keep_the_snapshot_shape() -> None:
    keys = set(inv.snapshot(torch.device("cpu")))
    for path in DATA.glob("*.json"):
        for snap in json.loads(path.read_text())["snapshots"]:
            assert keys <= set(snap), (path.name, keys - set(snap))
