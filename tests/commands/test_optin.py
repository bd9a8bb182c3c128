"""An installed clustergate stays out of pytest runs that do not ask for it (clustergate.optin).

Through pytester with entry-point autoloading off and the pytest11 entry point's module named with -p, as an
installed clustergate loads it: the result does not depend on which clustergate this environment installed.
tests/project/test_packaging.py does the same with a built wheel in a fresh virtual environment.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from forked_pytest import runpytest_forked

from clustergate.common.exit_codes import Exit

from torchrun_job import PLANTED_SUITE, ROOT, job_env

# What an environment with clustergate installed loads in every pytest run: its pytest11 entry point
# (clustergate.optin) and pytest-html's, which the plugin's report needs.
INSTALLED = ("-p", "clustergate.optin", "-p", "html", "-p", "metadata", "-p", "no:cacheprovider")

TRIVIAL = "def test_one():\n    assert 1 + 1 == 2\n"


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
            tmp_path_factory: pytest.TempPathFactory) -> pytest.Pytester:
    for key, value in job_env({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}).items():
        monkeypatch.setenv(key, value)
    # pytester makes the project the home folder: the user's cache folder (clustergate's bytecode cache, which gets
    # the opt-in module's code) is the user's, not the project's.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("user-cache")))
    pytester.makepyfile(test_one=TRIVIAL)
    return pytester


def _files(root: Path) -> set[str]:
    """What a run left in the project (pytester's own temporary directory and output files aside)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts
            and not p.relative_to(root).parts[0].startswith(("runpytest-", "forked-", "stdout", "stderr"))}


def test_a_run_that_does_not_ask_sees_no_clustergate(project: pytest.Pytester) -> None:
    before = _files(project.path)
    result = runpytest_forked(project, *INSTALLED)
    assert result.ret == 0, result.stdout.str()
    said = result.stdout.lines + result.stderr.lines
    # Paths aside: the project's, and an installed package's file a warning names (a virtual environment may lie
    # in a checkout named clustergate): only clustergate's own words count.
    words = [re.sub(r"\S*site-packages/\S*", "", line.replace(str(project.path), "")) for line in said]
    assert not [line for line in words if "clustergate" in line], said
    helped = runpytest_forked(project, *INSTALLED, "--help")
    assert helped.ret == 0
    assert _files(project.path) == before  # no reports/, no lock file, nothing


def test_the_switch_turns_it_on_and_the_header_says_profile_level_and_report_dir(project: pytest.Pytester) -> None:
    report = project.path / "r"
    result = runpytest_forked(project, *INSTALLED, *PLANTED_SUITE, "--clustergate", "--profile", "cpu", "--level",
                                          "quick", "--report-dir", str(report))
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([f"clustergate: profile cpu ({ROOT / 'thresholds.yaml'}), level quick, "
                                 f"report directory {report}", "*clustergate summary*", "ACCEPT*"])
    assert json.loads((report / "results.json").read_text())["verdict"] == "accept"


def test_no_clustergate_wins_over_the_switch(project: pytest.Pytester) -> None:
    project.makepyfile(test_cg="def test_cg(cg):\n    pass\n")
    result = runpytest_forked(project, *INSTALLED, "--clustergate", "-p", "no:clustergate")
    result.stdout.fnmatch_lines(["*fixture 'cg' not found*"])
    assert not (project.path / "reports").exists()


def test_ini_keys_turn_it_on_and_set_its_options_and_the_command_line_wins(project: pytest.Pytester) -> None:
    (project.path / "conf").mkdir()
    (project.path / "conf" / "t.yaml").write_text((ROOT / "thresholds.yaml").read_text())
    project.makeini("[pytest]\nclustergate = true\nclustergate_thresholds = conf/t.yaml\n"
                    "clustergate_profile = cpu\nclustergate_level = quick\nclustergate_report_dir = out/run\n")
    result = runpytest_forked(project, *INSTALLED, *PLANTED_SUITE)
    assert result.ret == 0, result.stdout.str()
    out = project.path / "out" / "run"  # relative to the ini file, as pytest's paths keys are
    result.stdout.fnmatch_lines([f"clustergate: profile cpu ({project.path / 'conf' / 't.yaml'}), level quick, "
                                 f"report directory {out}"])
    first = json.loads((out / "results.json").read_text())
    assert first["verdict"] == "accept" and first["level"] == "quick" and first["profile"] == "cpu"
    again = runpytest_forked(project, *INSTALLED, *PLANTED_SUITE, "--level", "standard", "--report-dir",
                                         str(project.path / "o2"))
    assert again.ret == 0, again.stdout.str()
    assert json.loads((project.path / "o2" / "results.json").read_text())["level"] == "standard"


def test_a_bad_ini_value_is_a_usage_error_naming_the_key(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nclustergate = true\nclustergate_level = fast\n")
    result = runpytest_forked(project, *INSTALLED)
    assert result.ret == Exit.USAGE
    result.stderr.fnmatch_lines(["*clustergate_level = 'fast'; choose one of quick, standard, extended*"])


def test_help_with_the_plugin_on_writes_no_report_directory(project: pytest.Pytester) -> None:
    result = runpytest_forked(project, *INSTALLED, "--clustergate", "--help", "--report-dir",
                                          str(project.path / "r"))
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--thresholds=FILE*", "*clustergate_thresholds*"])
    assert not (project.path / "r").exists() and not (project.path / "reports").exists()
