"""The plugin through pytester, world size 1: options, judging, outputs, refusals."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest
from complete_runs import NODE_TESTS
from forked_pytest import runpytest_forked

from clustergate.common.exit_codes import Exit

from torchrun_job import PLANTED_SUITE, ROOT, job_env

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
        result = runpytest_forked(
            pytester, "-p", "clustergate", "-p", "no:cacheprovider", *PLANTED_SUITE,
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
        "*hoped_gbps*3.25 GB/s*>= 10*estimate*WARN*1/1 rank warn; worst rank 0*",
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


def test_profile_without_criteria_is_never_an_accept(run, pytester: pytest.Pytester) -> None:
    """Every test passes, but a profile without criteria judged nothing: the verdict says it is not
    a sign-off, the terminal never prints ACCEPT and the exit status is not 0."""
    pytester.makepyfile(test_metrics=METRIC_TESTS)
    result, report = run("--profile", "nocriteria")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["NOT A SIGN-OFF   profile nocriteria*", "*has no sign-off criteria*"])
    assert "ACCEPT" not in result.stdout.str()
    res = results(report)
    assert res["sign_off"] is False and res["verdict"] == "unjudged" and "not a sign-off" in res["reason"]
    assert 'class="cg-verdict">NOT A SIGN-OFF<' in (report / "report.html").read_text()


def test_undeclared_metric_fails_the_test(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_sneaky(cg):\n    cg.record('speed_gbps', 99, 'GB/s')\n")
    result, report = run()
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*records 'speed_gbps' but does not declare it*"])


def test_declared_metric_absent_from_profile_stops_before_any_test(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.metrics('warp_speed')\ndef test_x(cg):\n    pass\n")
    result, report = run()
    assert result.ret == Exit.USAGE
    result.stderr.fnmatch_lines(["*thresholds.yaml: profile 'cpu' has no metrics.warp_speed, which "
                                 "test_*::test_x records; add it*"])
    res = results(report)  # the reason is the missing metric, not "no tests ran"
    assert res["verdict"] == "reject" and "has no metrics.warp_speed" in res["error"]


def test_declared_but_unrecorded_metric_fails(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\n@pytest.mark.metrics('speed_gbps')\ndef test_lazy(cg):\n    pass\n")
    result, _ = run()
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*declared metrics never recorded: speed_gbps*"])


@pytest.mark.parametrize(("args", "message"), [
    (("--profile", "h900"), "*no profile 'h900'; profiles are: cpu, nocriteria*"),
    (("-p", "xdist", "-n", "2"), "*do not combine it with pytest-xdist*"),  # autoload is off: xdist named
    (("--level", "ludicrous"), "*invalid choice: 'ludicrous'*"),
    (("--test-timeout", "0"), "*--test-timeout 0.0: a time limit must be a finite number of seconds above 0*"),
    (("--test-timeout", "-5"), "*--test-timeout -5.0: a time limit must be a finite number*"),
    (("--test-timeout", "nan"), "*--test-timeout nan: a time limit must be a finite number*"),
    (("--collective-timeout", "inf"), "*--collective-timeout inf: a time limit must be a finite number*"),
    (("-p", "no:junitxml"), "*the run needs pytest's junitxml (junit.xml), which is disabled (-p no:junitxml*"),
    (("-p", "no:html"), "*the run needs pytest-html (report.html), which is disabled (-p no:html*"),
    (("-p", "no:metadata"), "*the run needs pytest-metadata (the report's environment), which is disabled*"),
])
def test_bad_options_are_usage_errors(run, pytester: pytest.Pytester, args: tuple[str, ...], message: str) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result, _ = run(*args)
    assert result.ret == Exit.USAGE
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(("marker", "message"), [
    ("time_limit(0)", "*test_*::test_x: @pytest.mark.time_limit(0): a time limit must be a finite*"),
    ("time_limit(5, levels=['fast'])", "*test_*::test_x: @pytest.mark.time_limit(5, *): the only keyword is levels, "
                                       "a list of some of quick, standard, extended*"),
])
def test_bad_time_limit_marker_is_a_usage_error_naming_the_test(run, pytester: pytest.Pytester, marker: str,
                                                                message: str) -> None:
    pytester.makepyfile(f"import pytest\n@pytest.mark.{marker}\ndef test_x():\n    pass\n")
    result, report = run()
    assert result.ret == Exit.USAGE
    result.stderr.fnmatch_lines([message])
    assert "time_limit(" in results(report)["error"]


LIMITED_TESTS = """
import pytest

