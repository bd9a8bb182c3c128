"""The storage-tier workload: fio's real JSON read back (tests/data/storage, captured from fio 3.33 on this
repository's CI machine), fio run for real on a temporary directory, a corrupted block caught by fio's crc32c
verify, fio missing, a filesystem that refuses O_DIRECT, the NVMe count, and the shared node run's records."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from trust_runs import node_run  # noqa: F401  (the fixture)

from clustergate.trust import manifest, skip_facts
from workloads.node import storage
from workloads.result import WorkloadError

DATA = Path(__file__).parents[1] / "data" / "storage"
CPU = torch.device("cpu")
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")


def quick(directory: Path, tier: str = "local") -> storage.Config:
    return storage.Config.for_level("quick", CPU, tier, str(directory))


# ---- fio's own output ----------------------------------------------------------------------------------------

def test_parse_reads_fio_json_of_every_step() -> None:
    text = (DATA / "fio-3.33-local-quick.json").read_text()
    steps = storage.step_figures(storage.parse(text))
    assert list(steps) == list(storage.STEPS)
    raw = {j["jobname"]: j for j in json.loads(text)["jobs"]}
    assert steps["write"]["write_bytes_per_s"] == raw["local-write"]["write"]["bw_bytes"] > 0
    assert steps["read"]["read_bytes_per_s"] == raw["local-read"]["read"]["bw_bytes"] > 0
    assert steps["randread"]["read_iops"] == raw["local-randread"]["read"]["iops"] > 0
    assert steps["write"]["read_bytes_per_s"] == steps["read"]["write_bytes_per_s"] == 0  # one direction a step
    assert storage.failure(steps, "", quick(Path("/scratch/cg")), "/scratch/cg", "node-a") is None


def test_a_verify_failure_names_the_tier_path_and_host() -> None:
    """fio prints its error line before the JSON document; the read step's error and the crc32c line on stderr."""
    stdout = (DATA / "fio-3.33-verify-failed.stdout").read_text()
    assert stdout.startswith("fio: pid=")
    steps = storage.step_figures(storage.parse(stdout))
    assert steps["read"]["error"] == errno.EILSEQ
    said = storage.failure(steps, (DATA / "fio-3.33-verify-failed.stderr").read_text(),
                           quick(Path("/scratch"), "shared"), "/scratch/cg", "node-b")
    assert said is not None and said.startswith("the shared tier at /scratch/cg on host node-b read back other data")
    assert "crc32c: verify failed at file /scratch/cg/cg-fio.0 offset 2097152" in said


@pytest.mark.parametrize(("text", "said"), [
    ("fio: some error\n", "fio wrote no JSON document"),
    ("{\n  \"jobs\" : [\n", "does not parse"),
    ("{\n}\n", "no jobs list"),
])
def test_output_that_is_not_fio_json_is_one_clear_error(text: str, said: str) -> None:
    with pytest.raises(WorkloadError, match=said):
        storage.parse(text)


def test_config_sizes() -> None:
    cpu = storage.Config.for_level("quick", CPU, "local", "/x")
    assert (cpu.file_bytes, cpu.jobs, cpu.random_ms) == (4 << 20, 1, 50)
    gpu = storage.Config.for_level("standard", torch.device("cuda", 0), "shared", "/x")
    assert gpu.file_bytes * gpu.jobs == 4 << 30 and (gpu.jobs, gpu.iodepth) == (4, 16)
    with pytest.raises(ValueError, match="multiple of 1 MiB"):
        storage.Config(tier="local", directory="/x", file_bytes=4096)
    with pytest.raises(ValueError, match="tier='nvme'"):
        storage.Config(tier="nvme", directory="/x")


def test_local_scratch_is_the_setting_then_tmpdir_then_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", "/scratch/tmp")
    assert storage.local_scratch("/nvme") == ("/nvme", "settings.local_scratch_dir")
    assert storage.local_scratch(None) == ("/scratch/tmp", "$TMPDIR")
    monkeypatch.delenv("TMPDIR")
    assert storage.local_scratch(None) == ("/tmp", "the default /tmp")


# ---- fio for real --------------------------------------------------------------------------------------------

@needs_fio
def test_a_corrupted_block_fails_the_read_back_for_real(tmp_path: Path) -> None:
    """The write steps, one block overwritten on disk, then the read step: fio's crc32c check catches it."""
    cfg = quick(tmp_path)
    storage.run_fio(cfg, str(tmp_path), False, "node-a", ("warmup", "write"))
    with (tmp_path / f"{storage.FILE_PREFIX}.0").open("r+b") as f:
        f.seek((1 << 20) + 100)
        f.write(os.urandom(64))
    with pytest.raises(WorkloadError) as info:
        storage.run_fio(cfg, str(tmp_path), False, "node-a", ("read",))
    assert str(info.value).startswith(f"the local tier at {tmp_path} on host node-a read back other data than fio "
                                      "wrote (crc32c verify")


