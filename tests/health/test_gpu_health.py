"""GPU health judgements replayed over captured snapshots, with faults planted in them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from workloads.gpu import health as h

DATA = Path(__file__).parents[1] / "data" / "gpu"


def load(name: str) -> list[dict[str, Any]]:
    return json.loads((DATA / name).read_text())["snapshots"]


@pytest.fixture
def node() -> list[dict[str, Any]]:
    return load("h100_node_healthy.json")


@pytest.fixture
def workstation() -> list[dict[str, Any]]:
    return load("rtx4090_no_ecc.json")


PER_GPU = [
    lambda s: h.check_model(s, "H100"),
    h.check_gpu_present,
    h.check_ecc_enabled,
    h.check_no_uncorrectable_ecc,
    h.check_no_pending_memory_repair,
    h.check_no_remap_failure,
    h.check_no_throttle,
    lambda s: h.check_pcie_link(s, 5, 16),
    lambda s: h.check_pcie_link(s),
    lambda s: h.check_nvlinks(s, 18),
    lambda s: h.check_nvlinks(s),
    lambda s: h.check_mig_mode(s, "disabled"),
    lambda s: h.check_driver_at_least(s, "550.54"),
]


@pytest.mark.parametrize("check", PER_GPU)
def test_healthy_node_passes_every_check(node: list[dict[str, Any]], check: Any) -> None:
    for snap in node:
        result = check(snap)
        assert result.status == "ok", result.message
        json.dumps(result.as_dict())  # the report's table must serialise


def test_healthy_node_passes_cross_rank_checks(node: list[dict[str, Any]]) -> None:
    for checks in (h.check_versions_identical(node), h.check_uuids_distinct(node), h.gpu_count_checks(node, 8)):
        assert [c.status for c in checks] == ["ok"] * 8, [c.message for c in checks]


def test_uncorrectable_ecc_error_fails_that_gpu_only(node: list[dict[str, Any]]) -> None:
    node[5]["gpu"]["ecc_uncorrected_volatile"] = 3
    results = [h.check_no_uncorrectable_ecc(s) for s in node]
    assert [r.status for r in results] == ["ok"] * 5 + ["fail"] + ["ok"] * 2
    assert "3 uncorrectable" in results[5].message and "dcgmi diag" in results[5].message


def test_ecc_disabled_and_pending_changes(node: list[dict[str, Any]]) -> None:
    node[0]["gpu"].update(ecc_mode_current=False, ecc_mode_pending=False)
    node[1]["gpu"]["ecc_mode_pending"] = False
    node[2]["gpu"].update(ecc_mode_current=False, ecc_mode_pending=True)
    assert "nvidia-smi -e 1" in h.check_ecc_enabled(node[0]).message
    assert h.check_ecc_enabled(node[1]).status == "fail"
    assert "reboot to apply" in h.check_ecc_enabled(node[2]).message


@pytest.mark.parametrize("field,reason", [("remap_pending", "row remapping"),
                                          ("retired_pages_pending", "page retirement")])
def test_pending_memory_repair(node: list[dict[str, Any]], field: str, reason: str) -> None:
    node[3]["gpu"][field] = True
    node[3]["unsupported"].pop(field, None)
    result = h.check_no_pending_memory_repair(node[3])
    assert result.status == "fail" and reason in result.message and "nvidia-smi -r" in result.message


def test_pending_repair_names_the_unsupported_source(node: list[dict[str, Any]]) -> None:
    result = h.check_no_pending_memory_repair(node[0])
    assert result.status == "ok" and "page retirement" in result.message and "not supported" in result.message


def test_row_remap_failure(node: list[dict[str, Any]]) -> None:
    node[7]["gpu"]["remap_failure"] = True
    assert "RMA" in h.check_no_remap_failure(node[7]).message


@pytest.mark.parametrize("mask,names", [(0x8, "hw_slowdown"), (0x40 | 0x1, "hw_thermal_slowdown"),
                                        (0x80, "hw_power_brake_slowdown"), (0x20, "sw_thermal_slowdown")])
def test_throttle_reasons_fail(node: list[dict[str, Any]], mask: int, names: str) -> None:
    node[2]["gpu"]["clock_event_reasons"] = mask
    result = h.check_no_throttle(node[2])
    assert result.status == "fail" and names in result.message and "temperature" in result.message


def test_power_cap_and_idle_are_not_faults(node: list[dict[str, Any]]) -> None:
    node[2]["gpu"]["clock_event_reasons"] = 0x4 | 0x1
    result = h.check_no_throttle(node[2])
    assert result.status == "ok" and "sw_power_cap" in result.message


def test_nvlink_down(node: list[dict[str, Any]]) -> None:
    node[4]["gpu"]["nvlink_states"][11]["active"] = False
    for expected in (18, None):
        result = h.check_nvlinks(node[4], expected)
        assert result.status == "fail" and "17 of 18" in result.message and "[11]" in result.message


def test_pcie_downtrained(node: list[dict[str, Any]]) -> None:
    node[6]["gpu"].update(pcie_gen_current=4, pcie_width_current=8)
    result = h.check_pcie_link(node[6])
    assert result.status == "fail" and "Gen4 x8" in result.message and "Gen5 x16" in result.message
    node[6]["gpu"].update(pcie_gen_current=5, pcie_width_current=16, pcie_gen_max=4)
    assert h.check_pcie_link(node[6], generation=5).status == "ok"
    node[6]["gpu"]["pcie_gen_current"] = 4
    assert h.check_pcie_link(node[6], generation=5).status == "fail"  # a Gen4 slot under a Gen5 profile


def test_pcie_idle_reading_says_so(node: list[dict[str, Any]]) -> None:
    node[0]["gpu"].update(pcie_gen_current=1, pcie_measured_under_load=False)
    assert "read at idle" in h.check_pcie_link(node[0]).message


def test_mig_mode(node: list[dict[str, Any]]) -> None:
    assert h.check_mig_mode(node[0], "enabled").status == "fail"
    node[1]["gpu"]["mig_mode_pending"] = 1
    assert "after the next reset" in h.check_mig_mode(node[1], "disabled").message


def test_missing_gpu_fails_the_count_on_the_node_lowest_rank(node: list[dict[str, Any]]) -> None:
    seven = node[:7]
    for s in seven:
        s["cuda_device_count"] = 7
        s["nvml"]["device_count"] = 8  # NVML still lists the GPU that CUDA lost
    checks = h.gpu_count_checks(seven, 8)
    assert [c.status for c in checks] == ["fail"] + ["ok"] * 6
    assert "7 GPUs visible to CUDA, the profile expects 8" in checks[0].message
    assert "NVML lists 8" in checks[0].message


def test_count_mismatch_is_fine_when_cuda_visible_devices_restricts(node: list[dict[str, Any]]) -> None:
    for s in node:
        s["nvml"]["device_count"] = 16
        s["cuda_visible_devices"] = "0,1,2,3,4,5,6,7"
    assert all(c.status == "ok" for c in h.gpu_count_checks(node, 8))


def test_two_nodes_each_judged(node: list[dict[str, Any]]) -> None:
    other = copy.deepcopy(node)
    for s in other:
        s.update(node_rank=1, host="gpu-node-08", cuda_device_count=0)
        s["nvml"]["device_count"] = None
    checks = h.gpu_count_checks(node + other, 8)
    assert [i for i, c in enumerate(checks) if c.status == "fail"] == [8]
    assert "gpu-node-08" in checks[8].message and "nvidia-smi" in checks[8].message


def test_rank_without_gpu_fails_every_check(node: list[dict[str, Any]]) -> None:
    node[3].update(gpu=None, nvml={"ok": False, "error": "torch sees no CUDA device"},
                   software={"torch": "2.4.0+cpu", "torch_cuda": None})
    for check in PER_GPU:
        result = check(node[3])
        assert result.status == "fail", result.message
        assert "no GPU on this rank" in result.message or "driver version unknown" in result.message


def test_nvml_missing_fails_nvml_checks_but_not_cuda_ones(node: list[dict[str, Any]]) -> None:
    node[0]["nvml"] = {"ok": False, "error": "NVML unavailable: NVMLError_LibraryNotFound"}
    assert h.check_ecc_enabled(node[0]).status == "fail"
    assert "NVMLError_LibraryNotFound" in h.check_no_throttle(node[0]).message
    assert h.check_model(node[0], "H100").status == "ok"  # the name comes from CUDA too


def test_nvml_read_error_names_the_field(node: list[dict[str, Any]]) -> None:
    del node[2]["gpu"]["clock_event_reasons"]
    node[2]["errors"]["clock_event_reasons"] = "NVMLError_GpuIsLost: GPU is lost"
    result = h.check_no_throttle(node[2])
    assert result.status == "fail" and "GpuIsLost" in result.message and "Xid" in result.message


def test_unsupported_fields_are_reported_not_passed(workstation: list[dict[str, Any]]) -> None:
    for check in (h.check_ecc_enabled, h.check_no_uncorrectable_ecc, h.check_no_pending_memory_repair,
                  h.check_no_remap_failure, lambda s: h.check_nvlinks(s)):
        result = check(workstation[0])
        assert result.status == "unsupported", result.message
        assert "not supported" in result.message
    assert h.check_nvlinks(workstation[0], 4).status == "fail"  # the profile wants links: none is a failure
    # No link is a figure as well as words: a reader of the table (calibrate) counts 0 without parsing the message.
    none = {"active": 0, "present": 0, "down": []}
    assert h.check_nvlinks(workstation[0]).value == none and h.check_nvlinks(workstation[0], 4).value == none
    assert h.check_mig_mode(workstation[0], "disabled").status == "ok"
    assert h.check_mig_mode(workstation[0], "enabled").status == "unsupported"
    assert h.check_pcie_link(workstation[0]).status == "ok"
    assert h.check_uuids_distinct(workstation)[0].status == "ok"


def test_model_mismatch(node: list[dict[str, Any]]) -> None:
    result = h.check_model(node[0], "H200")
    assert result.status == "fail" and "H100 80GB HBM3" in result.message


def test_versions_differ_on_one_node(node: list[dict[str, Any]]) -> None:
    other = copy.deepcopy(node)
    for s in other:
        s["host"] = "gpu-node-08"
    other[0]["software"]["driver"] = "535.104.05"
    checks = h.check_versions_identical(node + other)
    failed = [i for i, c in enumerate(checks) if c.status == "fail"]
    assert failed == [8] and "535.104.05" in checks[8].message and "550.54.15" in checks[8].message


def test_driver_minimum(node: list[dict[str, Any]]) -> None:
    assert h.check_driver_at_least(node[0], "550.54.15").status == "ok"
    assert h.check_driver_at_least(node[0], "555").status == "fail"
    assert h.check_driver_at_least(node[0], "550.100").status == "fail"


def test_shared_gpu_fails_both_ranks(node: list[dict[str, Any]]) -> None:
    node[1]["gpu"]["uuid"] = node[0]["gpu"]["uuid"]
    checks = h.check_uuids_distinct(node)
    assert [c.status for c in checks[:3]] == ["fail", "fail", "ok"]
    assert "ranks [0, 1] share" in checks[0].message