@pytest.mark.time_limit(7)
def test_own_limit():
    pass

@pytest.mark.time_limit(3600, levels=["extended"])
def test_own_limit_at_extended():
    pass

def test_plain():
    pass
"""


@pytest.mark.parametrize(("args", "expected"), [
    ((), {"test_own_limit": (7, "marker"), "test_own_limit_at_extended": (60, "profile"),
          "test_plain": (60, "profile")}),
    (("--test-timeout", "30"), {"test_own_limit": (7, "marker"), "test_own_limit_at_extended": (30, "option"),
                                "test_plain": (30, "option")}),
    (("--level", "extended"), {"test_own_limit": (7, "marker"), "test_own_limit_at_extended": (3600, "marker"),
                               "test_plain": (60, "profile")}),
])
def test_each_test_s_limit_and_its_source_are_recorded(run, pytester: pytest.Pytester, args: tuple[str, ...],
                                                       expected: dict[str, tuple[float, str]]) -> None:
    """The test's own marker (at the levels it names), then --test-timeout, then the profile's test_timeout_s."""
    pytester.makepyfile(test_limits=LIMITED_TESTS)
    result, report = run(*args)
    assert result.ret == 0, result.stdout.str()
    limits = {t["nodeid"].split("::")[1]: t["limit"] for t in results(report)["tests"]}
    assert {name: (limit["seconds"], limit["source"]) for name, limit in limits.items()} == expected


@pytest.mark.parametrize(("baseline", "message"), [
    ({"schema": 1, "tests": [{"nodeid": "t::a", "metrics": [{"name": "speed_gbps", "value": "fast"}]}]},
     "*baseline.json: tests[[]0[]] (t::a) metric speed_gbps has value 'fast', not a finite number; pass*"),
    ({"schema": 1, "tests": [{"nodeid": "t::a", "metrics": [{"name": "speed_gbps", "value": 1.0,
                                                             "per_rank": [{"rank": 0, "value": None}]}]}]},
     "*baseline.json: tests[[]0[]] (t::a) metric speed_gbps has a per-rank entry*, not a rank with a finite number*"),
    ({"schema": 1, "verdict": "accept"}, "*baseline.json: not a clustergate results.json*"),
])
def test_bad_baseline_is_a_usage_error_before_any_test(run, pytester: pytest.Pytester, baseline: dict,
                                                        message: str) -> None:
    pytester.makepyfile(test_metrics=METRIC_TESTS)
    (pytester.path / "baseline.json").write_text(json.dumps(baseline))
    result, report = run("--baseline", "baseline.json")
    assert result.ret == Exit.USAGE
    result.stderr.fnmatch_lines([message])
    assert not (report / "progress.jsonl").exists() or "test_start" not in (report / "progress.jsonl").read_text()


def test_all_skipped_rejects_with_the_reason(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\ndef test_a():\n    pytest.skip('no GPU')\n"
                        "def test_b():\n    pytest.skip('no GPU')\n")
    result, report = run()
    assert result.ret == 1
    res = results(report)
    assert res["verdict"] == "reject" and res["error"] is None
    assert res["reason"] == "all 2 tests were skipped: nothing was measured, so nothing can be signed off"
    result.stdout.fnmatch_lines(["why: all 2 tests were skipped*"])


def test_collect_only_lists_the_tests_and_writes_no_report(run, pytester: pytest.Pytester) -> None:
    """A listing is not a run: it exits 0 and writes nothing a gate could read (no results.json, no report.html)."""
    pytester.makepyfile(test_metrics=METRIC_TESTS)
    result, report = run("--collect-only", "-q")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["test_metrics.py::test_fast", "test_metrics.py::test_slow"])
    assert not report.exists(), list(report.iterdir())
    assert "clustergate summary" not in result.stdout.str()


def test_selection_is_recorded_and_said(run, pytester: pytest.Pytester) -> None:
    """A run narrowed by -k passed what it ran, and ran less than its suite: partial, exit 1, never accept."""
    pytester.makepyfile(test_metrics=METRIC_TESTS)
    result, report = run("-k", "fast", "--level", "quick")
    assert result.ret == 1
    res = results(report)
    assert res["selection"] == {"k": "fast", "m": None, "level": "quick", "selected": 1, "deselected": 1,
                                "multinode": 0, "multinode_deselected": 0, "suite": ".",
                                "args": [str(pytester.path)], "deselect": [], "modes": [], "maxfail": 0}
    assert res["verdict"] == "partial" and [t["outcome"] for t in res["tests"]] == ["passed"]
    assert res["reason"].startswith("ran less than a complete run: 1 of the 2 tests of a complete node run did not "
                                    "run (-k 'fast'): test_slow")
    result.stdout.fnmatch_lines(["PARTIAL*profile cpu*", "1 of 2 tests selected (-k 'fast', level quick)"])
    assert "1 of 2 tests selected (-k &#x27;fast&#x27;, level quick)" in (report / "report.html").read_text()


def test_stopped_early_is_a_reject_saying_how_far_it_got(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a():\n    assert False\ndef test_b():\n    pass\n")
    result, report = run("-x")
    assert result.ret == 1
    assert results(report)["verdict"] == "reject"
    assert results(report)["error"].startswith("the run stopped after 1 of 2 selected tests")


@pytest.mark.parametrize(("body", "status", "error"), [
    ("raise KeyboardInterrupt", Exit.NOT_ACCEPTED,
     "KeyboardInterrupt on rank 0 (*) during test_*::test_stops [[]call[]]"),
    ("pytest.exit('planted stop')", Exit.NOT_ACCEPTED,
     "pytest.exit('planted stop') on rank 0 (*) during test_*::test_stops [[]call[]]"),
])
def test_a_session_stopped_by_a_test_rejects_saying_where(run, pytester: pytest.Pytester, body: str,
                                                          status: int, error: str) -> None:
    pytester.makepyfile(f"import pytest\ndef test_stops():\n    {body}\ndef test_b():\n    pass\n")
    result, report = run()
    assert result.ret == status
    res = results(report)
    assert res["verdict"] == "reject" and fnmatch.fnmatch(res["error"], error), res["error"]


def test_internal_error_rejects_naming_rank_and_step(run, pytester: pytest.Pytester) -> None:
    pytester.makeconftest("def pytest_runtest_logfinish(nodeid):\n    raise RuntimeError('planted crash')\n")
    pytester.makepyfile("def test_a():\n    pass\ndef test_b():\n    pass\n")
    result, report = run()
    assert result.ret == Exit.NOT_ACCEPTED  # pytest's 3 never leaves a clustergate run
    res = results(report)
    assert res["verdict"] == "reject"
    assert fnmatch.fnmatch(res["error"], "internal error on rank 0 (*) during test_*::test_a [[]after teardown[]]: "
                                         "RuntimeError: planted crash"), res["error"]


def test_an_output_that_cannot_be_written_rejects(run, pytester: pytest.Pytester) -> None:
    """pytest's JUnit writer fails at the end of the session (a directory where junit.xml goes): the run must not
    read as accepted, and says which output and why."""
    pytester.makepyfile("from pathlib import Path\n\n\ndef test_blocks_junit():\n"
                        "    (Path('report') / 'junit.xml').mkdir()\n")
    result, report = run()
    assert result.ret == Exit.NOT_ACCEPTED
    res = results(report)
    assert res["verdict"] == "reject" and [t["outcome"] for t in res["tests"]] == ["passed"]
    assert fnmatch.fnmatch(res["error"], "the end of the session failed on rank 0 (*): IsADirectoryError*junit.xml*"), \
        res["error"]


def test_no_tests_is_not_accepted_and_a_reject(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def helper():\n    pass\n")
    result, report = run()
    assert result.ret == Exit.NOT_ACCEPTED  # pytest's 5 never leaves a clustergate run
    res = results(report)
    assert res["verdict"] == "reject" and "no tests were collected" in res["error"]


def test_a_cg_skip_is_reported_where_the_test_skipped(run, pytester: pytest.Pytester) -> None:
    """pytest places a skip where it was raised: for cg.skip that was the recorder, the same line after every such
    test. It is the line of the test's file that led to it, and the reason alone, as pytest reports its own."""
    pytester.makepyfile(test_skips="def _needs_a_gpu(cg):\n"
                                   "    cg.skip('planted: no GPU here', fact=None)\n\n\n"
                                   "def test_direct(cg):\n"
                                   "    cg.skip('planted: not on this node', fact=None)\n\n\n"
                                   "def test_through_a_helper(cg):\n"
                                   "    _needs_a_gpu(cg)\n")
    result, _ = run("-rs")
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_skips.py:6: planted: not on this node"])
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_skips.py:2: planted: no GPU here"])
    assert "recorder.py" not in result.stdout.str() and "Skip:" not in result.stdout.str(), result.stdout.str()


