"""The report directory end to end, as a user runs the suite (real pytest and torchrun processes):

- a refused run changes nothing: a run refused before its first test (a bad thresholds file, profile, option or
  --baseline) leaves every byte of its --report-dir as it was, no earlier/ made, and its error says the
  results.json there is an earlier run's; a run that writes moves the earlier outputs to earlier/<time>/ first,
  saying where; where they cannot be moved (a read-only directory) the error says the file there is not this run's;
- a link planted in the report directory is refused or never written through;
- where flock does not work, a lock file holds the directory, and a second run is told so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dir_bytes import tree
from forked_pytest import runpytest_forked

from clustergate.common.exit_codes import Exit
from clustergate.record.reportdir import LOCK_NAME

from torchrun_job import PLANTED_SUITE, ROOT, frames_of_ours, job_env, plant, run_job, start_job, wait_for

EARLIER = {"schema": 1, "verdict": "accept", "started": "2026-01-01T00:00:00+00:00", "tests": []}
KEPT = "results.json (verdict 'accept', started 2026-01-01T00:00:00+00:00) is an earlier run's, NOT the result of " \
       "this run, which was refused before it wrote anything: the directory is left as it was"


def plant_earlier_accept(report: Path) -> dict[str, str]:
    """What an earlier run into this directory left: an accept, its report and its lock file; every byte of it."""
    report.mkdir(parents=True, exist_ok=True)
    (report / "results.json").write_text(json.dumps(EARLIER))
    (report / "report.html").write_text("<p>ACCEPT</p>")
    (report / LOCK_NAME).touch()
    return tree(report)


def assert_unchanged(report: Path, before: dict[str, str]) -> None:
    """Every byte as it was: nothing written, moved (no earlier/), made or removed; but the lock file, no output,
    which says the pid of the run that last held the directory (one refused holds it while it checks)."""
    after = tree(report)
    assert after.keys() == before.keys()
    assert {k: v for k, v in after.items() if k != LOCK_NAME} == {k: v for k, v in before.items() if k != LOCK_NAME}
    assert not (report / "earlier").exists()


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Plain pytest (world size 1) in a process of its own, into pytester.path/report: forked from the server that
    has imported torch once (tests/helpers/forked_pytest.py), or, given ``preload`` (an LD_PRELOAD library, which takes
    effect only in a process that starts with it), a new process."""
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")

    def _run(*args: str, preload: str | None = None) -> tuple[pytest.RunResult, Path]:
        report = pytester.path / "report"
        argv = ("-p", "clustergate", "-p", "no:cacheprovider", *PLANTED_SUITE, "--thresholds",
                str(ROOT / "thresholds.yaml"), "--report-dir", str(report), *args)
        if preload is None:
            return runpytest_forked(pytester, *argv), report
        with monkeypatch.context() as env:
            env.setenv("LD_PRELOAD", preload)
            return pytester.runpytest_subprocess(*argv), report

    return _run


@pytest.mark.parametrize(("args", "said"), [
    (("--profile", "h900"), "*thresholds.yaml: no profile 'h900'*"),
    (("--thresholds", "broken.yaml"), "*broken.yaml*"),
    (("--test-timeout", "0"), "*--test-timeout 0.0: a time limit must be a finite number of seconds above 0*"),
    (("--test-timeout", "ten"), "*--test-timeout ten: a time limit must be a finite number of seconds above 0*"),
    (("--collective-timeout", "nan"), "*--collective-timeout nan: a time limit must be a finite number*"),
    (("--level", "ludicrous"), "*--level ludicrous: invalid choice: 'ludicrous' (choose from quick, standard, *"),
    (("--no-such-option",), "*unrecognized arguments: --no-such-option*"),
    (("--baseline", "not-results.json"), "*not-results.json*"),
    (("-p", "xdist", "-n", "2"), "*do not combine it with pytest-xdist*"),  # autoload is off: xdist named
])
def test_a_run_refused_before_its_first_test_changes_nothing(
        run, pytester: pytest.Pytester, args: tuple[str, ...], said: str) -> None:
    (pytester.path / "broken.yaml").write_text("schema: 1\nprofiles: [cpu: {\n")
    (pytester.path / "not-results.json").write_text('{"verdict": "accept"}')
    before = plant_earlier_accept(pytester.path / "report")
    result, report = run(*args)
    assert result.ret == Exit.USAGE, result.stderr.str()  # an option nobody knows too: said before pytest reads it
    result.stderr.fnmatch_lines([said, f"NOTE: {report}/{KEPT}"])
    assert_unchanged(report, before)
    assert "moved to" not in result.stderr.str(), result.stderr.str()


