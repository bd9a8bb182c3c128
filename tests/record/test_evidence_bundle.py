"""The evidence bundle of an excluded host (clustergate.record.evidence_bundle): one .tar.gz with the node run's
files, its XID lines, nvidia-smi -q, the profile it was judged by, what to do; and nothing read or written
through a link planted in the node's directory or the output's."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from fleet_data import HOST, SERIALS, later, real_run, write

from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.record.evidence_bundle import BundleError, build

CPU = load(shipped_thresholds()).profile("cpu")

XID = "NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def failing_run() -> dict[str, Any]:
    """The real run, its GPU 1 lost: a critical XID recorded by the XID test, and one in the kernel log before."""
    run = later(real_run(), "2027-01-01T00:00:00+00:00")
    run["hardware_inventory"] = {"gpus": [], "nodes": [{"host": HOST, "node_rank": 0, "kernel_log": "/dev/kmsg",
                                                        "xids_before_run": [{"marker": 11.0, "bus_id": "0000:18:00.0",
                                                                             "code": 63, "text": "NVRM: Xid 63 ..."}]}]}
    xid_test = "acceptance/test_errors_after.py::test_no_xid_errors_during_run"
    run["tests"] = [t for t in run["tests"] if t["nodeid"] != xid_test]  # skipped in the recorded run: it failed here
    run["tests"].append({
        "nodeid": xid_test, "outcome": "failed", "phases": ["setup", "call", "teardown"],
        "duration_s": 1.0, "failed_ranks": [1], "message": "XIDs during the run: ...", "problems": [], "metrics": [],
        "details": {"evidence": [{"metric": "xid_critical_events", "category": "gpu_off_bus", "status": "fail",
                                  "where": f"rank 1 {HOST} gpu 1 serial {SERIALS[1]}", "label": "gpu 1",
                                  "evidence": [f"XID 79 (GPU has fallen off the bus) [kernel log]: {XID}"]}]}})
    run["verdict"], run["reason"] = "reject", "1 of 4 tests did not pass"
    run["clustergate"]["thresholds_digest"] = CPU.run_digest  # as a run under today's shipped profile records
    return run


@pytest.fixture
def node_dir(tmp_path: Path) -> Path:
    d = write(tmp_path / "nodes" / HOST, failing_run()).parent
    (d / "report.html").write_text("<html>the node's report</html>\n")
    (d / "progress.jsonl").write_text('{"test": "a", "phase": "start"}\n')
    (d / "nvidia-smi-q.txt").write_text("==============NVSMI LOG==============\nSerial Number : 1652823054301\n")
    return d


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_bundle_holds_what_a_vendor_ticket_needs(node_dir: Path, tmp_path: Path) -> None:
    out = build(node_dir, tmp_path)
    assert out == tmp_path / f"evidence-{HOST}.tar.gz" and out.is_file()
    got = members(out)
    names = sorted(n.split("/", 1)[1] for n in got)
    assert all(n.startswith(f"{HOST}/") for n in got)
    assert names == sorted(["results.json", "report.html", "progress.jsonl", "nvidia-smi-q.txt", "xid-lines.txt",
                            "profile.json", "summary.txt", "MANIFEST.json"])
    assert got[f"{HOST}/results.json"] == (node_dir / "results.json").read_bytes()
    assert got[f"{HOST}/nvidia-smi-q.txt"] == (node_dir / "nvidia-smi-q.txt").read_bytes()
    xids = got[f"{HOST}/xid-lines.txt"].decode()
    assert "before the run (/dev/kmsg): 1 XID line(s)\n  NVRM: Xid 63 ..." in xids
    assert f"rank 1 {HOST} gpu 1 serial {SERIALS[1]}: XID 79 (GPU has fallen off the bus) [kernel log]: {XID}" in xids
    profile = json.loads(got[f"{HOST}/profile.json"])
    assert profile["name"] == "cpu" and profile["digest_matches"] is True  # the shipped profile judged it
    assert profile["metrics"]["matmul_bf16_tflops"] == CPU.metrics["matmul_bf16_tflops"].as_json()
    summary = got[f"{HOST}/summary.txt"].decode()
    assert f"Host {HOST}\nverdict reject: 1 of 4 tests did not pass" in summary
    assert f"  1  {SERIALS[1]}  GPU-5c1f0e7a-3b2d-4c11-9e2a-000000000001  00000000:2A:00.0  NVIDIA H100 80GB HBM3" \
        in summary
    assert f"  isolate: the GPU fell off the PCIe bus [rank 1 {HOST} gpu 1 serial {SERIALS[1]}]: reseat" in summary
    manifest = json.loads(got[f"{HOST}/MANIFEST.json"])
    assert manifest["action"] == "isolate" and manifest["steps"][0]["category"] == "gpu_off_bus"
    assert manifest["absent"] == [{"name": "junit.xml", "why": "not in the node's directory"}]
    for f in manifest["files"]:
        assert hashlib.sha256(got[f"{HOST}/{f['name']}"]).hexdigest() == f["sha256"]


def test_a_hang_is_in_the_bundle_for_reading(tmp_path: Path) -> None:
    """A run that ended on a rank that stopped making progress: its evidence (results.json's hang) in hang.txt."""
    run = failing_run()
    run["hang"] = {"kind": "silent", "culprits": [1], "found_by": 0, "source": "nccl flight recorder",
                   "cause": "rank 1 (gpu07) stopped making progress during t.py::test_a [call]",
                   "collective": {"group": "the workloads' group", "seq": 12, "op": "nccl:all_reduce", "joined": [0],
                                  "missing": [1]},
                   "ranks": [{"rank": 0, "host": HOST, "stage": "testing", "test": "t.py::test_a", "phase": "call",
                              "main": "t.py:9 in test_a", "wait": ["0", 12, 17.0], "process_state": "S",
                              "stack": "Main thread (most recent call last):\n  File \"t.py\", line 9"},
                             {"rank": 1, "host": HOST, "stack": None, "process_state": "T"}]}
    node = write(tmp_path / "nodes" / HOST, run).parent
    text = members(build(node, tmp_path))[f"{HOST}/hang.txt"].decode()
    assert text.startswith("rank 1 (gpu07) stopped making progress during t.py::test_a [call]\n")
    assert "Collective 12 (nccl:all_reduce) of the workloads' group: joined by ranks [0], not by [1]" in text
    assert 'File "t.py", line 9' in text and "process state T" in text
    assert "(no stack: the rank could not answer)" in text


def test_the_profile_comes_from_the_thresholds_the_run_was_held_to(node_dir: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(shipped_thresholds().read_text())
    data["profiles"]["cpu"]["metrics"]["matmul_bf16_tflops"]["severity"] = "warn"  # a site's own judgement
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(data))
    profile = json.loads(members(build(node_dir, tmp_path, thresholds=site))[f"{HOST}/profile.json"])
    assert profile["thresholds"] == str(site) and profile["digest_matches"] is False
    assert profile["metrics"]["matmul_bf16_tflops"]["severity"] == "warn"


def test_a_planted_link_or_fifo_is_left_out_unread(node_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("do not ship me\n")
    (node_dir / "nvidia-smi-q.txt").unlink()
    (node_dir / "nvidia-smi-q.txt").symlink_to(secret)
    (node_dir / "report.html").unlink()
    os.mkfifo(node_dir / "report.html")  # opening a FIFO to read blocks until a writer comes: must not be opened so
    done: list[Path] = []
    worker = threading.Thread(target=lambda: done.append(build(node_dir, tmp_path)), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "building the bundle hung on the planted FIFO"
    got = members(done[0])
    assert all(b"do not ship me" not in data for data in got.values())
    absent = {a["name"]: a["why"] for a in json.loads(got[f"{HOST}/MANIFEST.json"])["absent"]}
    assert absent["nvidia-smi-q.txt"] == "a symbolic link in the node's directory: left out (no link is followed)"
    assert absent["report.html"] == "not a regular file: left out"


def test_the_archive_is_never_written_through_a_link(node_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    out = tmp_path / f"evidence-{HOST}.tar.gz"
    out.symlink_to(victim)
    assert build(node_dir, tmp_path) == out
    assert victim.read_text() == "keep\n" and not out.is_symlink() and tarfile.is_tarfile(out)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_node_without_results_still_gets_a_bundle(tmp_path: Path) -> None:
    d = tmp_path / "nodes" / "gpu09"
    d.mkdir(parents=True)
    (d / "progress.jsonl").write_text('{"test": "acceptance/test_world.py::test_allreduce_is_exact"}\n')
    got = members(build(d, tmp_path))
    manifest = json.loads(got["gpu09/MANIFEST.json"])
    assert manifest["action"] == "retest" and manifest["steps"][0]["category"] == "no_result"
    assert {a["name"] for a in manifest["absent"]} == {"results.json", "report.html", "junit.xml", "nvidia-smi-q.txt",
                                                       "profile.json"}
    assert "gpu09/progress.jsonl" in got and b"no results.json" in got["gpu09/summary.txt"]


def test_what_cannot_be_bundled_is_refused_naming_it(node_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="not a node's report directory"):
        build(tmp_path / "nowhere", tmp_path)
    link = tmp_path / "linked"
    link.symlink_to(node_dir)
    with pytest.raises(BundleError, match=r"linked: not a node's report directory \(a symbolic link"):
        build(link, tmp_path)
    with pytest.raises(BundleError, match="'../x' cannot name a host's bundle: it contains a path separator"):
        build(node_dir, tmp_path, host="../x")
    with pytest.raises(BundleError, match="not a directory; the bundle is written into an existing one"):
        build(node_dir, tmp_path / "missing")
