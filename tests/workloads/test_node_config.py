"""The configuration readers on sysfs trees built here (ACS in PCIe config space, IOMMU groups, cpufreq,
NVSwitches) and a fake NVML, and the expect: section: parsing with clear errors, and judging."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_pynvml import FakeNvml

from clustergate.criteria import expect
from clustergate.criteria.thresholds import ThresholdsError, load
from workloads.gpu import gpu_config
from workloads.node import host_config, pcie_acs

ROOT = Path(__file__).resolve().parents[2]
GPU, NIC = "0000:18:00.0", "0000:19:00.0"


def config_space(acs_control: int | None, size: int = 4096) -> bytes:
    """A PCIe config space with an AER extended capability at 0x100 and, when given, ACS at 0x148."""
    space = bytearray(size)
    if size > 0x100:
        nxt = 0x148 if acs_control is not None else 0
        space[0x100:0x104] = (0x0001 | 2 << 16 | nxt << 20).to_bytes(4, "little")
        if acs_control is not None:
            space[0x148:0x14C] = (0x000D | 1 << 16).to_bytes(4, "little")
            space[0x14C:0x14E] = (0x5F).to_bytes(2, "little")  # capabilities
            space[0x14E:0x150] = acs_control.to_bytes(2, "little")
    return bytes(space)


def pcie_tree(root: Path, acs: dict[str, int | None], size: int = 4096) -> None:
    """Root port 15:01.0 -> switch 16:00.0 -> downstream ports 17:00.0 (GPU 18:00.0) and 17:01.0 (NIC 19:00.0)."""
    chains = {GPU: ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0", GPU],
              NIC: ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0", NIC]}
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    for chain in chains.values():
        for i, bdf in enumerate(chain):
            real = root / "sys/devices/pci0000:15" / Path(*chain[: i + 1])
            real.mkdir(parents=True, exist_ok=True)
            (real / "config").write_bytes(config_space(acs.get(bdf), size))
            link = bus / bdf
            if not link.is_symlink():
                os.symlink(os.path.relpath(real, bus), link)
    hca = root / "sys/class/infiniband/mlx5_0"
    hca.mkdir(parents=True)
    os.symlink(os.path.relpath(root / "sys/devices/pci0000:15" / Path(*chains[NIC]), hca), hca / "device")


def test_acs_register_from_config_space() -> None:
    assert pcie_acs.acs_control(config_space(0x1D)) == 0x1D
    assert pcie_acs.bit_names(0x1D) == ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"]
    assert pcie_acs.acs_control(config_space(None)) is None  # no ACS capability at all
    with pytest.raises(ValueError, match="extended space needs root"):
        pcie_acs.acs_control(config_space(0x1D, size=64))


def test_acs_on_the_gpu_nic_path_is_found(tmp_path: Path) -> None:
    pcie_tree(tmp_path, {"0000:17:00.0": 0x1D, "0000:16:00.0": 0, "0000:17:01.0": 0})
    [path], why = pcie_acs.gpu_nic_paths(tmp_path, ["00000000:18:00.0"])  # NVML's form of the bus id
    assert why is None and path["nic"] == f"mlx5_0 ({NIC})"
    bridges = {b["bridge"]: b for b in path["bridges"]}
    assert set(bridges) == {"0000:16:00.0", "0000:17:00.0", "0000:17:01.0"}  # not the root port above the switch
    assert bridges["0000:17:00.0"]["redirecting"] and bridges["0000:17:00.0"]["acs"][0] == "SrcValid"
    assert not bridges["0000:16:00.0"]["redirecting"]


def test_acs_unreadable_as_non_root(tmp_path: Path) -> None:
    pcie_tree(tmp_path, {}, size=64)
    [path], _ = pcie_acs.gpu_nic_paths(tmp_path, [GPU])
    assert all("unreadable" in b for b in path["bridges"])


def test_acs_without_infiniband_says_why(tmp_path: Path) -> None:
    assert pcie_acs.gpu_nic_paths(tmp_path, [GPU]) == ([], "no InfiniBand adapter under /sys/class/infiniband: "
                                                         "no GPU-NIC path to check")


def test_host_settings(tmp_path: Path) -> None:
    assert host_config.numa_balancing(tmp_path)[0] is None
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/numa_balancing").write_text("1\n")
    assert host_config.numa_balancing(tmp_path) == (True, None)
    assert host_config.cpu_governors(tmp_path)[0] is None
    for cpu, gov in (("cpu0", "performance"), ("cpu1", "performance"), ("cpu2", "powersave")):
        (tmp_path / f"sys/devices/system/cpu/{cpu}/cpufreq").mkdir(parents=True)
        (tmp_path / f"sys/devices/system/cpu/{cpu}/cpufreq/scaling_governor").write_text(gov + "\n")
    assert host_config.cpu_governors(tmp_path) == ({"performance": 2, "powersave": 1}, None)


def test_iommu_modes(tmp_path: Path) -> None:
    assert host_config.iommu_mode(tmp_path, [])[0] == "off"
    group = tmp_path / "sys/kernel/iommu_groups/17"
    group.mkdir(parents=True)
    (group / "type").write_text("identity\n")
    assert host_config.iommu_mode(tmp_path, [])[0] == "passthrough"
    (group / "type").write_text("DMA-FQ\n")
    assert host_config.iommu_mode(tmp_path, [])[0] == "translated"
    (group / "type").unlink()  # a kernel before 5.11: only the command line can say
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt\n")
    mode, detail, _ = host_config.iommu_mode(tmp_path, [])
    assert mode == "passthrough" and detail["cmdline"] == ["intel_iommu=on", "iommu=pt"]


def test_nvswitches_and_fabric_manager_process(tmp_path: Path) -> None:
    for bdf, cls in (("0000:05:00.0", "0x068000"), ("0000:18:00.0", "0x030200")):
        dev = tmp_path / "sys/bus/pci/devices" / bdf
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "class").write_text(cls + "\n")
    assert host_config.nvswitches(tmp_path) == ["0000:05:00.0"]
    (tmp_path / "proc/4711").mkdir(parents=True)
    (tmp_path / "proc/4711/comm").write_text("nv-fabricmanager\n")
    assert host_config.processes_named(tmp_path, "nv-fabricmanager") == [4711]


def test_gpu_settings_through_nvml() -> None:
    nvml = FakeNvml()
    nvml.persistence = 0
    read = gpu_config.read(nvml, "gpu3")
    assert read["values"] == {"driver": "550.54.15", "cuda": "12.4", "persistence_mode": False,
                              "fabric": {"state": "completed", "status": 0}}
    nvml.unsupported.add("nvmlDeviceGetGpuFabricInfoV")
    assert "Not Supported" in gpu_config.read(nvml, "gpu3")["unsupported"]["fabric"]


# ---- the expect: section -------------------------------------------------------------------------

def _fail(key: str, problem: str) -> Exception:
    return ValueError(f"{key}: {problem}")


def test_expect_parses_every_kind() -> None:
    got = expect.parse({"driver": ">=550.54, <580", "persistence_mode": True, "iommu": ["off", "passthrough"],
                        "cpu_governor": "performance", "nccl_gdr": True}, "expect", _fail)
    assert str(got["driver"].value) == "<580,>=550.54" and got["iommu"].value == ("off", "passthrough")
    assert expect.check(got["driver"], "550.54.15") is None
    assert expect.check(got["driver"], "535.183.01") == \
        "NVIDIA driver version (NVML) is 535.183.01, the profile expects >=550.54, <580"
    assert expect.check(got["persistence_mode"], False) == "GPU persistence mode: off, the profile expects on"
    assert expect.check(got["iommu"], "translated") == \
        "IOMMU mode is translated, the profile expects off or passthrough"
    assert expect.check(got["cpu_governor"], "mixed: performance on 2 CPUs, powersave on 1 CPUs") is not None
    assert expect.check(got["nccl_gdr"], False) == \
        "NCCL uses GPUDirect RDMA on InfiniBand: not met, the profile expects required"


@pytest.mark.parametrize(("raw", "says"), [
    ({"drivr": ">=550"}, "expect.drivr: unknown key; expect: takes driver, cuda"),
    ({"iommu": False}, "YAML reads a bare off/on/yes/no as true/false; quote it"),
    ({"iommu": "strict"}, "'strict' is not one of off, passthrough, translated"),
    ({"driver": 550}, "must be a version range in quotes"),
    ({"driver": ">=five"}, "'>=five' is not a version range"),
    ({"numa_balancing": "off"}, "must be true or false"),
    ({"fabric_manager": False}, "only true has a meaning here"),
])
def test_expect_errors_name_the_key(raw: dict, says: str) -> None:
    with pytest.raises(ValueError) as err:
        expect.parse(raw, "expect", _fail)
    assert says in str(err.value)


def _profile_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text("schema: 1\nfallback_profile: cpu\ncpu_profile: cpu\nprofiles:\n  cpu:\n" + body)
    return path


def test_thresholds_hand_expect_over_and_name_file_and_key(tmp_path: Path) -> None:
    good = load(_profile_file(tmp_path, "    expect: {numa_balancing: false, iommu: ['off']}\n"))
    assert good.profile("cpu").expect["iommu"].text == "off"
    with pytest.raises(ThresholdsError) as err:
        load(_profile_file(tmp_path, "    expect: {iommu: off}\n"))
    assert str(err.value).startswith(f"{tmp_path / 't.yaml'}: profiles.cpu.expect.iommu: got False")


def test_shipped_profiles_expect_and_error_criteria() -> None:
    th = load(ROOT / "thresholds.yaml")
    h200 = th.profile("h200")
    assert h200.expect["driver"].text == ">=550.54.14" and h200.expect["acs"].value is False
    for name in ("h100-sxm-80gb", "h200", "cpu"):
        c = th.profile(name).metrics["ecc_uncorrected_delta"]
        assert (c.get("max"), c.severity, c.source and c.source.kind) == (0, "fail", "published")
        assert "DCGM" in c.source_text()
        estimates = [m for m, c in th.profile(name).metrics.items() if c.source and c.source.kind == "estimate"]
        assert all(th.profile(name).metrics[m].severity == "warn" for m in estimates)
        assert bool(estimates) == (name == "cpu")  # a sign-off profile has none
