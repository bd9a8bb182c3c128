"""The ``clustergate`` command: every subcommand listed, each cluster command handed its arguments unchanged,
``run`` as the torchrun command it executes and as it ends (the verdict last, the table's exit status, never
pytest's 3), and exit statuses 0/1/2/4.

A real ``clustergate run`` from an installed wheel is in tests/project/test_packaging.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import clustergate
from clustergate import cli
from clustergate.common.exit_codes import Exit
from clustergate.criteria.thresholds import shipped_thresholds
from clustergate.run.launch import command, command_note

from torchrun_job import ROOT, job_env

COMMANDS = ("run", "merge", "signoff", "render", "calibrate")


def test_help_lists_every_command_and_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"    {name}" in out for name in COMMANDS), out
    assert "0 accepted, 1 not accepted, 2 input that cannot be used (a bad option or file), 4 could not run" in out
    assert "never 3" in out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"clustergate {clustergate.__version__}"


def test_no_command_or_an_unknown_one_is_unusable_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "name a command: run, merge, signoff, render, calibrate" in capsys.readouterr().err
    assert cli.main(["sign-off"]) == 2
    assert "invalid choice: 'sign-off'" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "said", "hint"), [
    (["merg"], "clustergate: argument COMMAND: invalid choice: 'merg' (choose from 'run', 'merge', ",
     "(did you mean merge?)"),
    (["merge", "-o", "OUT", "--expect-hots", "gpu1"], "clustergate merge: unrecognized arguments: --expect-hots",
     "(--expect-hots: did you mean --expect-hosts?)"),
    (["signoff", "RUN", "--thresold", "t.yaml"], "clustergate signoff: unrecognized arguments: --thresold",
     "(--thresold: did you mean --thresholds?)"),
    (["record", "--stroe=fleet.db", "R"], "clustergate record: unrecognized arguments: --stroe=fleet.db",
     "(--stroe: did you mean --store?)"),
    (["list", "--level", "standrad"], "clustergate list: argument --level: invalid choice: 'standrad' (choose from ",
     "(did you mean standard?)"),
    (["health", "--jsno"], "clustergate health: unrecognized arguments: --jsno", "(--jsno: did you mean --json?)"),
])
def test_a_typo_of_an_option_or_command_says_the_nearest(tmp_path: Path, args: list[str], said: str,
                                                          hint: str) -> None:
    """One line, exit 2, and the nearest known word: the commands as a user types them."""
    proc = subprocess.run([sys.executable, "-m", "clustergate", *args], capture_output=True, text=True,
                          env=job_env(), cwd=tmp_path, timeout=120)  # a hang guard
    assert proc.returncode == Exit.USAGE and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.startswith(said) and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.endswith(f" {hint} (see --help)\n"), proc.stderr


def test_a_word_close_to_nothing_gets_no_guess() -> None:
    from clustergate.common.suggest import argparse_hint, near

    assert near("--zzz", ["--profile", "--level"]) is None and near("--levl", ["--profile", "--level"]) == "--level"
    assert argparse_hint("unrecognized arguments: --zzz", ["--profile"]) == ""
    assert argparse_hint("the following arguments are required: -o/--output", ["--output"]) == ""


def test_python_dash_m_clustergate_is_the_same_command() -> None:
    proc = subprocess.run([sys.executable, "-m", "clustergate", "--help"], capture_output=True, text=True,
                          env=job_env(), cwd=ROOT, timeout=120)  # a hang guard
    assert proc.returncode == 0 and all(f"    {name}" in proc.stdout for name in COMMANDS), proc.stderr


@pytest.mark.parametrize("name", ["merge", "signoff", "calibrate"])
def test_the_cluster_commands_are_their_modules_main(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import clustergate.cluster.__main__ as cluster

    seen: list[list[str]] = []
    monkeypatch.setattr(cluster, "command", lambda which: (lambda argv: seen.append([which, *argv]) or 1))
    assert cli.main([name, "a", "--flag"]) == 1
    assert seen == [[name, "a", "--flag"]]  # the arguments as given: each module finds the shipped thresholds


def test_calibrate_defaults_to_the_shipped_thresholds(capsys: pytest.CaptureFixture[str]) -> None:
    """From a wheel there is no checkout beside the modules: calibrate's default is the packaged file."""
    from clustergate.cluster import calibrate

    with pytest.raises(SystemExit):
        calibrate.main(["--help"])
    # argparse wraps the help at spaces and hyphens: compare with every line break taken out.
    assert str(shipped_thresholds()) in "".join(capsys.readouterr().out.split())


