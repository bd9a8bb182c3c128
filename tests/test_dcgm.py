"""DCGM's JSON (DCGM 4 and DCGM 3 layouts, from tests/data/dcgm) parsed into one result per test and GPU,
and ``dcgmi`` run as a child process: a stand-in dcgmi on PATH prints the captured JSON."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from workloads.gpu import dcgm

DATA = Path(__file__).parent / "data/dcgm"


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
        pass
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
