"""A process of another job on a GPU is caught, named and failed on that GPU's rank; the job's own are not.

NVML is tests/helpers/fake_pynvml.py with process lists added; /proc is a directory built per test (comm, status).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gpu_replay
import pytest
from fake_pynvml import NOT_SUPPORTED, FakeNvml, NVMLError

from workloads.gpu import processes

GiB = 1 << 30
HOST = "gpu-node-07"
UUID = "GPU-5e1f"


class ProcessNvml(FakeNvml):
    """FakeNvml with running processes: {pid: used bytes} for compute and graphics."""

    def __init__(self, compute: dict[int, int | None], graphics: dict[int, int | None] | None = None) -> None:
        super().__init__()
        self.compute, self.graphics = compute, graphics or {}
        self.names = {4242: b"/usr/bin/python3.11"}

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.compute.items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        self._check("nvmlDeviceGetGraphicsRunningProcesses")
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.graphics.items()]

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:
        if pid not in self.names:
            raise NVMLError(NOT_SUPPORTED)
        return self.names[pid]


def proc(root: Path, pid: int, comm: str, ppid: int) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "status").write_text(f"Name:\t{comm}\nPid:\t{pid}\nPPid:\t{ppid}\n")


def listing(nvml: ProcessNvml, root: Path) -> dict[str, Any]:
    return {"host": HOST, "gpu": {"uuid": UUID, "index": 3, "serial": "1652923017345"},
            **processes.read_with(nvml, "handle", root)}


def own(*pids: int, host: str = HOST, gpu: str = UUID) -> list[dict[str, Any]]:
    return [{"host": host, "pid": p, "contexts": [gpu]} for p in pids]


def test_a_foreign_process_is_named_with_pid_name_and_memory(tmp_path: Path) -> None:
    proc(tmp_path, 1000, "python3", 1)  # rank 0 of this job
    proc(tmp_path, 4242, "bf16_matmuls", 1)  # another job's
    nvml = ProcessNvml({1000: 2 * GiB, 4242: 21 * GiB})
    check = processes.judge(listing(nvml, tmp_path), own(1000, 1001))
    assert check.status == "fail"
    assert "1 process(es) of another job on this GPU: pid 4242 (bf16_matmuls, 21.0 GiB, compute)" in check.message
    assert "pids [1000, 1001]" in check.message and "nvidia-smi" in check.message
    assert check.value["foreign"] == 1 and [p["pid"] for p in check.value["processes"]] == [1000, 4242]


def test_only_the_jobs_own_ranks_and_their_children_pass(tmp_path: Path) -> None:
    proc(tmp_path, 1000, "python3", 1)
    proc(tmp_path, 1001, "python3", 1)  # another local rank that touched this GPU too
    proc(tmp_path, 1500, "compile_worker", 1000)  # a child of rank 0
    nvml = ProcessNvml({1000: 2 * GiB, 1001: 500 << 20, 1500: 100 << 20})
    check = processes.judge(listing(nvml, tmp_path), own(1000, 1001))
    assert check.status == "ok" and check.value["foreign"] == 0
    assert "only the job's own processes on the GPU (3)" in check.message


def test_ranks_of_other_hosts_do_not_excuse_a_pid_here(tmp_path: Path) -> None:
    nvml = ProcessNvml({1000: GiB})
    check = processes.judge(listing(nvml, tmp_path), own(1000, host="gpu-node-08") + own(2000, gpu="GPU-other"))
    assert check.status == "fail" and "pid 1000" in check.message


def test_name_falls_back_to_nvml_and_memory_may_be_unknown(tmp_path: Path) -> None:
    nvml = ProcessNvml({4242: None}, graphics={4242: None, 77: 1 << 62})  # 1 << 62: NVML's "not available"
    seen = listing(nvml, tmp_path)
    by_pid = {p["pid"]: p for p in seen["processes"]}
    assert by_pid[4242]["name"] == "python3.11" and by_pid[4242]["kinds"] == ["compute", "graphics"]
    assert by_pid[77]["name"] is None and by_pid[77]["used_bytes"] is None
    message = processes.judge(seen, own(1000)).message
    assert "pid 77 (name unknown, memory not reported, graphics)" in message
    assert "pid 4242 (python3.11, memory not reported, compute+graphics)" in message


def test_another_pid_namespace_counts_processes_against_the_ranks_holding_the_gpu(tmp_path: Path) -> None:
    # A container without the host's PID namespace: NVML's pids are the host's, no rank's pid matches.
    alone = processes.judge(listing(ProcessNvml({81234: 2 * GiB}), tmp_path), own(17))
    assert alone.status == "ok" and "counted, not matched" in alone.message
    shared = processes.judge(listing(ProcessNvml({81234: 2 * GiB, 90001: 30 * GiB}), tmp_path), own(17))
    assert shared.status == "fail" and shared.value["foreign"] == 1
    assert "2 processes on this GPU but the job's ranks account for 1" in shared.message
    assert "pid 90001" in shared.message and "PID namespace" in shared.message


def test_an_empty_list_while_the_job_holds_the_gpu_is_unsupported_not_passed(tmp_path: Path) -> None:
    check = processes.judge(listing(ProcessNvml({}), tmp_path), own(1000))
    assert check.status == "unsupported" and "hidden too" in check.message


def test_lists_nvml_cannot_give_are_unsupported_never_passed(tmp_path: Path) -> None:
    nvml = ProcessNvml({})
    nvml.unsupported |= {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"}
    check = processes.judge(listing(nvml, tmp_path), own(1000))
    assert check.status == "unsupported" and "cannot list" in check.message
    nvml = ProcessNvml({})
    nvml.fail["nvmlDeviceGetComputeRunningProcesses"] = 15  # GPU is lost
    check = processes.judge(listing(nvml, tmp_path), own(1000))
    assert check.status == "fail" and "GPU is lost" in check.message and "Xid" in check.message
    failed = processes.judge(processes.failed_read(ImportError("No module named 'pynvml'")), own(1000))
    assert failed.status == "fail" and "pynvml" in failed.message


@pytest.mark.parametrize("chain", [(500, 1), (500, 400, 1)])
def test_ancestry_is_read_from_proc(tmp_path: Path, chain: tuple[int, ...]) -> None:
    pid = 600
    proc(tmp_path, pid, "child", chain[0])
    for a, parent in zip(chain, chain[1:], strict=False):
        proc(tmp_path, a, "p", parent)
    assert processes.ancestors(pid, tmp_path) == [c for c in chain if c > 1]


@pytest.mark.slow
def test_the_inventory_fails_a_shared_gpu_on_its_rank_naming_host_gpu_and_serial(tmp_path: Path) -> None:
    """The acceptance test on a recorded GPU (tests/helpers/gpu_replay.py) with another job's process on it: the run
    rejects, the failure names the rank's host, GPU index and serial and the process's pid, name and memory."""
    sys.path.insert(0, str(gpu_replay.ROOT / "benchmarks"))
    import session_tools

    name, text = session_tools.session_profile(gpu_replay.ROOT / "thresholds.yaml", 1, "NVIDIA H100 80GB HBM3")
    (tmp_path / "t.yaml").write_text(text)
    vm = gpu_replay.one_gpu_vm(tmp_path)
    clean = gpu_replay.inventory_run(tmp_path, "clean", tmp_path / "t.yaml", name, vm)
    # The inventory file alone passes every check; one file of the suite is a partial run, never an accept.
    assert {t["outcome"] for t in clean.results["tests"]} <= {"passed", "skipped"}, clean.output[-3000:]
    assert clean.results["verdict"] == "partial" and clean.results["error"] is None
    shared = gpu_replay.inventory_run(tmp_path, "shared", tmp_path / "t.yaml", name, vm,
                                      env={gpu_replay.FOREIGN_ENV: f"4242:bf16_matmuls:{21 * GiB}"})
    assert shared.results["verdict"] == "reject"
    (test,) = [t for t in shared.results["tests"] if t["outcome"] == "failed"]
    assert test["nodeid"].endswith("test_no_foreign_gpu_processes") and test["failed_ranks"] == [0]
    assert "gpu 0 serial 1652823054300" in test["message"]
    assert "pid 4242 (bf16_matmuls, 21.0 GiB, compute)" in test["message"]
    (metric,) = test["metrics"]
    assert metric["name"] == "gpu_foreign_processes" and metric["value"] == 1 and not metric["passed"]
