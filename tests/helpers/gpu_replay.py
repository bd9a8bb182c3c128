"""A pytest plugin that replays a recorded GPU on a CPU rank: ``-p gpu_replay`` (with tests/helpers/ on PYTHONPATH).

The GPU inventory tests (acceptance/test_gpu_inventory.py) judge NVML snapshots; this plugin hands them a
recorded one instead of reading NVML, so the real plugin, the real checks and the real results.json run on a
machine without a GPU, under a GPU profile:

- ``CLUSTERGATE_REPLAY_SNAPSHOTS``: a file in the layout of tests/data/gpu/ (``{"snapshots": [...]}``,
  what ``torchrun -m workloads.gpu.inventory --out FILE`` writes); rank r replays snapshot r, on this host;
- the rank's identity (what results.json's ``nodes[].gpus`` say: index, UUID, serial, name) is that GPU's;
- NVML's process list of the GPU holds this rank's own process, and ``CLUSTERGATE_REPLAY_FOREIGN``
  (``PID:NAME:BYTES,...``) adds processes of another job.

Only what NVML would say is replayed; nothing the tests judge is changed.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch

import clustergate.run.startup
from clustergate.trust.identity import GpuIdentity, RankIdentity
from workloads.gpu import inventory, processes
from workloads.node.name import node_name

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS_ENV = "CLUSTERGATE_REPLAY_SNAPSHOTS"
FOREIGN_ENV = "CLUSTERGATE_REPLAY_FOREIGN"


def _snapshot(rank: int) -> dict[str, Any]:
    snaps = json.loads(Path(os.environ[SNAPSHOTS_ENV]).read_text())["snapshots"]
    snap = copy.deepcopy(snaps[rank % len(snaps)])
    snap.update(rank=rank, host=node_name())
    return snap


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def replayed_identity(rank: int, local_rank: int, node_rank: int, device: torch.device) -> RankIdentity:
    gpu = _snapshot(rank)["gpu"]
    return RankIdentity(rank, local_rank, node_rank, node_name(),
                        GpuIdentity(index=gpu["index"], uuid=gpu["uuid"], serial=gpu.get("serial"), name=gpu["name"],
                                    pci_bus_id=gpu.get("pci_bus_id")))


def replayed_snapshot(device: torch.device, *, pcie_load_s: float = 0.0) -> dict[str, Any]:
    return _snapshot(_rank())


def replayed_own(device: torch.device) -> dict[str, Any]:
    return {"host": node_name(), "pid": os.getpid(), "contexts": [_snapshot(_rank())["gpu"]["uuid"]]}


def replayed_processes(device: torch.device, root: Path = Path("/")) -> dict[str, Any]:
    gpu = _snapshot(_rank())["gpu"]
    listed = [{"pid": os.getpid(), "kinds": ["compute"], "used_bytes": 600 << 20, "name": "python3", "ancestors": []}]
    for item in filter(None, os.environ.get(FOREIGN_ENV, "").split(",")):
        pid, name, used = item.split(":")
        listed.append({"pid": int(pid), "kinds": ["compute"], "used_bytes": int(used), "name": name, "ancestors": [1]})
    return {"host": node_name(), "gpu": {k: gpu.get(k) for k in ("uuid", "serial", "index")}, "processes": listed,
            "unsupported": None, "error": None}


if os.environ.get(SNAPSHOTS_ENV):
    clustergate.run.startup.rank_identity = replayed_identity  # type: ignore[assignment]
    inventory.snapshot = replayed_snapshot  # type: ignore[assignment]
    processes.own_process = replayed_own  # type: ignore[assignment]
    processes.read = replayed_processes  # type: ignore[assignment]


# ---- for the suite's own tests: a recorded GPU, and the inventory tests run on it ----------------------------

def one_gpu_vm(tmp: Path, pcie_gen: int = 5) -> Path:
    """GPU 0 of the recorded 8x H100 node (tests/data/gpu/) as one GPU passed through to a VM: NVML lists no
    NVLink, CUDA and NVML see one GPU, its PCIe link trains at ``pcie_gen`` under load."""
    snap = json.loads((ROOT / "tests" / "data" / "gpu" / "h100_node_healthy.json").read_text())["snapshots"][0]
    del snap["gpu"]["nvlink_states"]
    snap["unsupported"]["nvlink_states"] = "not supported (NVML reports no NVLink on this GPU)"
    snap["cuda_device_count"] = snap["nvml"]["device_count"] = 1
    snap["gpu"]["pcie_gen_current"] = snap["gpu"]["pcie_gen_max"] = pcie_gen
    path = tmp / "vm.json"
    path.write_text(json.dumps({"source": "tests/data/gpu/h100_node_healthy.json, GPU 0 as a 1-GPU VM",
                                "snapshots": [snap]}))
    return path


def inventory_run(tmp: Path, name: str, thresholds: Path, profile: str, snapshots: Path,
                  env: dict[str, str] | None = None) -> Any:
    """acceptance/test_gpu_inventory.py on one rank under torchrun, replaying ``snapshots``; its JobResult."""
    from torchrun_job import run_job

    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'helpers'}", SNAPSHOTS_ENV: str(snapshots), **(env or {})}
    return run_job(tmp, [str(ROOT / "acceptance" / "test_gpu_inventory.py"), "-p", "gpu_replay", "--thresholds",
                         str(thresholds), "--profile", profile], nproc=1, env=env, report_dir=tmp / name)
