"""Environment discovery on captured node files (tests/data/discovery): parsers and checks, no GPU."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from workloads.node import checks as node_checks
from workloads.node import discovery

DATA = Path(__file__).parents[1] / "data" / "discovery"
H100 = DATA / "h100-node"


@pytest.fixture
def node() -> dict:
    cfg = discovery.Config(root=str(H100), topology=False, pci_bus_ids=("00000000:18:00.0", "00000000:9A:00.0"))
    return discovery.discover_node(cfg)


def test_cpulist_round_trip() -> None:
    assert discovery.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert discovery.parse_cpulist("") == []
    assert discovery.format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert discovery.format_cpulist(discovery.parse_cpulist("0-55,112-167")) == "0-55,112-167"


def test_cpu_memory_os_kernel(node: dict) -> None:
    assert node["cpu"] == {"model": "Intel(R) Xeon(R) Platinum 8480+", "sockets": 2, "cores": 4, "logical_cpus": 8}
    assert node["memory_gib"] == pytest.approx(2015.4, abs=0.1)
    assert node["os"] == "Ubuntu 22.04.4 LTS"
    assert node["kernel"] == "5.15.0-105-generic"


def test_numa_nodes(node: dict) -> None:
    assert [(n["node"], n["cpus"]) for n in node["numa_nodes"]] == [(0, "0-1,4-5"), (1, "2-3,6-7")]
    assert all(n["memory_gib"] == pytest.approx(1007.7, abs=0.1) for n in node["numa_nodes"])


def test_gpu_locality_from_nvml_bus_ids(node: dict) -> None:
    assert node["gpus"] == [
        {"bus_id": "0000:18:00.0", "numa_node": 0, "local_cpus": "0-1,4-5"},
        {"bus_id": "0000:9a:00.0", "numa_node": 1, "local_cpus": "2-3,6-7"},
    ]
    # numa_node -1 (no NUMA information, common in VMs) and a missing device both mean "unknown".
    assert discovery.gpu_locality(H100, "0000:c0:00.0")["numa_node"] is None
    assert discovery.gpu_locality(H100, "0000:ff:00.0") == {"bus_id": "0000:ff:00.0", "numa_node": None,
                                                            "local_cpus": None}


def test_infiniband_ports(node: dict) -> None:
    ports = {(p["device"], p["port"]): p for p in node["infiniband"]}
    assert len(ports) == 5
    assert ports[("mlx5_0", 1)] == {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
                                    "rate": "400 Gb/sec (4X NDR)", "rate_gbps": 400.0, "link_layer": "InfiniBand"}
    assert ports[("mlx5_3", 1)]["state"] == "DOWN" and ports[("mlx5_3", 1)]["phys_state"] == "Disabled"
    assert ports[("mlx5_bond_0", 1)]["link_layer"] == "Ethernet"


def test_ib_problem_counts_active_infiniband_and_roce_ports_at_rate(node: dict) -> None:
    ports = node["infiniband"]
    assert node_checks.ib_problem(ports, 4, None) is None  # three ACTIVE InfiniBand ports and the RoCE bond
    assert node_checks.ib_problem(ports, 2, 400) is None
    assert node_checks.fabric_kind(ports) == "InfiniBand+RoCE"
    assert node_checks.ib_problem(ports, 5, None) is not None
    problem = node_checks.ib_problem(ports, 4, 400)
    assert problem is not None
    assert problem.startswith("2 InfiniBand or RoCE ports ACTIVE at >= 400 Gb/s, the profile requires 4")
    assert "mlx5_3/1 DOWN" in problem and "mlx5_2/1 ACTIVE 200 Gb/sec" in problem
    assert "mlx5_bond_0/1 ACTIVE 200 Gb/sec (4X HDR) RoCE" in problem  # the fabric's kind, not the link layer
    assert "no ports under /sys/class/infiniband" in node_checks.ib_problem([], 1, None)
    assert node_checks.fabric_kind([p for p in ports if p["link_layer"] == "InfiniBand"]) == "InfiniBand"
    assert node_checks.fabric_kind([p for p in ports if p["state"] != "ACTIVE"]) is None


def test_gpudirect_rdma_module(node: dict, tmp_path: Path) -> None:
    assert node["gpudirect_rdma"] == {"loaded": True, "modules": ["nvidia_peermem"], "source": "/proc/modules"}
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "modules").write_text("nvidia 1 0 - Live 0x0\n")
    assert discovery.read_gpudirect(tmp_path)["loaded"] is False
    (tmp_path / "proc" / "modules").unlink()  # no /proc/modules (some sandboxes): /sys/module still tells
    (tmp_path / "sys" / "module" / "nvidia_peermem").mkdir(parents=True)
    assert discovery.read_gpudirect(tmp_path)["modules"] == ["nvidia_peermem"]


def test_mounts_keep_shared_filesystems_only(node: dict) -> None:
    assert [(m["mountpoint"], m["fstype"]) for m in node["mounts"]] == [
        ("/home", "nfs4"), ("/lustre/scratch", "lustre"), ("/mnt/weka", "wekafs"), ("/mnt/team data", "nfs")]
    assert "vers=4.2" in node["mounts"][0]["options"]


def test_arm_cpuinfo_falls_back_to_sysfs_topology() -> None:
    node = discovery.discover_node(discovery.Config(root=str(DATA / "arm-node"), topology=False))
    assert node["cpu"] == {"model": None, "sockets": 2, "cores": 4, "logical_cpus": 4}
    assert node["numa_nodes"] == [] and node["infiniband"] == [] and node["mounts"] == []


def test_missing_files_give_empty_answers(tmp_path: Path) -> None:
    node = discovery.discover_node(discovery.Config(root=str(tmp_path), topology=False))
    assert node["cpu"]["logical_cpus"] == 0 and node["memory_gib"] is None and node["os"] is None
    json.dumps(node)  # JSON-serialisable, for results.json


def test_topology_text_kept_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sample = DATA / "nvidia-smi-topo-m-h100.txt"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'topo -m' ] && exec cat '{sample}'\nexit 9\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    topo = discovery.nvidia_smi_topology()
    assert topo == {"text": sample.read_text(), "error": None}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert discovery.nvidia_smi_topology()["error"] == "nvidia-smi not found on PATH"


def test_binding_problem() -> None:
    online = set(range(8))
    assert node_checks.binding_problem({0, 1, 4, 5}, "0-1,4-5", online) is None
    assert node_checks.binding_problem({0}, "0-1,4-5", online) is None
    assert node_checks.binding_problem(online, "0-7", online) is None  # one NUMA node: anything is local
    assert node_checks.binding_problem(online, None, online) is None  # nothing known
    problem = node_checks.binding_problem(online, "2-3,6-7", online)
    assert problem == "allowed CPUs 0-7 include 4 outside the GPU's local CPUs 2-3,6-7"


def test_disagreement_names_the_odd_node() -> None:
    assert node_checks.disagreement("driver", {"node 0 (a)": "560.35", "node 1 (b)": "560.35"}) is None
    line = node_checks.disagreement("driver", {"node 0 (a)": "560.35", "node 1 (b)": "550.54", "node 2 (c)": "560.35"})
    assert line == "driver: node 1 (b) has '550.54' where the other 2 nodes have '560.35'"
    tie = node_checks.disagreement("CUDA devices", {"node 0 (a)": 8, "node 1 (b)": 7})
    assert tie == "nodes disagree on CUDA devices: 8 on node 0 (a); 7 on node 1 (b)"