def test_render_is_the_report_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", str(tmp_path / "missing.json")]) == 2  # its own "input cannot be used"
    assert "clustergate render: " in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["render", "--help"])
    assert exc.value.code == 0 and "--thresholds" in capsys.readouterr().out


def test_run_is_torchrun_on_this_node_over_the_packaged_suite(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--nproc-per-node", "3", "-k", "world", "--print-command", "--level", "quick",
                     "--", "--print-command"]) == 0
    cmd = capsys.readouterr().out.split()
    suite = str(ROOT / "acceptance")
    assert cmd == ["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node=3", "--redirects", "1:3,2:3", "-m", "pytest", "-c",
                   str(ROOT / "clustergate" / "run.ini"), "--rootdir",
                   str(ROOT), "-p", "clustergate", suite,
                   "-k", "world", "--level", "quick", "--print-command"]
    assert cli.main(["run", "--nproc-per-node=0", "--print-command"]) == 2
    assert "--nproc-per-node '0' must be a whole number >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--help"])
    assert exc.value.code == 0 and "--nproc-per-node" in capsys.readouterr().out


def test_runs_configuration_says_what_the_checkouts_does() -> None:
    """clustergate/run.ini stands in for pyproject.toml's pytest section where no checkout is."""
    import configparser

    import tomllib

    ini = configparser.ConfigParser()
    ini.read(command.RUN_INI)
    checkout = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["pytest"]["addopts"] == checkout["addopts"]