@needs_fio
def test_fio_refusing_its_job_is_named_with_where(tmp_path: Path) -> None:
    """fio that cannot run its job file (here: a read of files never written, in a directory that is not there)."""
    cfg = quick(tmp_path)
    with pytest.raises(WorkloadError) as info:
        storage.run_fio(cfg, str(tmp_path / "gone"), False, "node-a", ("read",))
    assert str(info.value).startswith(f"fio on the local tier at {tmp_path / 'gone'} on host node-a exited 1")


def test_fio_missing_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert storage.fio_program() is None
    with pytest.raises(WorkloadError, match=r"^fio is not installed \(Debian and Ubuntu: apt-get install fio"):
        storage.measure(quick(tmp_path), "node-a")
    assert list(tmp_path.iterdir()) == []
    assert skip_facts.fact("package_missing", package="fio") == {"fact": "package_missing", "package": "fio"}
    test = manifest.shipped().get("acceptance/test_storage.py::test_local_scratch_fio")
    assert test is not None and test.earns("package_missing", "gpu", "quick")


@needs_fio
def test_a_filesystem_refusing_o_direct_runs_buffered_and_says_so(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """tmpfs before Linux 6.6 and ramfs answer O_DIRECT with EINVAL (this kernel's tmpfs takes it): the probe's
    open answers so here, and fio then runs buffered for real."""
    real_open = os.open

    def refusing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(storage.os, "open", refusing)
    got = storage.measure(quick(tmp_path), "node-a")
    assert got["io"] == "buffered: O_DIRECT refused on open (Invalid argument) (figures include the page cache)"
    assert "--direct=0" in got["command"] and got["steps"]["read"]["read_bytes_per_s"] > 0
    assert list(tmp_path.iterdir()) == []


def test_a_full_tier_is_named_before_fio_runs(tmp_path: Path) -> None:
    cfg = storage.Config(tier="shared", directory=str(tmp_path), file_bytes=1 << 50, jobs=1)
    with pytest.raises(WorkloadError, match=rf"^the shared tier at {tmp_path} on host node-a has .* GiB free"):
        storage.measure(cfg, "node-a")


@needs_fio
def test_run_measures_a_tier_with_fio_records_the_nodes_figures_and_leaves_nothing(tmp_path: Path,
                                                                                    gloo_world: None) -> None:
    result = storage.run(quick(tmp_path, "shared"))
    assert [(m.name, m.unit, m.scope) for m in result.metrics] == [
        ("storage_shared_write_gibps", "GiB/s", "node"), ("storage_shared_read_gibps", "GiB/s", "node"),
        ("storage_shared_randread_iops", "IOPS", "node")]
    assert all(m.value > 0 for m in result.metrics)
    [node] = result.details["per_node"]
    assert node["host"] == socket.gethostname() and node["tier"] == "shared" and node["path"] == str(tmp_path)
    assert node["mount"]["source"] and (node["io"] == "direct" or node["io"].startswith("buffered: O_DIRECT refused"))
    assert "--verify=crc32c" in node["command"] and "--ramp_time=10ms" in node["command"]
    assert result.metric("storage_shared_read_gibps").value * storage.GIB == node["steps"]["read"]["read_bytes_per_s"]
    assert list(tmp_path.iterdir()) == []  # fio's directory is gone


def test_nvme_devices_are_namespaces_not_paths_or_partitions(tmp_path: Path) -> None:
    for name in ("nvme0n1", "nvme1n1", "nvme1c1n1", "sda", "vda"):
        (tmp_path / "sys/block" / name).mkdir(parents=True)
    for name in ("nvme0", "nvme1"):
        (tmp_path / "sys/class/nvme" / name).mkdir(parents=True)
    assert storage.nvme_devices(tmp_path) == {"namespaces": ["nvme0n1", "nvme1n1"], "controllers": ["nvme0", "nvme1"]}
    assert storage.nvme_devices(tmp_path / "none") == {"namespaces": [], "controllers": []}


# ---- the shared node run (README's command 1) ---------------------------------------------------------------

def _test(results: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in results["tests"] if t["nodeid"] == f"acceptance/test_storage.py::{name}")


@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_the_node_run_records_the_storage_figures(node_run: Path) -> None:  # noqa: F811
    results = json.loads((node_run / "results.json").read_text())
    local = _test(results, "test_local_scratch_fio")
    if shutil.which("fio") is None:
        assert local["skip_fact"] == {"fact": "package_missing", "package": "fio"}
        return
    assert local["outcome"] == "passed"
    figures = {m["name"]: m for m in local["metrics"]}
    assert sorted(figures) == ["storage_local_randread_iops", "storage_local_read_gibps", "storage_local_write_gibps"]
    assert all(m["passed"] and m["value"] > 0 and m["criterion"]["source"] == "measured" for m in figures.values())
    assert _test(results, "test_shared_dir_fio")["skip_fact"] == {"fact": "no_shared_dir"}  # the run names none
    [nvme] = _test(results, "test_nvme_count")["metrics"]
    assert nvme["name"] == "nvme_device_count" and nvme["value"] == len(storage.nvme_devices()["namespaces"])
