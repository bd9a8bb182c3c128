"""The error-counter readers on captured sysfs trees, kernel log text and a fake NVML, with increases
planted between two reads: each must show up as growth of the named counter on the named part."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from fake_pynvml import GPU_IS_LOST, NOT_SUPPORTED, FakeNvml

from workloads import faults
from workloads.counters import diff, grown
from workloads.gpu import error_counters, xid_events
from workloads.node import ib_counters, kernel_log, pcie_aer

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A writable copy of the AER and InfiniBand samples under one root."""
    for sample in ("aer", "ib"):
        shutil.copytree(DATA / sample, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _bump(path: Path, name: str, by: int = 1) -> None:
    lines = [line.split() for line in path.read_text().splitlines()]
    path.write_text("".join(f"{k} {int(v) + by if k == name else v}\n" for k, v in lines))


# ---- PCIe AER ------------------------------------------------------------------------------------

def test_aer_reads_every_device_with_counters_and_says_what_it_is(tree: Path) -> None:
    counters, described, why = pcie_aer.snapshot(tree)
    assert why is None
    assert sorted(counters) == ["0000:17:00.0", "0000:18:00.0", "0000:3b:00.0"]  # the NVMe has no AER files
    assert counters["0000:17:00.0"]["correctable.BadTLP"] == 2
    assert counters["0000:3b:00.0"]["nonfatal.TOTAL_ERR_NONFATAL"] == 1
    assert described["0000:18:00.0"] == "NVIDIA GPU"
    assert described["0000:3b:00.0"] == "NVIDIA Networking (Mellanox) InfiniBand NIC"
    assert described["0000:17:00.0"] == "Broadcom PCIe bridge"


def test_aer_planted_fatal_error_is_growth_of_that_device(tree: Path) -> None:
    before, _, _ = pcie_aer.snapshot(tree)
    _bump(tree / "sys/bus/pci/devices/0000:18:00.0/aer_dev_fatal", "TOTAL_ERR_FATAL")
    _bump(tree / "sys/bus/pci/devices/0000:18:00.0/aer_dev_fatal", "MalfTLP")
    after, _, _ = pcie_aer.snapshot(tree)
    moved = grown(diff(before, after))
    assert [(c.part, c.counter, c.before, c.after) for c in moved] == [
        ("0000:18:00.0", "fatal.MalfTLP", 0, 1), ("0000:18:00.0", "fatal.TOTAL_ERR_FATAL", 0, 1)]
    assert moved[1].text() == "fatal.TOTAL_ERR_FATAL 0 -> 1 (+1)"


def test_aer_without_any_counter_says_why(tmp_path: Path) -> None:
    counters, _, why = pcie_aer.snapshot(tmp_path)
    assert counters == {} and "exposes aer_dev_*" in (why or "")


# ---- InfiniBand ----------------------------------------------------------------------------------

def test_ib_counters_and_states_of_every_port(tree: Path) -> None:
    counters, states, why = ib_counters.snapshot(tree)
    assert why is None
    assert sorted(states) == ["mlx5_0 port 1", "mlx5_1 port 1", "mlx5_bond_0 port 1"]
    assert states["mlx5_0 port 1"] == {"state": "ACTIVE", "phys_state": "LinkUp", "rate": "400 Gb/sec (4X NDR)",
                                       "link_layer": "InfiniBand"}
    assert counters["mlx5_0 port 1"]["link_downed"] == 1
    assert "port_xmit_data" not in counters["mlx5_0 port 1"]  # throughput, not an error counter


def test_ib_planted_link_down_and_state_change(tree: Path) -> None:
    before, states_before, _ = ib_counters.snapshot(tree)
    port = tree / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters/link_downed").write_text("2\n")
    (port / "counters/symbol_error").write_text("17\n")
    (port / "state").write_text("1: DOWN\n")
    after, states_after, _ = ib_counters.snapshot(tree)
    moved = {(c.part, c.counter): c for c in grown(diff(before, after, ib_counters.WIDTHS))}
    assert set(moved) == {("mlx5_0 port 1", "link_downed"), ("mlx5_0 port 1", "symbol_error")}
    assert moved["mlx5_0 port 1", "link_downed"].text() == "link_downed 1 -> 2 (+1)"
    assert ib_counters.state_changes(states_before, states_after) == {"mlx5_0 port 1": "state ACTIVE -> DOWN"}


def test_ib_saturated_counter_cannot_show_growth(tree: Path) -> None:
    before, _, _ = ib_counters.snapshot(tree)  # mlx5_1's symbol_error sits at 65535, its 16-bit maximum
    [change] = [c for c in diff(before, before, ib_counters.WIDTHS) if c.part == "mlx5_1 port 1"
                and c.counter == "symbol_error"]
    assert change.delta is None and "saturated at 65535" in change.note


def test_ib_absent_says_why(tmp_path: Path) -> None:
    counters, states, why = ib_counters.snapshot(tmp_path)
    assert counters == {} and states == {} and "no InfiniBand or RoCE port" in (why or "")


def test_counter_that_went_down_or_vanished_is_said() -> None:
    changes = {(c.part, c.counter): c for c in diff({"a": {"x": 9, "y": 1}}, {"a": {"x": 3}})}
    assert changes["a", "x"].delta == 3 and "went down from 9" in changes["a", "x"].note
    assert changes["a", "y"].after is None and changes["a", "y"] in grown(list(changes.values()))


# ---- kernel log ----------------------------------------------------------------------------------

def test_kmsg_xids_with_their_gpus() -> None:
    lines = kernel_log.xid_lines(kernel_log.parse_kmsg((DATA / "kernel/kmsg-h100-xids.txt").read_text()))
    assert [(x.marker, x.bus_id, x.code) for x in lines] == [
        (1206.0, "0000:18:00.0", 63), (1207.0, "0000:9a:00.0", 13), (1208.0, "0000:18:00.0", 79)]
    assert lines[2].text.endswith("GPU has fallen off the bus.")


def test_dmesg_xids_including_the_older_form_without_pci() -> None:
    lines = kernel_log.xid_lines(kernel_log.parse_dmesg((DATA / "kernel/dmesg-a100-xids.txt").read_text()))
    assert [(x.bus_id, x.code) for x in lines] == [("0000:07:00.0", 48), ("0000:07:00.0", 94), ("0000:0f:00.0", 31)]
    assert lines[0].marker == pytest.approx(1822.000322)


def test_kernel_log_only_new_xids_count(tmp_path: Path) -> None:
    kmsg = tmp_path / "dev/kmsg"
    kmsg.parent.mkdir()
    kmsg.write_text((DATA / "kernel/kmsg-h100-xids.txt").read_text())
    start = kernel_log.snapshot(tmp_path)
    assert start["readable"] and len(start["xids"]) == 3 and start["marker"] == 1209
    with kmsg.open("a") as f:
        f.write("4,1210,4600000000,-;NVRM: Xid (PCI:0000:9a:00): 48, pid=9, name=python3, DBE detected\n")
    new, why = kernel_log.xids_since(tmp_path, start)
    assert why is None and [(x.bus_id, x.code) for x in new] == [("0000:9a:00.0", 48)]


def test_kernel_log_unreadable_says_why(tmp_path: Path) -> None:
    start = kernel_log.snapshot(tmp_path)
    assert not start["readable"] and "dev/kmsg" in start["reason"]
    assert kernel_log.xids_since(tmp_path, start) == ([], start["reason"])


# ---- NVML ----------------------------------------------------------------------------------------

def test_nvml_counters_identity_and_unsupported() -> None:
    read = error_counters.read(FakeNvml(), "gpu3")
    assert read["identity"]["serial"] == "1652923017345" and read["identity"]["vbios_version"] == "96.00.74.00.0D"
    board = read["counters"]["gpu"]
    assert board["ecc_uncorrected_volatile"] == 0 and board["pcie_replay"] == 12
    assert len([p for p in read["counters"] if p.startswith("link ")]) == 18
    assert read["counters"]["link 5"] == {"replay": 0, "recovery": 0, "crc": 3}
    assert "retired_pages_sbe" in read["unsupported"]  # Ampere and later remap rows instead: not supported, not 0


def test_nvml_planted_ecc_and_nvlink_errors_grow_on_their_part() -> None:
    nvml = FakeNvml()
    before = error_counters.read(nvml, "gpu3")["counters"]
    nvml.counters["ecc_uncorrected"] = 2
    nvml.link_counters[7]["recovery"] = 1
    after = error_counters.read(nvml, "gpu3")["counters"]
    moved = [(c.part, c.counter, c.before, c.after) for c in grown(diff(before, after))]
    assert moved == [("gpu", "ecc_uncorrected_volatile", 0, 2), ("link 7", "recovery", 0, 1)]


def test_nvml_nvlink_falls_back_to_the_error_counter_api() -> None:
    read = error_counters.read(FakeNvml(field_values=False), "gpu3")
    assert read["counters"]["link 0"] == {"replay": 0, "recovery": 0, "crc": 3}  # CRC flit + data


def test_nvml_no_nvlink_is_unsupported_not_zero() -> None:
    read = error_counters.read(FakeNvml(links=0), "gpu3")
    assert not any(p.startswith("link ") for p in read["counters"]) and "nvlink" in read["unsupported"]


def test_nvml_lost_gpu_is_an_error_not_a_value() -> None:
    nvml = FakeNvml()
    nvml.fail = {"nvmlDeviceGetTotalEccErrors": GPU_IS_LOST}
    read = error_counters.read(nvml, "gpu3")
    assert "ecc_uncorrected_volatile" not in read["counters"]["gpu"]
    assert "GPU is lost" in read["errors"]["ecc_uncorrected_volatile"]


def test_xid_watcher_hears_planted_events() -> None:
    nvml = FakeNvml()
    watcher = xid_events.XidWatcher(nvml, "gpu3", poll_ms=20).start()
    nvml.events.put(79)
    nvml.events.put(13)
    deadline = time.monotonic() + 5
    while len(watcher.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    watcher.stop()
    assert [e["code"] for e in watcher.events] == [79, 13] and watcher.listening and nvml.freed


def test_xid_watcher_that_cannot_register_says_why() -> None:
    nvml = FakeNvml()
    nvml.fail = {"nvmlDeviceRegisterEvents": NOT_SUPPORTED}
    watcher = xid_events.XidWatcher(nvml, "gpu3").start()
    assert not watcher.listening and "Not Supported" in watcher.status and nvml.freed


# ---- the table of categories ---------------------------------------------------------------------

def test_every_category_named_anywhere_has_a_next_step() -> None:
    named = {x.category for x in faults.XIDS.values()}
    for table in (error_counters.METRICS, ib_counters.METRICS, pcie_aer.METRICS):
        named |= {category for _, category in table.values()}
    assert named <= set(faults.CATEGORIES)
    assert faults.next_step("gpu_off_bus").startswith("the GPU fell off the PCIe bus: reseat or replace")
    assert faults.xid(79).critical and not faults.xid(13).critical
    assert faults.xid(4242).category == "unknown_xid" and faults.xid(4242).critical
