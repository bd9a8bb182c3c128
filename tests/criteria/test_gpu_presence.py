"""Which profile a node is judged by: a GPU node (an NVIDIA device, or the site's word) never gets the CPU profile.

The rule (workloads.node.gpu_presence, clustergate.criteria.thresholds' select) on planted /sys and /dev trees and a
fake NVML; then the run itself under torchrun on a CPU machine with a planted NVIDIA PCI device: the torch of this
machine sees no CUDA, which on a GPU node is a broken driver or CUDA, a reject, never the cpu profile's accept.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fake_pynvml import FakeNode, FakeNvml

from clustergate.criteria.thresholds import load
from clustergate.trust.identity import gpu_model, gpu_node_problem
from workloads.node import gpu_presence

from torchrun_job import ROOT, plant, run_job, start_ranks

SHIPPED = load(ROOT / "thresholds.yaml")


def pci(root: Path, bus: str, cls: str, vendor: str = "0x10de") -> None:
    dev = root / "sys/bus/pci/devices" / bus
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(cls + "\n")


def find(root: Path, nvml: object | None = None) -> gpu_presence.NvidiaDevices:
    return gpu_presence.find(root, nvml, None if nvml else "NVML does not answer (planted)")


@pytest.fixture(autouse=True)
def no_site_word(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu_presence.EXPECTED_GPUS_ENV, raising=False)


def test_a_node_without_any_nvidia_device_gets_the_cpu_profile(tmp_path: Path) -> None:
    pci(tmp_path, "0000:00:1f.2", "0x010601", vendor="0x8086")  # an Intel SATA controller
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidiactl").write_text("")  # the control node exists with no GPU bound
    found = find(tmp_path)
    assert not found.present and found.evidence() == "no NVIDIA device"
    assert SHIPPED.select(found.model, gpu_node=found.present).name == "cpu"
    assert gpu_node_problem(found, torch.device("cpu")) is None


@pytest.mark.parametrize(("plant_it", "says"), [
    (lambda r: pci(r, "0000:18:00.0", "0x030200"), "1 GPUs and 0 other devices of vendor 0x10de on the PCI bus"),
    (lambda r: pci(r, "0000:05:00.0", "0x068000"), "0 GPUs and 1 other devices of vendor 0x10de"),  # an NVSwitch
    (lambda r: (r / "dev").mkdir() or (r / "dev/nvidia0").write_text(""), "/dev/nvidia0"),
])
def test_an_nvidia_device_without_nvml_is_a_gpu_node_of_unknown_model(tmp_path: Path, plant_it: object,
                                                                     says: str) -> None:
    plant_it(tmp_path)  # type: ignore[operator]
    found = find(tmp_path)
    assert found.present and found.model is None and says in found.evidence()
    assert SHIPPED.select(found.model, gpu_node=found.present).name == "nvidia-generic"  # the fallback, not cpu
    problem = gpu_node_problem(found, torch.device("cpu"))
    assert problem is not None and "the NVIDIA driver or CUDA is broken" in problem and says in problem


def test_the_sites_word_alone_makes_a_gpu_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpu_presence.EXPECTED_GPUS_ENV, "8")
    found = find(tmp_path)
    assert found.present and "CLUSTERGATE_GPUS_PER_NODE=8" in found.evidence()
    monkeypatch.setenv(gpu_presence.EXPECTED_GPUS_ENV, "0")  # the launchers' word for CPU ranks
    assert not find(tmp_path).present


def test_nvml_names_the_model_the_profile_is_chosen_by(tmp_path: Path) -> None:
    gpus = [FakeNvml(), FakeNvml()]
    for g in gpus:
        g.answers["nvmlDeviceGetName"] = "NVIDIA H200"
    found = find(tmp_path, FakeNode(gpus))
    assert found.nvml_gpus == ("NVIDIA H200", "NVIDIA H200") and found.model == "NVIDIA H200"
    assert SHIPPED.select(found.model, gpu_node=found.present).name == "h200"
    assert SHIPPED.select(None).name == "cpu"  # callers that know of no GPU node: as before


def test_the_node_shape_is_the_sites_count_else_the_usable_gpus_else_nvmls(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The count a profile's shape is chosen by: the site's word wins, so a node of 8 that lost GPUs is judged as a
    node of 8 (and fails its GPU count) rather than passing as a smaller shape."""
    gpus = [FakeNvml(), FakeNvml()]
    for g in gpus:
        g.answers["nvmlDeviceGetName"] = "NVIDIA H200"
    found = find(tmp_path, FakeNode(gpus))
    assert found.shape_gpus() == 2 and found.shape_gpus(visible=1) == 1  # CUDA_VISIBLE_DEVICES narrowed it
    assert SHIPPED.select(found.model, gpu_node=True, gpus=found.shape_gpus()).name == "h200-2gpu"
    monkeypatch.setenv(gpu_presence.EXPECTED_GPUS_ENV, "8")
    found = find(tmp_path, FakeNode(gpus))
    assert found.shape_gpus(visible=2) == 8
    assert SHIPPED.select(found.model, gpu_node=True, gpus=found.shape_gpus(visible=2)).name == "h200"
    monkeypatch.delenv(gpu_presence.EXPECTED_GPUS_ENV)
    assert find(tmp_path / "none").shape_gpus() is None  # no GPU seen: no shape


