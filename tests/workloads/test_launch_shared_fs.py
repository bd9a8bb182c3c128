"""The shared-directory workload: its pure parts, and a run alone (world size 1) on a temporary directory.

The multi-node behaviour (a token written on one node read on the other) runs in the 2-node rehearsal.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workloads.node import shared_fs
from workloads.result import WorkloadError

from torchrun_job import ROOT, job_env

MOUNTS = (Path(__file__).parents[1] / "data" / "discovery" / "h100-node" / "proc" / "mounts").read_text()


def test_filesystem_of_is_the_longest_mountpoint() -> None:
    assert shared_fs.filesystem_of("/lustre/scratch/team/run1", MOUNTS) == {
        "mountpoint": "/lustre/scratch", "fstype": "lustre", "source": "10.10.0.1@o2ib:/scratch"}
    assert shared_fs.filesystem_of("/lustre", MOUNTS)["fstype"] == "ext4"  # /lustre itself is on /
    assert shared_fs.filesystem_of("/mnt/team data/x", MOUNTS)["fstype"] == "nfs"


def test_directory_problem(tmp_path: Path) -> None:
    assert shared_fs.directory_problem(str(tmp_path)) is None
    assert shared_fs.directory_problem(str(tmp_path / "absent")) == f"{tmp_path / 'absent'} does not exist"
    (tmp_path / "file").write_text("x")
    assert shared_fs.directory_problem(str(tmp_path / "file")) == f"{tmp_path / 'file'} is not a directory"


def test_config_sizes() -> None:
    cpu = shared_fs.Config.for_level("standard", torch.device("cpu"), "/x")
    assert cpu.size_bytes == 32 << 20 and cpu.size_bytes % cpu.block_bytes == 0
    gpu = shared_fs.Config.for_level("extended", torch.device("cuda", 0), "/x")
    assert gpu.size_bytes == 4 << 30
    with pytest.raises(ValueError, match="multiple of block_bytes"):
        shared_fs.Config(directory="/x", size_bytes=3, block_bytes=2)


def _alone(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workloads.node.shared_fs", "--directory", str(directory),
                           "--level", "quick"], cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=120)


def test_run_alone_measures_and_cleans_up(tmp_path: Path) -> None:
    proc = _alone(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"node 0 ({socket.gethostname()}): write ") and "GB/s, read " in proc.stdout
    assert list(tmp_path.iterdir()) == []  # the token and the data files are gone


def test_run_records_node_metrics(tmp_path: Path, gloo_world: None) -> None:
    result = shared_fs.run(shared_fs.Config(directory=str(tmp_path), size_bytes=4 << 20, block_bytes=1 << 20))
    assert [(m.name, m.unit, m.scope) for m in result.metrics] == [
        ("shared_fs_write_gbps", "GB/s", "node"), ("shared_fs_read_gbps", "GB/s", "node")]
    assert all(m.value > 0 for m in result.metrics)
    [node] = result.details["per_node"]
    assert node["read_from_node"] == 0 and node["mount"]["mountpoint"]
    assert result.details["token_read_by_ranks"] == 1 and list(tmp_path.iterdir()) == []


def test_run_missing_directory_is_named(tmp_path: Path, gloo_world: None) -> None:
    with pytest.raises(WorkloadError) as info:
        shared_fs.run(shared_fs.Config(directory=str(tmp_path / "absent"), size_bytes=1 << 20, block_bytes=1 << 20))
    assert str(info.value) == (
        f"the shared directory {tmp_path / 'absent'} is unusable on 1/1 ranks (mount it on every node, or point "
        f"the test at one that is):\n  node 0 ({socket.gethostname()}) rank 0: {tmp_path / 'absent'} does not exist")
