"""One rule chooses the profile for ``clustergate run``, ``health`` and ``list`` (clustergate.criteria.profile_choice).

The rule on its own; then ``list`` and ``health`` as commands on made-up nodes (a fake NVML and planted /sys and
/dev trees): they choose alike. The run's side on such a node is tests/criteria/test_gpu_presence.py's (a planted NVIDIA
PCI device: the run is judged by the fallback profile, as list and health choose below).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_pynvml import FakeNode, FakeNvml
from health_node import FAKE_NVML, GpuNode

from clustergate.criteria.profile_choice import choose_profile
from clustergate.criteria.thresholds import ThresholdsError, load
from workloads.node import gpu_presence

from torchrun_job import ROOT

SHIPPED = load(ROOT / "thresholds.yaml")


def _found(tmp_path: Path, *names: str, bus: bool = False) -> gpu_presence.NvidiaDevices:
    if bus:
        dev = tmp_path / "sys/bus/pci/devices/0000:18:00.0"
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "class").write_text("0x030200\n")
    gpus = []
    for name in names:
        gpus.append(FakeNvml())
        gpus[-1].answers["nvmlDeviceGetName"] = name
    return gpu_presence.find(tmp_path, FakeNode(gpus), None)


@pytest.fixture(autouse=True)
def no_site_word(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu_presence.EXPECTED_GPUS_ENV, raising=False)


def test_the_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h200 = _found(tmp_path / "a", "NVIDIA H200", "NVIDIA H200", bus=True)
    assert choose_profile(SHIPPED, None, h200).name == "h200-2gpu"  # the model's profile for the node's shape
    assert choose_profile(SHIPPED, None, _found(tmp_path / "e", *["NVIDIA H200"] * 8, bus=True)).name == "h200"
    monkeypatch.setenv(gpu_presence.EXPECTED_GPUS_ENV, "8")  # the site's word: a node that lost GPUs stays an 8
    assert choose_profile(SHIPPED, None, _found(tmp_path / "f", "NVIDIA H200", "NVIDIA H200", bus=True)).name == "h200"
    monkeypatch.delenv(gpu_presence.EXPECTED_GPUS_ENV)
    assert choose_profile(SHIPPED, "cpu", h200).name == "cpu"  # named: that one, whatever the node
    unknown = _found(tmp_path / "b", "NVIDIA B999", bus=True)
    assert choose_profile(SHIPPED, None, unknown).name == SHIPPED.fallback_profile
    unread = _found(tmp_path / "c", bus=True)  # on the bus, NVML lists none
    assert choose_profile(SHIPPED, None, unread).name == SHIPPED.fallback_profile
    asked = []
    assert choose_profile(SHIPPED, None, unread, model_of=lambda f: asked.append(f) or "NVIDIA H200").name == "h200"
    assert choose_profile(SHIPPED, "h200", unread, model_of=asked.append).name == "h200" and len(asked) == 1
    none = _found(tmp_path / "d")
    assert choose_profile(SHIPPED, None, none).name == SHIPPED.cpu_profile
    monkeypatch.setenv(gpu_presence.EXPECTED_GPUS_ENV, "8")  # the site's word makes a GPU node
    assert choose_profile(SHIPPED, None, _found(tmp_path / "e")).name == SHIPPED.fallback_profile
    with pytest.raises(ThresholdsError, match="no profile 'h900'"):
        choose_profile(SHIPPED, "h900", none)


def _chosen(node_env: dict[str, str], cwd: Path, *args: str) -> tuple[str, str]:
    """(list's profile, health's profile) on the node ``node_env`` describes."""
    chosen = []
    for command in (["list", "--json", *args], ["health", "--json", *args]):
        proc = subprocess.run([sys.executable, "-m", "clustergate", *command], env=node_env, cwd=cwd,
                              capture_output=True, text=True, timeout=120)
        assert proc.stdout.startswith("{"), proc.stdout[-2000:] + proc.stderr[-2000:]
        chosen.append(json.loads(proc.stdout)["profile"])
    return chosen[0], chosen[1]


@pytest.mark.parametrize(("node", "expected"), [("h100", "h100-sxm-80gb"), ("bus only", SHIPPED.fallback_profile),
                                                 ("no device", SHIPPED.cpu_profile)])
def test_list_and_health_choose_alike(tmp_path: Path, node: str, expected: str) -> None:
    gpus = GpuNode(tmp_path / "host", gpus=8 if node == "h100" else 0)
    env = gpus.env()
    if node == "no device":
        for rel in ("sys/bus/pci", "dev"):
            shutil.rmtree(gpus.root / rel)
    elif node == "bus only":
        gpus.write("sys/bus/pci/devices/0000:18:00.0/vendor", "0x10de\n")
        gpus.write("sys/bus/pci/devices/0000:18:00.0/class", "0x030200\n")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(FAKE_NVML)
    assert _chosen(env, tmp_path) == (expected, expected)
    assert _chosen(env, tmp_path, "--profile", "h200") == ("h200", "h200")
