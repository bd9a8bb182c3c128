"""The plugin through pytester, world size 1: options, judging, outputs, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchrun_job import ROOT, job_env

THRESHOLDS = """
schema: 1
fallback_profile: cpu
cpu_profile: cpu
profiles:
  cpu:
    settings: {gpus_per_node: 0, test_timeout_s: 60, collective_timeout_s: 30}
    metrics:
      speed_gbps: {min: 10, unit: GB/s}
      free_figure: {}
      hoped_gbps: {min: 10, unit: GB/s, severity: warn, source: estimate}
  nocriteria:
    sign_off: false
    metrics: {speed_gbps: {}, free_figure: {}, hoped_gbps: {}}
"""

METRIC_TESTS = """
import pytest

@pytest.mark.metrics("speed_gbps")
def test_fast(cg):
    cg.record("speed_gbps", 12.5, "GB/s")

@pytest.mark.metrics("speed_gbps", "free_figure")
def test_slow(cg):
    cg.record("speed_gbps", 3.25, "GB/s", description="planted slow figure")
    cg.record("free_figure", 1.0, "things", scope="world")
"""


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    pytester.makefile(".yaml", thresholds=THRESHOLDS)

    def _run(*args: str) -> tuple[pytest.RunResult, Path]:
        report = pytester.path / "report"
        result = pytester.runpytest_subprocess(
            "-p", "clustergate", "-p", "no:cacheprovider",
            "--thresholds", "thresholds.yaml",
            "--report-dir", str(report), *args)
        return result, report

    return _run


def results(report: Path) -> dict:
    return json.loads((report / "results.json").read_text())


def test_metrics_are_judged_and_failures_name_value_criterion_and_place(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_metrics=METRIC_TESTS)
    result, report = run()
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*1 metric check failed:*",
        "*speed_gbps=3.25 GB/s, expected >= 10 [[]cpu, rank 0 *]*",
        "REJECT*profile cpu*",
        "*speed_gbps*3.25 GB/s*>= 10*FAIL*worst rank 0*",
    ])
    res = results(report)
    assert res["schema"] == 1 and res["verdict"] == "reject" and res["profile"] == "cpu"
    slow = next(t for t in res["tests"] if t["nodeid"].endswith("test_slow"))
    speed = next(m for m in slow["metrics"] if m["name"] == "speed_gbps")
    assert speed["value"] == 3.25 and not speed["passed"]
    assert speed["criterion"] == {"min": 10.0, "unit": "GB/s", "severity": "fail"}
    assert speed["per_rank"][0]["rank"] == 0 and speed["per_rank"][0]["host"]
    assert {p.name for p in report.iterdir()} >= {"results.json", "report.html", "junit.xml", "progress.jsonl"}
    events = [json.loads(line)["event"] for line in (report / "progress.jsonl").read_text().splitlines()]
    assert events == ["session_start", "test_start", "test_end", "test_start", "test_end", "session_end"]


def test_a_missed_warn_criterion_is_listed_and_the_verdict_stands(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
import pytest

@pytest.mark.metrics("speed_gbps", "hoped_gbps")
def test_fine(cg):
    cg.record("speed_gbps", 12.5, "GB/s")
    cg.record("hoped_gbps", 3.25, "GB/s")
""")
    result, report = run()
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "ACCEPT*profile cpu*",
        "*hoped_gbps*3.25 GB/s*>= 10*estimate*WARN*1/1 GPU warn; worst rank 0*",
        "warnings: 1 (a warn criterion missed; the verdict does not use them)",
        "  WARN hoped_gbps = 3.25 (>= 10) at rank 0 *",
    ])
    res = results(report)
    assert res["verdict"] == "accept" and [t["outcome"] for t in res["tests"]] == ["passed"]
    [warning] = res["warnings"]
    assert warning["test"].endswith("test_fine") and warning["metric"] == "hoped_gbps"
    assert warning["value"] == 3.25 and warning["criterion"] == ">= 10" and warning["where"].startswith("rank 0 ")
    hoped = next(m for m in res["tests"][0]["metrics"] if m["name"] == "hoped_gbps")
    assert hoped["passed"] and hoped["warned"] and hoped["per_rank"][0]["warned"]
    assert hoped["criterion"] == {"min": 10.0, "unit": "GB/s", "severity": "warn", "source": "estimate"}
    page = (report / "report.html").read_text()
    assert "1 warning (a warn criterion missed; the verdict does not use them): hoped_gbps" in page
    assert 'class="cg-warn">WARN<' in page and 'class="cg-source">estimate<' in page