def test_multinode_tests_skip_on_one_node(run, pytester: pytest.Pytester) -> None:
    pytester.makepyfile("import pytest\ndef test_a():\n    pass\n@pytest.mark.multinode\ndef test_b():\n    pass\n")
    result, report = run("-rs")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*needs 2+ nodes; this job has 1*"])
    assert [t["outcome"] for t in results(report)["tests"]] == ["passed", "skipped"]


def test_shipped_acceptance_suite_passes_on_cpu(monkeypatch: pytest.MonkeyPatch, pytester: pytest.Pytester) -> None:
    """The world checks of the real suite, world size 1, cpu profile: they pass, and a run of one file of the
    suite is partial (exit 1), naming what it left out."""
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    report = pytester.path / "report"
    path = str(ROOT / "acceptance" / "test_world.py")
    result = runpytest_forked(pytester, path, "--rootdir", str(ROOT), "-p", "no:cacheprovider",
                                           "--report-dir", str(report))
    assert result.ret == 1, result.stdout.str()
    res = results(report)
    assert [t["outcome"] for t in res["tests"]] == ["passed", "passed"] and res["verdict"] == "partial"
    assert f"{NODE_TESTS - 2} of the {NODE_TESTS} tests of a complete node run did not run (paths {path})" \
        in res["reason"]


