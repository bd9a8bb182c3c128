"""Firmware alike, thermal margin and power limits (workloads.gpu.firmware, workloads.gpu.limits, the margin in
workloads.clocks), read through the fake NVML (tests/helpers/fake_pynvml.py) and a sysfs tree, judged by the
shipped profiles' criteria through the plugin's own judge."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_pynvml import FakeNvml
from test_gpu_inventory import FakeCg

from acceptance import test_gpu_firmware, test_gpu_limits
from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.record.judge import Record, Where, judge
from clustergate.run.recorder import fact_of
from workloads import clocks
from workloads.gpu import firmware, limits
from workloads.gpu import inventory as inv

H200 = load(shipped_thresholds()).profile("h200")


def _snap(host: str, index: int, gpu: FakeNvml) -> dict[str, Any]:
    """A rank's snapshot as NVML alone describes it (inventory.nvml_snapshot), on ``host``."""
    gpu.answers.update({"nvmlDeviceGetIndex": index, "nvmlDeviceGetSerial": f"16529230173{index:02d}"})
    return {**inv.nvml_snapshot(gpu, handle=index), "host": host, "rank": index, "local_rank": index}


def _node(host: str = "gpu-a", gpus: int = 4, **plant: dict[str, Any]) -> list[dict[str, Any]]:
    """Snapshots of a node's GPUs; ``plant["g2"] = {"nvmlDeviceGetVbiosVersion": ...}`` answers GPU 2 otherwise."""
    out = []
    for i in range(gpus):
        gpu = FakeNvml()
        gpu.answers.update(plant.get(f"g{i}", {}))
        out.append(_snap(host, i, gpu))
    return out


def test_version_order_reads_hex_parts_and_text() -> None:
    assert firmware.version_key("96.00.A5.00.1A") > firmware.version_key("96.00.74.00.0D")
    assert firmware.version_key("28.39.1002") > firmware.version_key("28.9.1002")
    assert firmware.version_key("G520.0282.02.02") > firmware.version_key("G520.0200.00.05")


def test_gpu_firmware_alike_passes_and_records_versions() -> None:
    snaps = _node()
    checks = firmware.gpu_checks(snaps, {})
    assert [c.status for c in checks] == ["ok"] * 4
    assert firmware.versions(snaps, {}) == {"gpu-a": {"inforom": ["G520.0200.00.05"], "inforom_oem": ["1.1"],
                                                      "vbios": ["96.00.74.00.0D"]}}


def test_a_gpu_on_another_vbios_fails_naming_it() -> None:
    snaps = _node(g2={"nvmlDeviceGetVbiosVersion": "96.00.A5.00.1A"})
    checks = firmware.gpu_checks(snaps, {})
    assert [c.status for c in checks] == ["ok", "ok", "fail", "ok"]
    assert checks[2].message.startswith("gpu-a gpu 2 (serial 1652923017302): vbios 96.00.A5.00.1A, the node's "
                                        "other GPUs 96.00.74.00.0D")


def test_firmware_below_the_profiles_minimum_fails() -> None:
    checks = firmware.gpu_checks(_node(gpus=1), {"vbios": "96.00.A5.00.1A", "inforom": None})
    assert checks[0].status == "fail" and "below the profile's minimum 96.00.A5.00.1A" in checks[0].message


def test_what_nvml_cannot_read_is_said_and_nothing_readable_is_unsupported() -> None:
    gpu = FakeNvml()
    gpu.unsupported.add("nvmlDeviceGetInforomImageVersion")
    check = firmware.gpu_checks([_snap("gpu-a", 0, gpu)], {})[0]
    assert check.status == "ok" and "(NVML cannot read inforom: not supported" in check.message
    gpu.unsupported |= {"nvmlDeviceGetVbiosVersion", "nvmlDeviceGetInforomVersion"}
    check = firmware.gpu_checks([_snap("gpu-a", 0, gpu)], {})[0]
    assert check.status == "unsupported" and check.message.startswith("NVML cannot read vbios: not supported")


def _sysfs(root: Path, hcas: dict[str, tuple[str, str | None]]) -> Path:
    for name, (fw, board) in hcas.items():
        d = root / "sys/class/infiniband" / name
        d.mkdir(parents=True)
        (d / "fw_ver").write_text(fw + "\n")
        if board is not None:
            (d / "board_id").write_text(board + "\n")
    return root


