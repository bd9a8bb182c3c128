"""clustergate built as a wheel and installed in a fresh virtual environment, as a user installs it.

An unrelated project's pytest in that environment never sees the plugin (its pytest11 entry point is only a
switch), and the wheel carries thresholds.yaml and the acceptance suite, so ``clustergate run`` works from
any directory. Time bounds here are hang guards (several times each step on 2 busy cores).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from complete_runs import NODE_TESTS
from docker_context import copy_context

pytestmark = pytest.mark.slow  # builds a wheel and two virtual environments

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
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Dockerfile's build context (.dockerignore's rules): the wheel is built from it, as the image builds it,
    and its launch/ is the image's."""
    return copy_context(tmp_path_factory.mktemp("context") / "src")


@pytest.fixture(scope="module")
def wheel(context: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the build context (a build writes build/ and *.egg-info where it runs)."""
    work = tmp_path_factory.mktemp("build")
    src = work / "src"
    shutil.copytree(context, src, symlinks=True)
    _ok(_sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"),
             str(src)], work))
    [built] = (work / "dist").glob("clustergate-*.whl")
    return built


def _venv(where: Path) -> Path:
    _ok(_sh([sys.executable, "-m", "venv", str(where)], where.parent))
    return where / "bin"


def _outer_site_dirs() -> list[str]:
    """Where this interpreter's packages are (torch and the rest): its site directories, a virtual environment's
    own included. ``venv --system-site-packages`` would see only the base interpreter's, never an outer virtual
    environment's, where the README's commands install torch."""
    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    return [d for d in dict.fromkeys([*site.getsitepackages(), *user]) if Path(d).is_dir()]


@pytest.fixture(scope="module")
def bare_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment of its own: pytest, pytest-xdist and the wheel (without its dependencies: the
    plugin's torch is never imported where it is not asked for)."""
    bin_dir = _venv(tmp_path_factory.mktemp("bare") / "venv")
    _ok(_sh([str(bin_dir / "pip"), "install", "-q", "pytest", "pytest-xdist"], bin_dir))
    _ok(_sh([str(bin_dir / "pip"), "install", "-q", "--no-deps", str(wheel)], bin_dir))
    return bin_dir


@pytest.fixture(scope="module")
def full_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel over this interpreter's packages (torch and the rest, seen through a .pth file: no second torch
    installed): the wheel's own files come first, as the environment's own site directory precedes the lines of
    its .pth files on sys.path."""
    bin_dir = _venv(tmp_path_factory.mktemp("full") / "venv")
    _ok(_sh([str(bin_dir / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)], bin_dir))
    (_purelib(bin_dir) / "outer-packages.pth").write_text("".join(f"{d}\n" for d in _outer_site_dirs()))
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


def _purelib(bin_dir: Path) -> Path:
    """The site directory of the environment ``bin_dir`` belongs to."""
    return Path(_ok(_sh([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        bin_dir)).stdout.strip())


def test_run_without_torch_says_so_in_one_line(bare_env: Path, tmp_path: Path) -> None:
    """Where torch cannot be imported, ``clustergate run`` says so and why in one line, and could not run (4);
    its --help needs no torch."""
    cli = str(bare_env / "clustergate")
    proc = _sh([cli, "run", "--level", "quick"], tmp_path, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"clustergate run: torch cannot be imported in this Python ({bare_env / 'python'}")
    assert "ModuleNotFoundError: No module named 'torch'" in proc.stderr and "install it there" in proc.stderr
    assert "--print-command" in _ok(_sh([cli, "run", "--help"], tmp_path)).stdout
    assert _left(tmp_path) == set()  # nothing written: no reports/


def _plant_plugin(bin_dir: Path, mark: Path) -> list[Path]:
    """A pytest plugin installed in the environment, as another package brings one: it writes ``mark`` when
    pytest loads it. Returns what to remove."""
    purelib = _purelib(bin_dir)
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
    # The wheel carries the reference durations: the test's limit follows its measured time on one CPU rank.
    assert results["tests"][0]["limit"]["source"] == "reference", results["tests"][0]
    # The wheel carries the suite's manifest: one test of it is a partial run, exit 1, never an accept.
    assert proc.returncode == 1 and results["verdict"] == "partial" and results["selection"]["suite"] == "acceptance"
    assert f"{NODE_TESTS - 1} of the {NODE_TESTS} tests of a complete node run did not run " \
        "(-k 'test_world_matches_profile')" \
        in results["reason"]
    assert (report / "report.html").stat().st_size > 0  # pytest-html, loaded by clustergate: autoload is off
    # The wheel's own files, checked against its RECORD; only the suite's plugins (the planted one stayed out).
    attested = results["attestation"]
    assert (attested["reference"], attested["modified"], attested["extra"], attested["missing"]) == \
        ("RECORD", [], [], []), attested
    assert all(p["suite"] for p in attested["plugins"]) and attested["problems"] == [], attested
    assert not (elsewhere / "reports").exists()  # --report-dir given: nothing of ours where it ran


def test_node_sh_beside_an_installed_clustergate_runs_the_installed_suite(full_env: Path, context: Path,
                                                                          tmp_path: Path) -> None:
    """The container image's layout (the Dockerfile): launch/ alone in its directory, clustergate installed from the
    wheel. node.sh there runs the installed suite as ``clustergate run`` does: its tests are named
    ``acceptance/...`` as in a checkout, "acceptance" among the arguments names the installed package."""
    image = tmp_path / "opt" / "clustergate"
    shutil.copytree(context / "launch", image / "launch")
    report = tmp_path / "report"
    env = _env(CLUSTERGATE_NNODES="1", CLUSTERGATE_GPUS_PER_NODE="0", CLUSTERGATE_NPROC_PER_NODE="1",
               CLUSTERGATE_REPORT_DIR=str(report), CLUSTERGATE_PYTHON=str(full_env / "python"),
               CLUSTERGATE_NODE_NAME="image-node")
    proc = subprocess.run(["bash", "launch/node.sh", "acceptance", "-k", "test_world_matches_profile", "--level",
                           "quick"], cwd=image, env=env, capture_output=True, text=True, timeout=300)
    results = json.loads((report / "results.json").read_text())
    assert [(t["nodeid"], t["outcome"]) for t in results["tests"]] == [
        ("acceptance/test_world.py::test_world_matches_profile", "passed")], proc.stdout[-3000:] + proc.stderr[-3000:]
    # the wheel's suite: one test of its manifest is a partial run, exit 1 (the launcher passes torchrun's status on)
    assert proc.returncode == 1 and results["verdict"] == "partial" and results["selection"]["suite"] == "acceptance"
    assert (report / "report.html").stat().st_size > 0  # pytest-html, named with -p: autoload is off
    assert _left(image) == {"launch", *(f"launch/{p}" for p in _left(context / "launch"))}  # no reports/ written