def test_profile_without_criteria_accepts_and_says_so(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_metrics=METRIC_TESTS)
    result, report = run("--profile", "nocriteria")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*has no sign-off criteria*"])
    assert results(report)["sign_off"] is False


def test_undeclared_metric_fails_the_test(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_sneaky(cg):\n    cg.record('speed_gbps', 99, 'GB/s')\n")
    result, report = run()
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*records 'speed_gbps' but does not declare it*"])


def test_declared_metric_absent_from_profile_stops_before_any_test(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.metrics('warp_speed')\ndef test_x(cg):\n    pass\n")
    result, _ = run()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*thresholds.yaml: profile 'cpu' has no metrics.warp_speed, which "
                                 "test_*::test_x records; add it*"])


def test_declared_but_unrecorded_metric_fails(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.metrics('speed_gbps')\ndef test_lazy(cg):\n    pass\n")
    result, _ = run()
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*declared metrics never recorded: speed_gbps*"])


@pytest.mark.parametrize(("args", "message"), [
    (("--profile", "h900"), "*no profile 'h900'; profiles are: cpu, nocriteria*"),
    (("-n", "2"), "*do not combine it with pytest-xdist*"),
    (("--level", "ludicrous"), "*invalid choice: 'ludicrous'*"),
])
def test_bad_options_are_usage_errors(run, pytester: pytest.Pytester, args: tuple[str, ...], message: str) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result, _ = run(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_no_tests_is_exit_5_and_a_reject(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def helper():\n    pass\n")
    result, report = run()
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    res = results(report)
    assert res["verdict"] == "reject" and "no tests ran" in res["error"]


def test_multinode_tests_skip_on_one_node(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\ndef test_a():\n    pass\n@pytest.mark.multinode\ndef test_b():\n    pass\n")
    result, report = run("-rs")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*needs 2+ nodes; this job has 1*"])
    assert [t["outcome"] for t in results(report)["tests"]] == ["passed", "skipped"]


def test_shipped_acceptance_suite_passes_on_cpu(monkeypatch: pytest.MonkeyPatch, pytester: pytest.Pytester) -> None:
    """The world checks of the real suite, world size 1, cpu profile."""
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    report = pytester.path / "report"
    result = pytester.runpytest_subprocess(str(ROOT / "acceptance" / "test_world.py"), "--rootdir", str(ROOT),
                                           "-p", "no:cacheprovider", "--report-dir", str(report))
    assert result.ret == 0, result.stdout.str()
    assert results(report)["verdict"] == "accept"


def _installed_entry_point() -> bool:
    from importlib.metadata import entry_points

    return any(e.name == "clustergate" for e in entry_points(group="pytest11"))


def test_the_plugin_goes_by_one_name_and_no_clustergate_turns_it_off(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded the checkout's way (a conftest naming it), and blocked by that one name."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert declared == {"clustergate": "clustergate"}
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makefile(".yaml", thresholds=THRESHOLDS)
    pytester.makepyfile("def test_x(cg):\n    assert cg.world_size == 1\n")
    on = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--thresholds", "thresholds.yaml",
                                       "--report-dir", str(pytester.path / "report"))
    assert on.ret == 0, on.stdout.str()
    assert results(pytester.path / "report")["verdict"] == "accept"
    off = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:clustergate")
    assert off.ret == 1
    off.stdout.fnmatch_lines(["*fixture 'cg' not found*"])
    assert "clustergate summary" not in off.stdout.str()


@pytest.mark.skipif(not _installed_entry_point(), reason="clustergate is not installed with its pytest11 entry "
                                                         "point here (pip install -e . registers it)")
def test_the_installed_plugin_loads_by_name_without_a_conftest(pytester: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    pytester.makefile(".yaml", thresholds=THRESHOLDS)
    pytester.makepyfile("def test_x(cg):\n    assert cg.world_size == 1\n")
    on = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--thresholds", "thresholds.yaml",
                                       "--report-dir", str(pytester.path / "report"))
    assert on.ret == 0, on.stdout.str()
    off = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:clustergate")
    off.stdout.fnmatch_lines(["*fixture 'cg' not found*"])
