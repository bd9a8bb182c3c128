"""DCGM's JSON (DCGM 4 and DCGM 3 layouts, from tests/data/dcgm) parsed into one result per test and GPU,
and ``dcgmi`` run as a child process: a stand-in dcgmi on PATH prints the captured JSON."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from workloads.gpu import dcgm

DATA = Path(__file__).parents[1] / "data/dcgm"


def test_dcgm4_results_keep_dcgms_words_and_gpus() -> None:
    report = dcgm.parse((DATA / "diag-r3-dcgm4-h100x4.json").read_text())
    assert report.version == "4.1.1" and report.serials[1] == "1652923017002" and report.runtime_error is None
    assert {r.test for r in report.results} == {"software", "pcie", "memory", "diagnostic", "eud", "targeted_stress",
                                                "targeted_power", "memory_bandwidth"}
    bad = {(r.test, r.gpu): r for r in report.results if r.status == "fail"}
    assert set(bad) == {("software", 2), ("memory", 1), ("targeted_power", 3)}
    assert bad["memory", 1].messages() == ["Found 3 faulty memory elements on GPU 1 (DCGM error 52, severity ISOLATE)"]
    assert bad["memory", 1].fault_category() == "memtest"
    assert bad["targeted_power", 3].fault_category() == "thermal_power"
    [eud] = [r for r in report.results if r.test == "eud"]
    assert eud.status == "skip" and eud.messages() == ["EUD Test skipped: not running as root"]


def test_dcgm3_deployment_checks_count_as_software() -> None:
    report = dcgm.parse((DATA / "diag-r1-dcgm3.json").read_text())
    assert report.version == "3.3.9" and report.serials == {0: "1652923017001", 1: "1652923017002"}
    assert {r.test for r in report.results} == {"software"} and len(report.results) == 9
    [bad] = [r for r in report.results if r.status == "fail"]
    assert bad.gpu == 1 and bad.messages()[0].startswith("Persistence mode for GPU 1 is disabled")


def test_names_and_buckets() -> None:
    assert dcgm.canonical("GPU Memory", "Hardware") == "memory"
    assert dcgm.canonical("Targeted Power", "Stress") == "targeted_power"
    assert dcgm.canonical("Inforom", "Deployment") == "software"
    assert dcgm.bucket("memory") == "memory" and dcgm.bucket("sm_stress") == dcgm.OTHER
    assert dcgm.LEVEL_OF["software"] == 1 and dcgm.LEVEL_OF["pcie"] == 2 and dcgm.LEVEL_OF["targeted_power"] == 3


def test_not_json_is_a_clear_error() -> None:
    with pytest.raises(dcgm.DcgmError, match="no valid JSON"):
        dcgm.parse("Error: something\n{not json")
    assert dcgm.parse((DATA / "diag-runtime-error.json").read_text()).runtime_error.startswith("Error: Diagnostic")


def _stand_in(tmp_path: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "dcgmi"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")


def _finish(run: dcgm.DiagRun) -> tuple:
    while not run.done():
        time.sleep(0.02)
    return run.report()


def test_run_parses_what_dcgmi_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path, f'echo "$@" > {tmp_path}/args\ncat {DATA}/diag-r3-dcgm4-h100x4.json\nexit 226\n', monkeypatch)
    report, absent, failure = _finish(dcgm.DiagRun(3, [0, 1, 2, 3]).start())
    assert absent is None and failure is None and len(report.results) == 29
    assert (tmp_path / "args").read_text().split() == ["diag", "-r", "3", "-j", "-i", "0,1,2,3"]


def test_absent_dcgm_and_unreachable_host_engine_are_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    _, absent, _ = _finish(dcgm.DiagRun(1).start())
    assert absent.startswith("dcgmi not found on PATH")
    _stand_in(tmp_path, 'echo "Error: unable to establish a connection to the specified host: localhost"\n'
                        'echo "Error: Unable to connect to host engine. Host engine connection invalid/disconnected."'
                        "\nexit 255\n", monkeypatch)
    report, absent, failure = _finish(dcgm.DiagRun(1).start())
    assert report is None and failure is None and "host engine is not reachable" in absent


def test_garbage_from_dcgmi_is_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path, "echo segfault\nexit 139\n", monkeypatch)
    _, absent, failure = _finish(dcgm.DiagRun(2).start())
    assert absent is None and "exited 139" in failure and "segfault" in failure


def test_a_run_past_its_limit_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path, "sleep 30\n", monkeypatch)
    _, _, failure = _finish(dcgm.DiagRun(1, timeout_s=0.5).start())
    assert failure == "dcgmi diag -r 1 -j ran past 0.5 s and was stopped"


def _level4(severity: object = 2, status: str = "Pass") -> dict:
    """A DCGM 4 report of run level 4 on two GPUs: memtest passed on GPU 0; GPU 1's result has ``status`` with
    one error of ``severity`` (DCGM issue #284's pattern: a 'Pass' that carries an ISOLATE error)."""
    error = {"error_category": 10, "error_id": 52, "error_severity": severity,
             "warning": "Found 1 uncorrectable memory error on GPU 1"}
    return {"DCGM Diagnostic": {"test_categories": [
        {"category": "Stress", "tests": [
            {"name": "memtest", "results": [
                {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
                {"entity_group": "GPU", "entity_id": 1, "status": status, "warnings": [error]}]},
            {"name": "pulse_test", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
                                               {"entity_group": "GPU", "entity_id": 1, "status": "Pass"}]}]}]},
        "metadata": {"version": "4.2.3"}}


def test_level_4_adds_memtest_and_pulse_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert dcgm.LEVEL_OF["memtest"] == 4 and dcgm.LEVEL_OF["pulse_test"] == 4
    assert dcgm.bucket("memtest") == "memtest" and dcgm.canonical("Pulse Test", "Stress") == "pulse_test"
    (tmp_path / "r4.json").write_text(json.dumps(_level4(severity=1)))
    _stand_in(tmp_path, f'echo "$@" > {tmp_path}/args\ncat {tmp_path}/r4.json\n', monkeypatch)
    report, absent, failure = _finish(dcgm.DiagRun(4, [0, 1]).start())
    assert absent is None and failure is None
    assert (tmp_path / "args").read_text().split() == ["diag", "-r", "4", "-j", "-i", "0,1"]
    assert {(r.test, r.gpu, r.verdict()) for r in report.results} == {
        ("memtest", 0, "pass"), ("memtest", 1, "pass"), ("pulse_test", 0, "pass"), ("pulse_test", 1, "pass")}
    with pytest.raises(ValueError, match="run level 5"):
        dcgm.DiagRun(5)


@pytest.mark.parametrize("severity", [2, 6, "ISOLATE", "DCGM_ERROR_RESET"])
@pytest.mark.parametrize("status", ["Pass", "Skip", "Warn"])
def test_a_pass_with_an_isolate_or_reset_error_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     severity: object, status: str) -> None:
    (tmp_path / "r4.json").write_text(json.dumps(_level4(severity, status)))
    _stand_in(tmp_path, f"cat {tmp_path}/r4.json\n", monkeypatch)
    report, _, failure = _finish(dcgm.DiagRun(4).start())
    assert failure is None
    [gpu1] = [r for r in report.results if r.test == "memtest" and r.gpu == 1]
    assert gpu1.status == status.lower() and gpu1.verdict() == "fail"
    assert dcgm.severity_name(gpu1.severe()[0]["error_severity"]) in ("ISOLATE", "RESET")
    assert gpu1.messages() == [f"Found 1 uncorrectable memory error on GPU 1 (DCGM error 52, severity "
                               f"{dcgm.severity_name(severity)})"]
    assert all(r.verdict() == "pass" for r in report.results if r is not gpu1)