def test_hca_firmware_per_board_id(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, {"mlx5_0": ("28.39.1002", "MT_0000000838"), "mlx5_1": ("28.39.1002", "MT_0000000838"),
                             "mlx5_2": ("28.37.1014", "MT_0000000838"), "mlx5_bf": ("32.41.1000", "MT_0000000884")})
    hcas = firmware.read_hcas(root)
    check = firmware.hca_check("gpu-a", hcas, None)
    assert check.status == "fail"
    assert check.message.startswith("gpu-a: mlx5_2 (board MT_0000000838) firmware 28.37.1014, the node's other HCAs "
                                    "of board MT_0000000838 28.39.1002")
    assert "mlx5_bf" not in check.message  # another board carries its own firmware
    assert firmware.versions([], {"gpu-a": hcas})["gpu-a"]["hca_fw[MT_0000000884]"] == ["32.41.1000"]


def test_hca_firmware_alike_and_minimum(tmp_path: Path) -> None:
    hcas = firmware.read_hcas(_sysfs(tmp_path, {"mlx5_0": ("28.39.1002", None), "mlx5_1": ("28.39.1002", None)}))
    assert firmware.hca_check("gpu-a", hcas, None).status == "ok"
    low = firmware.hca_check("gpu-a", hcas, "28.40.1000")
    assert low.status == "fail"
    assert "mlx5_0 firmware 28.39.1002 is below the profile's minimum 28.40.1000" in low.message
    assert firmware.read_hcas(tmp_path / "none") == []
    assert firmware.hca_check("gpu-a", [], None).status == "unsupported"


def _judged(name: str, values: list[float]) -> Any:
    records = [Record(name, v, H200.metrics[name].unit or "", "gpu", "",
                      Where(rank=i, host="gpu-a", node_rank=0, gpu_index=i, gpu_serial=f"s{i}"))
               for i, v in enumerate(values)]
    return judge(records, H200)[0]


def test_power_limits_read_and_judged() -> None:
    snaps = _node(gpus=8)
    assert limits.limits_missing(snaps[0], ("power_limit_w", "power_limit_default_w")) is None
    assert limits.limits_details(snaps[0]) == {"power_limit_w": 700.0, "power_limit_default_w": 700.0,
                                               "power_limit_min_w": 200.0, "power_limit_max_w": 700.0}
    fraction = [limits.default_fraction_result(s).metrics[0].value for s in snaps]
    assert _judged(limits.DEFAULT_FRACTION_METRIC, fraction).passed
    enforced = [limits.enforced_result(s).metrics[0].value for s in snaps]
    assert _judged(limits.LIMIT_METRIC, enforced).passed


def test_a_gpu_capped_below_its_default_and_its_peers_fails() -> None:
    gpus = [FakeNvml() for _ in range(8)]
    gpus[5].state["power_limit_mw"] = 600000  # nvidia-smi -i 5 -pl 600
    snaps = [_snap("gpu-a", i, g) for i, g in enumerate(gpus)]
    fraction = _judged(limits.DEFAULT_FRACTION_METRIC, [limits.default_fraction_result(s).metrics[0].value
                                                        for s in snaps])
    enforced = _judged(limits.LIMIT_METRIC, [limits.enforced_result(s).metrics[0].value for s in snaps])
    for judged in (fraction, enforced):
        assert [p["gpu_index"] for p in judged.per_rank if not p["passed"]] == [5]


def test_power_default_nvml_lacks_is_named() -> None:
    gpu = FakeNvml()
    gpu.unsupported.add("nvmlDeviceGetPowerManagementDefaultLimit")
    why = limits.limits_missing(_snap("gpu-a", 0, gpu), ("power_limit_w", "power_limit_default_w"))
    assert why is not None and why.startswith("power_limit_default_w: not supported")


def _sampled(gpu: FakeNvml, seconds: float = 0.35) -> dict[str, Any]:
    """ClockSampler's own sampling loop over the fake NVML for ``seconds``: its summary."""
    sampler = clocks.ClockSampler(None, period_s=0.05)  # type: ignore[arg-type]  # the loop alone: no device
    thread = threading.Thread(target=sampler._loop, args=(gpu, 0), daemon=True)
    thread.start()
    time.sleep(seconds)
    sampler._thread = thread
    sampler.__exit__()
    return sampler.summary()


def _run(summary: dict[str, Any]) -> dict[str, Any]:
    return {"what": "sustained bf16 4096x4096x8192 on cuda:0 (NVIDIA H200)", "clocks": summary, "power": {},
            "windows": 1}


def test_margin_sampled_through_the_hold_and_judged() -> None:
    gpu = FakeNvml()
    gpu.state["margin_temperature"] = 24  # the lent H200 under 20 s of bf16 matmul
    summary = _sampled(gpu)
    assert summary["margin_temperature_c"]["min"] == 24.0
    run = _run(summary)
    assert limits.margin_missing(run) is None
    result = limits.margin_result(run)
    assert _judged(limits.MARGIN_METRIC, [result.metrics[0].value]).passed