def test_a_full_report_dir_is_refused_and_changes_nothing(run, pytester: pytest.Pytester) -> None:
    """A real file system with too little room: a 1 MiB tmpfs."""
    report = pytester.path / "report"
    report.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(report)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and a tmpfs mount to make a full directory")
    try:
        before = plant_earlier_accept(report)
        result, _ = run()
        assert result.ret == Exit.COULD_NOT_RUN, result.stderr.str()
        result.stderr.fnmatch_lines([f"*--report-dir {report}: only * MiB free there; the outputs need 64 MiB*"])
        assert_unchanged(report, before)
    finally:
        subprocess.run(["umount", str(report)], check=True)


@pytest.fixture
def read_only(pytester: pytest.Pytester) -> Iterator[Path]:
    """pytester.path/report holding an earlier accept, made immutable (root ignores permission bits)."""
    report = pytester.path / "report"
    plant_earlier_accept(report)
    if os.geteuid() != 0 or shutil.which("chattr") is None or \
            subprocess.run(["chattr", "+i", str(report)], capture_output=True).returncode != 0:
        pytest.skip("needs root and chattr +i to make a read-only directory")
    yield report
    subprocess.run(["chattr", "-i", str(report)], check=True)


@pytest.mark.parametrize(("args", "said"), [
    ((), "ERROR: --report-dir {report}: cannot write in it (Operation not permitted)*"),
    (("--profile", "h900"), "ERROR: *thresholds.yaml: no profile 'h900'*"),
])
def test_a_read_only_report_dir_says_the_results_there_are_not_this_runs(
        run, read_only: Path, args: tuple[str, ...], said: str) -> None:
    result, report = run(*args)
    assert result.ret == (Exit.USAGE if args else Exit.COULD_NOT_RUN), result.stderr.str()
    result.stderr.fnmatch_lines([said.format(report=report), f"NOTE: {report}/{KEPT}"])


@pytest.mark.slow
def test_under_torchrun_a_bad_profile_changes_nothing(tmp_path: Path) -> None:
    before = plant_earlier_accept(tmp_path / "report")
    r = run_job(tmp_path, [*plant(tmp_path, "healthy"), "--profile", "h900"], timeout=120)
    assert r.codes == [1], r.output  # the run's 2, said by torchrun's summary; torchrun reports 1
    # Twice: rank 0 says it first, and torchrun's summary again (tests/run/test_plain_torchrun.py).
    assert r.output.count("no profile 'h900'") == 2, r.output
    assert_unchanged(tmp_path / "report", before)


# ---- links ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_progress_jsonl_as_a_link_is_refused_with_one_clear_error(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("not clustergate's\n")
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "progress.jsonl").symlink_to(victim)
    r = run_job(tmp_path, plant(tmp_path, "healthy"), timeout=120)
    message = (f"ERROR: --report-dir {tmp_path / 'report'}: progress.jsonl (a link to {victim}) is a symbolic link "
               "there; clustergate writes no output through a link (it could overwrite another file): remove the link")
    assert r.codes == [1], r.output
    # Twice (rank 0 first, then torchrun's summary), and nothing else went wrong.
    assert r.output.count(message) == 2, r.output
    assert "INTERNALERROR" not in r.output and not frames_of_ours(r.output), r.output
    assert victim.read_text() == "not clustergate's\n"
    assert (tmp_path / "report" / "progress.jsonl").is_symlink() and not (tmp_path / "report" / "earlier").exists()


def test_a_link_planted_as_results_json_tmp_leaves_its_target_untouched(run, pytester: pytest.Pytester) -> None:
    victim = pytester.path / "victim.txt"
    victim.write_text("not clustergate's\n")
    report = pytester.path / "report"
    report.mkdir()
    for name in ("results.json.tmp", "junit.xml.tmp", "report.html.tmp", "progress.jsonl.tmp"):
        (report / name).symlink_to(victim)
    result, _ = run()
    assert result.ret == 0, result.stdout.str()
    assert json.loads((report / "results.json").read_text())["verdict"] == "accept"
    assert victim.read_text() == "not clustergate's\n"


# ---- no flock ------------------------------------------------------------------------------------------------