@pytest.mark.parametrize("severity", [None, 0, 1, 4, 5, "MONITOR"])
def test_a_pass_with_a_milder_error_stays_a_pass(severity: object) -> None:
    [gpu1] = [r for r in dcgm.parse(json.dumps(_level4(severity))).results if r.test == "memtest" and r.gpu == 1]
    assert gpu1.verdict() == "pass"


def test_output_past_a_pipes_buffer_is_read_while_dcgmi_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A level-3 report of 8 GPUs with verbose info runs to hundreds of KB; a pipe holds 64 KB. Read only at
    the end, dcgmi would block writing and be stopped as 'ran past' its limit (the bug this guards)."""
    big = _level4(severity=1)
    big["DCGM Diagnostic"]["test_categories"][0]["tests"][1]["results"][0]["info"] = ["x" * 100] * 2500
    (tmp_path / "big.json").write_text(json.dumps(big))
    assert (tmp_path / "big.json").stat().st_size > 211_000
    _stand_in(tmp_path, f"cat {tmp_path}/big.json\nhead -c 300000 /dev/zero | tr '\\0' e >&2\n", monkeypatch)
    # timeout_s: a hang guard. Before the fix dcgmi blocked on the full pipe until this limit stopped it.
    report, absent, failure = _finish(dcgm.DiagRun(3, timeout_s=60).start())
    assert failure is None and absent is None, failure
    assert len(report.results) == 4 and len(report.results[2].info) == 2500


# Loaded with -p before collection: lets acceptance/test_dcgm.py run on CPU ranks (it skips there otherwise), with
# short waits, so the whole path runs: one dcgmi per node, every rank waiting, rank 0's heartbeat, the verdict.
CPU_DCGM = """
import acceptance.test_dcgm as t
t.require_device = lambda cg, gpu_only=False: None
t.POLL_S = 0.1
t.HEARTBEAT_S = 0.2
"""


@pytest.mark.slow  # a torchrun job of 2 ranks
def test_the_acceptance_test_fails_a_pass_with_an_isolate_error(tmp_path: Path) -> None:
    from torchrun_job import ROOT, run_job

    (tmp_path / "r4.json").write_text(json.dumps(_level4(severity=2)))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dcgmi").write_text(f"#!/bin/sh\nsleep 1\ncat {tmp_path}/r4.json\n")
    (fake / "dcgmi").chmod(0o755)
    (tmp_path / "cpu_dcgm.py").write_text(CPU_DCGM)
    job = run_job(tmp_path, [str(ROOT / "acceptance" / "test_dcgm.py"), "--rootdir", str(ROOT), "-p", "cpu_dcgm",
                             "--dcgm-diag", "4", "-k", "memtest or pulse_test"],
                  env={"PATH": f"{fake}:{os.environ['PATH']}",
                       "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}, timeout=300)
    tests = {t["nodeid"].split("[")[1].rstrip("]"): t for t in job.results["tests"]}
    assert tests["pulse_test"]["outcome"] == "passed", job.output[-3000:]
    memtest = tests["memtest"]
    assert memtest["outcome"] == "failed" and memtest["failed_ranks"] == [0], job.output[-3000:]
    assert "DCGM memtest FAIL: DCGM said PASS, with an error of severity ISOLATE: Found 1 uncorrectable memory " \
           "error on GPU 1 (DCGM error 52, severity ISOLATE)" in memtest["message"]
    [row] = [r for r in memtest["details"]["dcgm"] if r["dcgm_gpu"] == 1]
    assert row["status"] == "fail" and row["dcgm_status"] == "pass"
    assert "heartbeat: dcgmi diag -r 4: 0/1 nodes finished (0%)" in job.output
