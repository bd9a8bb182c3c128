"""The design card's command, plain torchrun from the checkout: ``torchrun --standalone --nproc-per-node=2 -m pytest
acceptance``, refusing bad input as cleanly as ``clustergate run``.

Real torchrun jobs of 2 CPU ranks, each stopped before its first test. A refusal (a bad option or input, a run that
could not start) is said first, once, on rank 0's stderr, before torchrun's report, and again at that report's end by
torchrun's own failure summary, whose root cause is rank 0's error file (clustergate.run.launch.errorfile) with the
run's exit status, the line ``clustergate run`` prints; torchrun itself exits 1 (README, exit status). A run that starts
and is rejected before any test (a GPU node whose torch sees no CUDA) says why once on the terminal (its summary),
and torchrun's summary names the verdict. Run from another directory, the command says to run it from the checkout
or to use ``clustergate run``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clustergate.common.exit_codes import Exit
from workloads.node import gpu_presence

from torchrun_job import ROOT, foreground_signals, frames_of_ours, job_env, root_cause

pytestmark = pytest.mark.slow  # a torchrun job each

CARD = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "pytest", "acceptance"]
"""The design card's command (torchrun is ``python -m torch.distributed.run``)."""


def card(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The design card's command with ``args``, run in ``cwd``; stdout and stderr together, as a terminal shows them."""
    return subprocess.run([sys.executable, *CARD, *args], cwd=cwd, env=env or job_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=180,  # a hang guard: each stops at the start
                          preexec_fn=foreground_signals)


def typo_thresholds(tmp_path: Path) -> Path:
    bad = tmp_path / "thresholds.yaml"
    bad.write_text((ROOT / "thresholds.yaml").read_text().replace("gpu_count: {min: 8", "gpu_count: {mni: 8", 1))
    return bad


def not_a_directory(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "report"


BAD_INPUTS = {
    "wrong profile": (lambda t: ["--profile", "h900"], "thresholds.yaml: no profile 'h900'; profiles are: ",
                      Exit.USAGE),
    "misspelled option": (lambda t: ["--profle", "cpu"],
                          "unrecognized arguments: --profle cpu (--profle: did you mean --profile?)", Exit.USAGE),
    "thresholds key typo": (lambda t: ["--thresholds", str(typo_thresholds(t))],
                            "profiles.h100-sxm-80gb.metrics.gpu_count.mni: unknown key", Exit.USAGE),
    "report directory that cannot be made": (lambda t: ["--report-dir", str(not_a_directory(t))],
                                             "cannot create it (Not a directory)", Exit.COULD_NOT_RUN),
}


def bad_input_run(tmp_path: Path, case: str) -> subprocess.CompletedProcess[str]:
    given = BAD_INPUTS[case][0](tmp_path)
    report_dir = ["--report-dir", str(tmp_path / "report")] if "--report-dir" not in given else []
    return card(ROOT, "-k", "test_world", *report_dir, *given)


@pytest.fixture(scope="module")
def wrong_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The card refusing a profile thresholds.yaml lacks, and where it ran: one job for the bad-input case and for
    the line ``clustergate run`` must print (a job's CPU is mostly ``import torch`` in the agent and each rank)."""
    tmp = tmp_path_factory.mktemp("wrong_profile")
    return tmp, bad_input_run(tmp, "wrong profile")


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_a_bad_input_is_said_first_and_by_torchruns_own_summary(tmp_path: Path, case: str,
                                                                request: pytest.FixtureRequest) -> None:
    _, message, status = BAD_INPUTS[case]
    if case == "wrong profile":
        tmp_path, r = request.getfixturevalue("wrong_profile")
    else:
        r = bad_input_run(tmp_path, case)
    assert r.returncode == 1, r.stdout  # torchrun's own: 1 whatever its ranks' status
    # Twice in all the output, not once per rank: first on rank 0's stderr, where a user reads, then as the root cause
    # at the end of torchrun's report (34-72 lines of its own).
    assert r.stdout.count(message) == 2, r.stdout
    first = r.stdout.index(message)
    line = r.stdout[r.stdout.rfind("\n", 0, first) + 1:]
    assert line.startswith("ERROR: ") and "Traceback" not in r.stdout[:first], r.stdout
    assert first < r.stdout.index("Root Cause (first observed failure):"), r.stdout
    cause = root_cause(r.stdout)
    assert cause["rank"].startswith("0 ") and cause["exitcode"].split()[0] == str(int(status)), r.stdout
    assert cause["traceback"].startswith("ERROR: ") and message in cause["traceback"], r.stdout
    assert cause["error_file"] != "<N/A>" and "To enable traceback" not in r.stdout, r.stdout
    assert "test session starts" not in r.stdout and not frames_of_ours(r.stdout), r.stdout
    assert not (tmp_path / "report" / "results.json").exists()


def test_the_line_is_the_one_clustergate_run_prints(tmp_path: Path,
                                                  wrong_profile: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """``clustergate run`` (torchrun in the command, rank 0's output shown) prints the same line torchrun's summary
    shows."""
    plain = root_cause(wrong_profile[1].stdout)["traceback"]
    assert BAD_INPUTS["wrong profile"][1] in plain, wrong_profile[1].stdout  # the refusal, not some other failure
    run = subprocess.run([sys.executable, "-m", "clustergate", "run", "--nproc-per-node", "2", "--profile", "h900",
                          "--report-dir", str(tmp_path / "run")], cwd=tmp_path, env=job_env(), capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == Exit.USAGE, run.stderr
    assert run.stderr.count(plain) == 1, (plain, run.stderr)
    assert run.stdout.splitlines()[-1].startswith("clustergate run: usage or unusable input"), run.stdout


def installed_editable(tmp_path: Path) -> dict[str, str]:
    """The environment of a newcomer's ``pip install -e .``: clustergate importable from the checkout, and its pytest11
    entry point (``clustergate.optin``) loaded by every pytest run, installed plugins autoloaded."""
    site = tmp_path / "site"
    info = site / "clustergate-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clustergate\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nclustergate_optin = clustergate.optin\n")
    env = job_env({"PYTHONPATH": f"{site}:{ROOT}"})
    del env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"]
    return env


@pytest.mark.parametrize("args", [[], ["--report-dir", "report"]], ids=["bare", "with-report-dir"])
def test_run_from_another_directory_it_says_to_run_from_the_checkout(tmp_path: Path, args: list[str]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = card(elsewhere, *args, env=installed_editable(tmp_path))
    said = (f"ERROR: acceptance: no such directory in {elsewhere}: the command runs the suite from the root of the "
            f"clustergate checkout: run it from there (cd {ROOT}), or run `clustergate run`")
    assert r.returncode == 1 and r.stdout.count(said) == 2 and r.stdout.startswith(said), r.stdout  # first and last
    assert root_cause(r.stdout)["traceback"].startswith(said), r.stdout
    assert "unrecognized arguments" not in r.stdout and "file or directory not found" not in r.stdout, r.stdout


def test_a_gpu_node_whose_torch_sees_no_cuda_says_its_reject_once(tmp_path: Path) -> None:
    """The site says this node has GPUs; this machine's torch sees none: a reject at collection, said once on the
    terminal (rank 0's summary; no pytest.exit banner, no line per rank), and torchrun's summary names the verdict,
    as ``clustergate run``'s last line does."""
    r = card(ROOT, "-k", "test_world", "--report-dir", str(tmp_path / "report"),
             env=job_env({gpu_presence.EXPECTED_GPUS_ENV: "2"}))
    assert r.returncode == 1, r.stdout
    session, _, summary = r.stdout.partition("ChildFailedError")
    assert session.count("sees no CUDA device") == 1 and "run error: this is a GPU node" in session, r.stdout
    assert "_pytest.outcomes.Exit" not in r.stdout and "pytest.exit(" not in r.stdout, r.stdout
    cause = root_cause(r.stdout)
    assert cause["rank"].startswith("0 ") and cause["exitcode"].split()[0] == "1", r.stdout
    assert cause["traceback"].startswith("clustergate: REJECT: this is a GPU node"), r.stdout
    assert cause["traceback"].endswith(f"(exit 1; {tmp_path / 'report' / 'results.json'})"), r.stdout
    assert "Signal 15 (SIGTERM)" in summary, r.stdout  # rank 1 left the word to rank 0 and was ended by torchrun
