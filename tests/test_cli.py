"""The ``clustergate`` command: every subcommand listed, each cluster command handed its arguments unchanged,
``run`` as the torchrun command it executes, and exit statuses 0/1/2 (never pytest's 3).

A real ``clustergate run`` from an installed wheel is in tests/test_packaging.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import clustergate
from clustergate import cli
from clustergate.thresholds import shipped_thresholds

from torchrun_job import ROOT, job_env

COMMANDS = ("run", "merge", "signoff", "render", "calibrate")


def test_help_lists_every_command_and_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"    {name}" in out for name in COMMANDS), out
    assert "0 accepted, 1 not accepted, 2 input that cannot be used" in out and "never 3" in out
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"clustergate {clustergate.__version__}"


def test_no_command_or_an_unknown_one_is_unusable_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "name a command: run, merge, signoff, render, calibrate" in capsys.readouterr().err
    assert cli.main(["sign-off"]) == 2
    assert "invalid choice: 'sign-off'" in capsys.readouterr().err


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
    assert "clustergate.report" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["render", "--help"])
    assert exc.value.code == 0 and "--thresholds" in capsys.readouterr().out


def test_run_is_torchrun_on_this_node_over_the_packaged_suite(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--nproc-per-node", "3", "-k", "world", "--print-command", "--level", "quick",
                     "--", "--print-command"]) == 0
    cmd = capsys.readouterr().out.split()
    suite = str(ROOT / "acceptance")
    assert cmd == ["PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node=3", "-m", "pytest", "-c", str(ROOT / "clustergate" / "run.ini"), "--rootdir",
                   str(ROOT), "-p", "html", "-p", "metadata", "-p", "clustergate", suite,
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
    ini.read(cli.RUN_INI)
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
    assert cli.local_gpu_count() == 8
    assert cli.main(["run", "--print-command"]) == 0 and "--nproc-per-node=8" in capsys.readouterr().out
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # torch's rules: no GPU (this machine has none either way)
    assert cli.local_gpu_count() == 0
    assert cli.main(["run", "--print-command"]) == 0 and "--nproc-per-node=2" in capsys.readouterr().out

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=no_driver))
    assert cli.local_gpu_count() == 0