def test_a_gpu_a_few_degrees_from_slowdown_fails() -> None:
    gpu = FakeNvml()
    gpu.state["margin_temperature"] = 3
    value = limits.margin_result(_run(_sampled(gpu))).metrics[0].value
    judged = _judged(limits.MARGIN_METRIC, [24.0, value])
    assert [p["gpu_index"] for p in judged.per_rank if not p["passed"]] == [1]


def test_margin_nvml_lacks_is_named_and_the_clocks_still_sampled() -> None:
    gpu = FakeNvml()
    gpu.unsupported.add("nvmlDeviceGetMarginTemperature")
    summary = _sampled(gpu)
    assert summary["status"] == "sampled" and summary["samples"] >= 2 and "margin_temperature_c" not in summary
    why = limits.margin_missing(_run(summary))
    assert why is not None and "margin temperature not supported: nvmlDeviceGetMarginTemperature" in why
    assert "Not Supported" in why


def test_margin_unwatched_on_a_gpu_fails() -> None:
    with pytest.raises(limits.WorkloadError, match="could not be watched"):
        limits.margin_result(_run({"status": "NVML unavailable: ImportError"}))


# ---- the acceptance tests' GPU paths, with a stand-in for the cg fixture (test_gpu_inventory.FakeCg) ----------

class GpuCg(FakeCg):
    """A rank of a GPU profile (device cuda:N, no CUDA needed: nothing here touches it), every rank's value alike."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__(rank, world, {"gpus_per_node": world}, device=f"cuda:{rank}")

    def skip_unless_everywhere(self, ok: bool, reason: str, *, fact: str | None, **params: Any) -> None:
        if not ok:
            self.skip(reason, fact=fact, **params)


def _limits_test(monkeypatch: pytest.MonkeyPatch, snaps: list[dict[str, Any]], rank: int, test: Any) -> GpuCg:
    monkeypatch.setattr(test_gpu_limits, "snapshots", lambda cg: snaps)
    cg = GpuCg(rank, len(snaps))
    test(cg)
    return cg


def test_power_limit_tests_record_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [FakeNvml() for _ in range(2)]
    gpus[1].state["power_limit_mw"] = 600000
    snaps = [_snap("h0", i, g) for i, g in enumerate(gpus)]
    cg = _limits_test(monkeypatch, snaps, 1, test_gpu_limits.test_power_limit_default)
    assert [(m.name, m.value) for m in cg.metrics] == [(limits.DEFAULT_FRACTION_METRIC, 600 / 700)]
    assert cg.details["per_rank"][1]["power_limits"]["power_limit_default_w"] == 700.0


def test_power_limit_nvml_lacks_skips_on_every_rank_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [FakeNvml() for _ in range(2)]
    gpus[1].unsupported.add("nvmlDeviceGetPowerManagementDefaultLimit")
    snaps = [_snap("h0", i, g) for i, g in enumerate(gpus)]
    for rank in (0, 1):
        with pytest.raises(pytest.skip.Exception, match="on 1/2 ranks .first rank 1 on h0.: power_limit_default_w: "
                                                        "not supported") as skipped:
            _limits_test(monkeypatch, snaps, rank, test_gpu_limits.test_power_limit_default)
        assert fact_of(skipped.value) == {"fact": "unsupported"}
    _limits_test(monkeypatch, snaps, 1, test_gpu_limits.test_power_limit_alike)  # the enforced limit still reads


def test_margin_test_skips_naming_the_call_where_nvml_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeNvml()
    gpu.unsupported.add("nvmlDeviceGetMarginTemperature")
    monkeypatch.setattr(test_gpu_limits.burn_in, "last_run", lambda device: _run(_sampled(gpu)))
    with pytest.raises(pytest.skip.Exception, match="margin temperature not supported") as skipped:
        test_gpu_limits.test_thermal_margin_under_load(GpuCg(0, 1))
    assert fact_of(skipped.value) == {"fact": "unsupported"}


def test_firmware_test_fails_the_odd_gpus_rank_and_keeps_the_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    snaps = _node("h0", gpus=2, g1={"nvmlDeviceGetVbiosVersion": "96.00.A5.00.1A"})
    monkeypatch.setattr(test_gpu_firmware, "snapshots", lambda cg: snaps)
    test_gpu_firmware.test_gpu_firmware_alike(GpuCg(0, 2))  # rank 0's GPU is not the odd one
    cg = GpuCg(1, 2)
    with pytest.raises(pytest.fail.Exception, match="gpu_firmware: h0 gpu 1 .serial 1652923017301.: vbios "
                                                     "96.00.A5.00.1A, the node's other GPUs 96.00.74.00.0D"):
        test_gpu_firmware.test_gpu_firmware_alike(cg)
    assert cg.details[firmware.DETAILS_KEY]["h0"]["vbios"] == ["96.00.74.00.0D", "96.00.A5.00.1A"]
