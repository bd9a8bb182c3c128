"""Which profile a node is judged by: a GPU node (an NVIDIA device, or the site's word) never gets the CPU profile.

The rule (workloads.node.gpu_presence, clustergate.thresholds' select) on planted /sys and /dev trees and a fake
NVML.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fake_pynvml import FakeNode, FakeNvml

from clustergate.identity import gpu_node_problem
from clustergate.thresholds import load
from workloads.node import gpu_presence

from torchrun_job import ROOT

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