NO_FLOCK_C = r"""
#include <errno.h>
int flock(int fd, int operation) { (void)fd; (void)operation; errno = ENOLCK; return -1; }
"""


@pytest.fixture(scope="module")
def no_flock(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An LD_PRELOAD library whose flock() fails with ENOLCK, as on a file system without flock."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the ENOLCK flock() shim")
    src = tmp_path_factory.mktemp("shim") / "no_flock.c"
    src.write_text(NO_FLOCK_C)
    lib = src.with_suffix(".so")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return str(lib)


@pytest.mark.slow
def test_without_flock_a_second_run_is_told_the_lock_file_holds_the_directory(tmp_path: Path, no_flock: str) -> None:
    env = {"LD_PRELOAD": no_flock}
    first = start_job(tmp_path, plant(tmp_path, "holds_the_dir"), timeout=180, env=env)
    wait_for(tmp_path / "a-running")
    owner = tmp_path / "report" / ".clustergate.lock.owner"
    (tmp_path / "second").mkdir()
    second = run_job(tmp_path / "second", [*plant(tmp_path / "second", "healthy"), "--report-dir",
                                           str(tmp_path / "report")], timeout=120, env=env)
    (tmp_path / "b-done").touch()
    r = first.wait()
    assert second.codes == [1], second.output
    assert (f"ERROR: --report-dir {tmp_path / 'report'} is in use by another clustergate run (pid "
            in second.output), second.output
    assert (f"held through the lock file {owner}, as flock does not work on this file system (ENOLCK: No locks "
            "available)" in second.output), second.output
    assert r.codes == [0], r.output
    assert f"clustergate: flock does not work on the file system of {tmp_path / 'report'} (ENOLCK" in r.output
    assert r.results["verdict"] == "accept"
    assert not owner.exists()  # released at the end of the run


@pytest.mark.parametrize("args", [("--profile", "h900"), ("--no-such-option",)])
def test_without_flock_a_refused_run_leaves_no_lock_file(
        run, pytester: pytest.Pytester, no_flock: str, args: tuple[str, ...]) -> None:
    """The lock file is no flock that the kernel drops: a run refused at start-up must remove it itself
    (an unknown option ends the run before pytest configures it)."""
    before = plant_earlier_accept(pytester.path / "report")
    result, report = run(*args, preload=no_flock)
    assert result.ret == Exit.USAGE, result.stderr.str()
    assert_unchanged(report, before)
    assert not (report / ".clustergate.lock.owner").exists()


def test_a_second_run_into_one_report_dir_says_where_the_first_went(run) -> None:
    """One line, the first the run says: the earlier outputs are in earlier/<time>/ (with -p clustergate, as the
    checkout's configuration and clustergate run name the plugin, it was said while pytest captured the conftests'
    loading, and lost)."""
    first, report = run()
    assert "earlier" not in first.stderr.str(), first.stderr.str()
    second, _ = run()
    [earlier] = (report / "earlier").iterdir()
    assert second.stderr.lines[0] == f"clustergate: an earlier run's outputs in {report} were moved to {earlier}", \
        second.stderr.str()
    assert second.stderr.str().count("earlier run's outputs") == 1, second.stderr.str()


def test_a_baseline_among_the_earlier_outputs_follows_them(run) -> None:
    """The baseline is read before the earlier outputs move (a bad one is refused with them in place); the record
    names it where it went."""
    first, report = run()
    assert first.ret == 0, first.stdout.str()
    second, _ = run("--baseline", str(report / "results.json"))
    assert second.ret == 0, second.stderr.str()
    [earlier] = (report / "earlier").iterdir()
    assert json.loads((report / "results.json").read_text())["baseline"]["source"] == str(earlier / "results.json")


def test_clustergate_run_with_a_thresholds_typo_changes_nothing(tmp_path: Path) -> None:
    """The command a user types (`clustergate run`, torchrun inside it): refused (2) before it moves anything."""
    report = tmp_path / "report"
    before = plant_earlier_accept(report)
    proc = subprocess.run([sys.executable, "-m", "clustergate", "run", "--nproc-per-node", "1", "--report-dir",
                           str(report), "--thresholds", str(tmp_path / "typo.yaml")], cwd=tmp_path, env=job_env(),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode == Exit.USAGE, proc.stdout
    assert "typo.yaml" in proc.stdout and "moved to" not in proc.stdout, proc.stdout
    assert f"NOTE: {report}/{KEPT}" in proc.stdout, proc.stdout
    assert_unchanged(report, before)