def _installed_entry_point() -> bool:
    from importlib.metadata import entry_points

    # and no older install's entry point that loads the plugin itself in every run
    ours = {e.value for e in entry_points(group="pytest11") if e.value.split(".")[0] == "clustergate"}
    return ours == {"clustergate.optin"}


def test_the_plugin_goes_by_one_name_and_no_clustergate_turns_it_off(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded the checkout's way (a conftest naming it), and blocked by that one name."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert declared == {"clustergate_optin": "clustergate.optin"}  # only the switch: tests/commands/test_optin.py
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makefile(".yaml", thresholds=THRESHOLDS)
    pytester.makepyfile("def test_x(cg):\n    assert cg.world_size == 1\n")
    on = runpytest_forked(pytester, "-p", "no:cacheprovider", *PLANTED_SUITE, "--thresholds", "thresholds.yaml",
                                       "--report-dir", str(pytester.path / "report"))
    assert on.ret == 0, on.stdout.str()
    assert results(pytester.path / "report")["verdict"] == "accept"
    off = runpytest_forked(pytester, "-p", "no:cacheprovider", "-p", "no:clustergate")
    assert off.ret == 1
    off.stdout.fnmatch_lines(["*fixture 'cg' not found*"])
    assert "clustergate summary" not in off.stdout.str()


@pytest.mark.skipif(not _installed_entry_point(), reason="clustergate is not installed with its pytest11 entry "
                                                         "point clustergate.optin here (pip install -e . registers it)")
def test_the_installed_plugin_stays_off_without_a_conftest_until_asked(pytester: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """With plugin autoload on (the switch is an entry point), as another project's pytest runs. Asked for, the
    run goes, and every other installed plugin autoload brought in (pytest-xdist, of the test extra) is named: the
    run is partial, saying how to run clean."""
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    pytester.makefile(".yaml", thresholds=THRESHOLDS)
    pytester.makepyfile("def test_x(cg):\n    assert cg.world_size == 1\n")
    off = runpytest_forked(pytester, "-p", "no:cacheprovider")
    off.stdout.fnmatch_lines(["*fixture 'cg' not found*"])
    on = runpytest_forked(pytester, "-p", "no:cacheprovider", "--clustergate", *PLANTED_SUITE, "--thresholds",
                                       "thresholds.yaml", "--report-dir", str(pytester.path / "report"))
    assert on.ret == 1, on.stdout.str()
    res = results(pytester.path / "report")
    assert [t["outcome"] for t in res["tests"]] == ["passed"] and res["verdict"] == "partial", res["reason"]
    foreign = {p["name"] for p in res["attestation"]["plugins"] if not p["suite"]}
    assert "xdist" in foreign and "clustergate_optin" not in foreign and "html" not in foreign, foreign
    assert "plugins that are not the suite's were loaded: " in res["reason"]
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in res["reason"]


def test_the_heap_is_frozen_once_the_tests_are_collected(run, pytester: pytest.Pytester) -> None:
    """What is alive before the first test (torch, pytest, the suite) is out of the collector's reach, so the
    workloads' full collections scan only what the tests made (clustergate.run.outside.freeze_heap)."""
    pytester.makepyfile("""
import gc

def test_heap_frozen():
    assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()
""")
    result, report = run()
    assert result.ret == Exit.ACCEPT, result.stdout.str()[-3000:]
    assert [t["outcome"] for t in results(report)["tests"]] == ["passed"]
