"""clustergate built as a wheel and installed in a fresh virtual environment, as a user installs it.

An unrelated project's pytest in that environment never sees the plugin (its pytest11 entry point is only a
switch), and the wheel carries thresholds.yaml and the acceptance suite, so ``clustergate run`` works from
any directory. Time bounds here are hang guards (several times each step on 2 busy cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_job import ROOT

pytestmark = pytest.mark.slow  # builds a wheel and two virtual environments

SKIP = shutil.ignore_patterns(".git", "tests", "reports", "build", "dist", "*.egg-info", "__pycache__", ".venv",
                              ".peers", ".whl", "benchmarks", "launch")


def _env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH to the checkout, no pytest settings of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH", "RANK", "LOCAL_RANK",
                                                                   "WORLD_SIZE", "CLUSTERGATE_"))}
    return {**env, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **extra}


def _sh(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{' '.join(map(str, proc.args))} exited {proc.returncode}:\n" \
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the checkout (a build writes build/ and *.egg-info where it runs)."""
    work = tmp_path_factory.mktemp("build")
    src = work / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=SKIP)
    _ok(_sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"),
             str(src)], work))
    [built] = (work / "dist").glob("clustergate-*.whl")
    return built


def _venv(where: Path, *, system: bool) -> Path:
    _ok(_sh([sys.executable, "-m", "venv", *(["--system-site-packages"] if system else []), str(where)], where.parent))
    return where / "bin"


@pytest.fixture(scope="module")
def bare_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment of its own: pytest, pytest-xdist and the wheel (without its dependencies: the
    plugin's torch is never imported where it is not asked for)."""
    bin_dir = _venv(tmp_path_factory.mktemp("bare") / "venv", system=False)
    _ok(_sh([str(bin_dir / "pip"), "install", "-q", "pytest", "pytest-xdist"], bin_dir))
    _ok(_sh([str(bin_dir / "pip"), "install", "-q", "--no-deps", str(wheel)], bin_dir))
    return bin_dir


@pytest.fixture(scope="module")
def full_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel over this interpreter's packages (torch and the rest): the wheel's own files come first."""
    bin_dir = _venv(tmp_path_factory.mktemp("full") / "venv", system=True)
    _ok(_sh([str(bin_dir / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)], bin_dir))
    return bin_dir


def _left(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.relative_to(root).parts[0] not in (".pytest_cache", "__pycache__")}


def test_an_unrelated_project_never_sees_the_plugin(bare_env: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    python = str(bare_env / "python")
    for args in ([], ["-n", "2"], ["--help"]):
        proc = _ok(_sh([python, "-m", "pytest", *args], project, timeout=300))
        if args != ["--help"]:
            said = [line for line in (proc.stdout + proc.stderr).splitlines() if "clustergate" in line
                    and not line.startswith("plugins:")]  # pytest lists every installed plugin distribution there
            assert not said, proc.stdout
            assert "1 passed" in proc.stdout
        assert _left(project) == {"test_one.py"}, f"pytest {args} left {_left(project)}"  # no reports/, no lock
    listed = _ok(_sh([python, "-m", "pytest", "--help"], project)).stdout
    assert "--clustergate" in listed and "--thresholds" not in listed  # the switch, and none of the plugin's options


def _plant_plugin(bin_dir: Path, mark: Path) -> list[Path]:
    """A pytest plugin installed in the environment, as another package brings one: it writes ``mark`` when
    pytest loads it. Returns what to remove."""
    purelib = Path(_ok(_sh([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           bin_dir)).stdout.strip())
    module = purelib / "cg_planted_plugin.py"
    module.write_text(f"def pytest_configure(config):\n    open({str(mark)!r}, 'w').write('loaded')\n")
    info = purelib / "cg_planted-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cg-planted\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nplanted = cg_planted_plugin\n")
    return [module, info]


def test_the_wheel_runs_its_packaged_suite_from_any_directory(full_env: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mark = tmp_path / "planted-plugin-loaded"
    planted = _plant_plugin(full_env, mark)
    try:
        _ran_the_packaged_suite(full_env, tmp_path, elsewhere)
        assert not mark.exists(), "clustergate run loaded a pytest plugin it was not asked for"
        (elsewhere / "test_x.py").write_text("def test_x():\n    pass\n")
        _ok(_sh([str(full_env / "python"), "-m", "pytest", "-q", "test_x.py", "-p", "no:cacheprovider"], elsewhere))
        assert mark.read_text() == "loaded"  # the planted plugin is live in every other pytest run
    finally:
        for path in planted:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _ran_the_packaged_suite(full_env: Path, tmp_path: Path, elsewhere: Path) -> None:
    cli = str(full_env / "clustergate")
    assert _ok(_sh([cli, "--version"], elsewhere)).stdout.startswith("clustergate ")
    helped = _ok(_sh([str(full_env / "python"), "-m", "clustergate", "--help"], elsewhere)).stdout
    assert all(name in helped for name in ("run", "merge", "signoff", "render", "calibrate", "health"))
    # The shipped thresholds, no torch: the profile is chosen (cpu), which judges nothing health can read on a CPU
    # machine, and a check of nothing is never healthy (exit 4, could not run).
    checked = _sh([cli, "health", "--json"], elsewhere)
    health = json.loads(checked.stdout)
    assert checked.returncode == 4 and (health["status"], health["profile"]) == ("could not run", "cpu"), health
    collected = _sh([cli, "run", "--nproc-per-node", "1", "--co", "-q", "--report-dir", str(tmp_path / "co")],
                    elsewhere, timeout=300)
    assert "acceptance/test_world.py::test_world_matches_profile" in collected.stdout, collected.stdout[-3000:]
    report = tmp_path / "report"
    proc = _sh([cli, "run", "--nproc-per-node", "1", "-k", "test_world_matches_profile", "--level", "quick",
                "--report-dir", str(report)], elsewhere, timeout=300)
    shipped = full_env.parent / "lib"
    assert f"clustergate: profile cpu ({shipped}" in proc.stdout and "thresholds.yaml), level quick" in proc.stdout
    results = json.loads((report / "results.json").read_text())
    assert [t["outcome"] for t in results["tests"]] == ["passed"], proc.stdout[-4000:] + proc.stderr[-2000:]
    # The wheel carries the suite's manifest: one test of it is a partial run, exit 1, never an accept.
    assert proc.returncode == 1 and results["verdict"] == "partial" and results["selection"]["suite"] == "acceptance"
    assert "88 of the 89 tests of a complete node run did not run (-k 'test_world_matches_profile')" \
        in results["reason"]
    assert (report / "report.html").stat().st_size > 0  # pytest-html, loaded by clustergate: autoload is off
    # The wheel's own files, checked against its RECORD; only the suite's plugins (the planted one stayed out).
    attested = results["attestation"]
    assert (attested["reference"], attested["modified"], attested["extra"], attested["missing"]) == \
        ("RECORD", [], [], []), attested
    assert all(p["suite"] for p in attested["plugins"]) and attested["problems"] == [], attested
    assert not (elsewhere / "reports").exists()  # --report-dir given: nothing of ours where it ran