def test_run_counts_the_gpus_with_nvml_and_leaves_cuda_visible_devices_to_torch(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The default rank count: NVML's GPUs (no torch import before torchrun starts); torch's where
    CUDA_VISIBLE_DEVICES narrows the set, or where NVML cannot say; 2 CPU ranks without a GPU."""
    from types import SimpleNamespace

    nvml = SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 8)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert command.local_gpu_count() == 8
    assert cli.main(["run", "--print-command"]) == 0 and "--nproc-per-node=8" in capsys.readouterr().out
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # torch's rules: no GPU (this machine has none either way)
    assert command.local_gpu_count() == 0
    assert cli.main(["run", "--print-command"]) == 0 and "--nproc-per-node=2" in capsys.readouterr().out

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=no_driver))
    assert command.local_gpu_count() == 0


# ---- how `clustergate run` ends: its status and its last line, from what torchrun and rank 0 say --------------
def _ran(tmp_path: Path, launched: command.Launched, told: dict | None = None, results: dict | None = None,
         rank_said: tuple[int, str] | None = None):
    """A fake torchrun: writes what rank 0 would tell and write, returns how the ranks ended."""
    def launcher(args: list[str]) -> command.Launched:
        report = tmp_path / "report"
        if results is not None:
            report.mkdir()
            (report / "results.json").write_text(json.dumps(results))
        told_path = Path(os.environ[command_note.OUTCOME_ENV])
        told_path.write_text(json.dumps({**({"report_dir": str(report)} if results is not None else {}),
                                         **(told or {})}))
        if rank_said is not None:
            rank, text = rank_said
            log = Path(args[args.index("--log-dir") + 1]) / "run-id" / "attempt_0" / str(rank)
            log.mkdir(parents=True)
            (log / "stderr.log").write_text(text)
        return launched
    return launcher


REJECTED = {"verdict": "reject", "error": "rank 1 (n) did not reach 'collection' within 45 s\n  more", "reason": "x"}


@pytest.mark.parametrize(("launched", "told", "results", "status", "last"), [
    (command.Launched(), None, {"verdict": "accept", "error": None}, Exit.ACCEPT, "clustergate run: ACCEPT (exit 0; "),
    (command.Launched(codes={0: 1, 1: -15}, first=0), None, REJECTED, Exit.NOT_ACCEPTED,
     "clustergate run: REJECT: rank 1 (n) did not reach 'collection' within 45 s (exit 1; "),
    # pytest's own refusal of an option it does not know: its 4, before the plugin runs, is a usage error
    (command.Launched(codes={0: 4, 1: 4}, first=0), None, None, Exit.USAGE,
     "clustergate run: usage or unusable input: no results.json was written; see the error above (exit 2)"),
    (command.Launched(codes={0: 2, 1: -15}, first=0), {"status": 2}, None, Exit.USAGE, "clustergate run: usage"),
    (command.Launched(codes={0: 4, 1: -15}, first=0), {"status": 4}, REJECTED, Exit.COULD_NOT_RUN,
     "clustergate run: COULD NOT RUN: rank 1 (n) did not reach"),
    # refused at collection (-m multinode alone on one node): its record rejects, its line says refused
    (command.Launched(codes={0: 2, 1: -15}, first=0), {"status": 2}, {**REJECTED, "error": "the multinode tests"},
     Exit.USAGE, "clustergate run: REFUSED (usage): the multinode tests (exit 2; "),
    (command.Launched(signal="SIGTERM"), None, REJECTED, Exit.NOT_ACCEPTED, "clustergate run: REJECT"),
    # Ctrl-C: no rank caused it, and it says nothing about the node: never its REJECT
    (command.Launched(signal="SIGINT"), None, {**REJECTED, "error": "interrupted by SIGINT on rank 0 (n)",
                                                "interrupted": True}, Exit.NOT_ACCEPTED,
     "clustergate run: INTERRUPTED: interrupted by SIGINT on rank 0 (n) (exit 1; "),
    (command.Launched(could_not="RendezvousTimeoutError: no peers"), None, None, Exit.COULD_NOT_RUN,
     "clustergate run: could not run: no results.json was written; torchrun could not start the ranks "
     "(RendezvousTimeoutError: no peers) (exit 4)"),
    (command.Launched(codes={1: -9}, first=1), None, None, Exit.NOT_ACCEPTED,
     "clustergate run: not accepted: no results.json was written; rank 1 ended with exit status -9 (exit 1)"),
    # rank 0 killed mid-run: its record still says running and gives no cause; the launcher's account does
    (command.Launched(codes={0: -9, 1: -15}, first=0), None, {"verdict": "running", "error": None},
     Exit.NOT_ACCEPTED, "clustergate run: RUNNING: rank 0 ended with exit status -9 (exit 1; "),
])
def test_run_ends_with_the_tables_status_and_the_verdict_last(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], launched: command.Launched, told: dict | None,
        results: dict | None, status: Exit, last: str) -> None:
    assert command.main(["--nproc-per-node", "2"], launcher=_ran(tmp_path, launched, told, results)) == status
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(last), out


def test_run_gives_the_callers_environment_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A caller that goes on after the run (a script, a test session) keeps its own plugins: torchrun's ranks get
    # PYTEST_DISABLE_PLUGIN_AUTOLOAD, this process does not keep it.
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    seen: dict[str, str | None] = {}

    def launcher(args: list[str]) -> command.Launched:
        seen["during"] = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
        return command.Launched()

    command.main(["--nproc-per-node", "2"], launcher=launcher)
    assert seen["during"] == "1" and "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in os.environ
    assert command_note.OUTCOME_ENV not in os.environ


def test_run_keeps_the_ranks_output_where_another_rank_stopped_a_run_without_a_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    launcher = _ran(tmp_path, command.Launched(codes={1: -11, 0: -15}, first=1), rank_said=(1, "Segmentation fault\n"))
    assert command.main(["--nproc-per-node", "2"], launcher=launcher) == Exit.NOT_ACCEPTED
    said = capsys.readouterr()
    assert "was ended by SIGTERM" not in said.err, said.err  # torchrun's own, once rank 1 had gone
    assert "clustergate run: torchrun: rank 1 was ended by SIGSEGV (exit status -11)\n" in said.err, said.err
    where = said.err.split("every rank's own output is under ", 1)[1].split()[0]
    assert "clustergate run: rank 1 stopped first" in said.err and (Path(where) / "run-id").is_dir(), said.err
    assert said.out.splitlines()[-1] == ("clustergate run: not accepted: no results.json was written; rank 1 ended "
                                         "with exit status -11 (exit 1)")


@pytest.mark.slow
def test_clustergate_run_prints_once_and_ends_with_its_verdict(tmp_path: Path) -> None:
    """For real (2 CPU ranks, from a directory outside the checkout): a failing run ends with the verdict line and
    status 1 and no torchrun traceback; an unknown option and pytest's --help are printed once; --collect-only
    lists the tests as acceptance/..., exits 0 and writes no report. The standard library's ``html`` is imported as
    Python starts (as some images' site set-up does): pytest-html, loaded by that name, would then warn that it
    cannot be rewritten."""
    early = tmp_path / "early-imports"
    early.mkdir()
    (early / "sitecustomize.py").write_text("import html  # noqa: F401\n")
    env = job_env()
    env["PYTHONPATH"] = os.pathsep.join([str(early), env["PYTHONPATH"]])
    strict = tmp_path / "thresholds.yaml"  # the cpu profile wanting 3 GPUs a node: the world test fails
    strict.write_text((ROOT / "thresholds.yaml").read_text().replace("      gpus_per_node: 0\n",
                                                                     "      gpus_per_node: 3\n", 1))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "clustergate", "run", "--nproc-per-node", "2", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # hang guard

    # --report-dir relative to the directory the command runs in: every output, the last ones too, lands there.
    failed = run("-k", "test_world", "--level", "quick", "--thresholds", str(strict), "--report-dir", "report")
    said = failed.stdout + failed.stderr
    assert failed.returncode == Exit.NOT_ACCEPTED, said
    assert failed.stdout.splitlines()[-1].startswith("clustergate run: REJECT: 1 of 2 tests did not pass (exit 1; "
                                                     f"{tmp_path / 'report' / 'results.json'})"), said
    assert "FAILED acceptance/test_world.py::test_world_matches_profile" in said, said
    assert json.loads((tmp_path / "report" / "results.json").read_text())["verdict"] == "reject", said
    for noise in ("Traceback", "ChildFailedError", "SignalException", "PytestAssertRewriteWarning", "../",
                  "failed (exitcode: "):  # torchrun's own error line per failed rank: the verdict line says it
        assert noise not in said, noise
    unplugged = run("-p", "no:clustergate", "--report-dir", str(tmp_path / "unplugged"))  # after run's -p clustergate
    assert unplugged.returncode == Exit.USAGE and not (tmp_path / "unplugged").exists(), unplugged.stderr
    assert unplugged.stderr.count("ERROR: the acceptance suite runs only under its plugin, clustergate: remove "
                                  "-p no:clustergate") == 1, unplugged.stderr
    assert unplugged.stdout.splitlines()[-1].startswith("clustergate run: usage or unusable input"), unplugged.stdout
    refused = run("--no-such-option")
    assert refused.returncode == Exit.USAGE
    assert (refused.stdout + refused.stderr).count("unrecognized arguments: --no-such-option") == 1, refused.stderr
    helped = run("--", "--help")
    assert helped.returncode == 0 and helped.stdout.count("usage: ") == 1, helped.stdout[-2000:]
    listed = run("--collect-only", "-q", "--report-dir", str(tmp_path / "listing"))
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "acceptance/test_world.py::test_world_matches_profile" in listed.stdout.splitlines()
    assert not (tmp_path / "listing").exists()


@pytest.mark.parametrize("torch_imported", [False, True])
def test_the_command_exits_with_mains_status_after_the_exit_handlers(torch_imported: bool) -> None:
    """Where torch was imported (``run``), the command leaves without the interpreter's teardown: its exit
    handlers still run, its output is flushed, and the status is main's."""
    code = ("import atexit, sys\n"
            + ("import torch\n" if torch_imported else "")
            + "atexit.register(lambda: print('exit handler ran'))\n"
            "print('said before', end='')\n"  # unflushed: a bare os._exit would lose it
            "sys.argv = ['clustergate', 'no-such-command']\n"
            "from clustergate.cli import command\n"
            "command()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.startswith("said before") and "exit handler ran" in proc.stdout
    assert "no-such-command" in proc.stderr


def test_a_run_writes_its_reports_under_the_current_directory(tmp_path: Path) -> None:
    """Without --report-dir the outputs go to reports/<UTC time>/ where the command was started, never into the
    directory clustergate is installed or checked out in (the checkout's suite, started from elsewhere)."""
    from forked_pytest import pytest_forked

    here = tmp_path / "here"
    here.mkdir()
    own = tmp_path / "own"
    own.mkdir()
    suite = str(ROOT / "acceptance" / "test_world.py")
    run = pytest_forked(here, job_env(), [suite, "-k", "test_world_matches_profile", "--level", "quick"], own)
    [report] = (here / "reports").iterdir()
    results = json.loads((report / "results.json").read_text())
    assert [t["outcome"] for t in results["tests"]] == ["passed"], "\n".join(run.outlines[-40:] + run.errlines[-40:])
    assert str(report) in "\n".join(run.outlines)  # the run's header names where its outputs go