def test_a_run_takes_cudas_model_name_where_nvml_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia0").write_text("")
    found = find(tmp_path)  # NVML does not answer
    assert gpu_model(found) is None  # this machine's torch sees no CUDA either
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    assert SHIPPED.select(gpu_model(found), gpu_node=found.present).name == "h100-sxm-80gb"


def test_a_gpu_node_whose_torch_sees_no_cuda_is_a_reject_not_a_cpu_accept(tmp_path: Path) -> None:
    """This machine's torch has no CUDA: with an NVIDIA device planted under CLUSTERGATE_HOST_ROOT the run stops at
    collection, rejects, and its error says the driver or CUDA is broken. (The site's word, 8 GPUs, is read by the
    same gpu_presence.find, test_the_sites_word_alone_makes_a_gpu_node, and ends the run on the same path.)"""
    root = tmp_path / "host"
    root.mkdir()
    pci(root, "0000:18:00.0", "0x030200")
    job = run_job(tmp_path, plant(tmp_path, "healthy"), env={"CLUSTERGATE_HOST_ROOT": str(root)}, timeout=180)
    assert job.codes == [1], job.output[-3000:]
    res = job.results
    assert res["verdict"] == "reject" and res["profile"] == "nvidia-generic", job.output[-3000:]
    assert "the NVIDIA driver or CUDA is broken" in res["error"] and "torch sees no CUDA" not in res["error"]
    assert "sees no CUDA device" in res["error"] and res["tests"] == []
    assert "REJECT" in job.output and "ACCEPT" not in job.output


def test_the_driver_and_the_launchers_word_make_a_gpu_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's own list of GPUs under the host root, and a launcher that gave the job GPUs; values that give
    none (a CUDA image's NVIDIA_VISIBLE_DEVICES=all, Slurm's 0) are no word."""
    (tmp_path / "proc/driver/nvidia/gpus/0000:18:00.0").mkdir(parents=True)
    found = find(tmp_path)
    assert found.present and found.driver_gpus == ("0000:18:00.0",)
    assert "/proc/driver/nvidia/gpus lists 1 GPUs" in found.evidence()
    empty = tmp_path / "empty"
    for name in gpu_presence.LAUNCHER_GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "0")
    assert not find(empty).present
    for name, value in (("SLURM_GPUS_ON_NODE", "8"), ("SLURM_JOB_GPUS", "0,1,2,3"), ("SLURM_GPUS_PER_NODE", "h100:8"),
                        ("NVIDIA_VISIBLE_DEVICES", "GPU-8f6c1e2a-0000-0000-0000-000000000000")):
        monkeypatch.setenv(name, value)
        found = find(empty)
        assert found.present and f"{name}={value}" in found.evidence(), name
        monkeypatch.setenv(name, "0" if name.startswith("SLURM") else "all")


def test_profile_cpu_where_the_site_declares_gpus_is_a_usage_error_on_every_rank(tmp_path: Path) -> None:
    """The cpu profile measures none of a GPU node's GPUs: without --dry-run every rank refuses it at the start (each
    rank's own status: 2), in one line saying what was seen and what to pass."""
    job = start_ranks(tmp_path, [*plant(tmp_path, "healthy"), "--profile", "cpu"],
                      env={gpu_presence.EXPECTED_GPUS_ENV: "8"}, timeout=120)  # a hang guard: it stops at the start
    r = job.wait()
    assert r.codes == [2, 2], r.output[-3000:]
    assert ("ERROR: --profile cpu on a GPU node (CLUSTERGATE_GPUS_PER_NODE=8): the cpu profile measures none of its "
            "GPUs, so here it is a dry run; pass --dry-run") in r.output, r.output[-3000:]
    assert "Traceback" not in r.output and not (tmp_path / "report" / "results.json").exists()


def test_a_dry_run_of_the_cpu_profile_on_a_gpu_node_is_recorded_as_one(tmp_path: Path) -> None:
    """--dry-run: the cpu suite runs and accepts, and the record says it was a dry run (the merge never signs it off
    beside GPU nodes)."""
    job = run_job(tmp_path, [*plant(tmp_path, "healthy"), "--profile", "cpu", "--dry-run"],
                  env={gpu_presence.EXPECTED_GPUS_ENV: "8"}, timeout=180)
    assert job.codes == [0], job.output[-3000:]
    res = job.results
    assert res["verdict"] == "accept" and res["profile"] == "cpu" and res["attestation"]["dry_run"] is True
