"""clustergate's rooms import one way: import-linter's contracts (pyproject.toml, [tool.importlinter]) hold, and
they bite: a planted import that runs back up a floor or across run's sub-rooms, a planted circle inside a room, and
a workload that imports clustergate or pytest, each break one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_job import ROOT

LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    # A hang guard only: the linter reads some 120 files in a second or two.
    return subprocess.run([str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")], cwd=root, text=True,
                          capture_output=True, timeout=300, env={"PATH": str(Path(sys.executable).parent),
                                                                 "PYTHONPATH": str(root)})


pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter is not installed: pip install -e '.[test]'")


def test_the_rooms_import_one_way_and_no_room_holds_a_circle() -> None:
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 4 kept, 0 broken." in proc.stdout, proc.stdout


@pytest.mark.parametrize(("planted", "broken"), [
    # criteria is below run: a criterion that imported the run would run back up four floors
    (("criteria/sources.py", "from clustergate.run import limits  # noqa\n"), "each importing only the rooms below"),
    # report/html imports report/markup: markup importing html closes a circle
    (("report/markup.py", "from clustergate.report import html  # noqa\n"), "no circle among the modules"),
    # inside run, the launcher and the ranks stand side by side: the launcher reaching a rank's world runs across
    (("run/launch/command_note.py", "from clustergate.run.ranks import world  # noqa\n"), "the run's sub-rooms"),
    # a workload runs as plain Python under any launcher: neither the suite nor pytest
    (("../workloads/clocks.py", "import pytest  # noqa\n"), "the workloads import neither"),
    (("../workloads/gpu/matmul.py", "from clustergate.common import numbers  # noqa\n"),
     "the workloads import neither"),
])
def test_an_upward_import_or_a_circle_breaks_a_contract(tmp_path: Path, planted: tuple[str, str], broken: str) -> None:
    copy = tmp_path / "checkout"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    for room in ("clustergate", "workloads"):
        shutil.copytree(ROOT / room, copy / room, ignore=shutil.ignore_patterns("__pycache__"))
    path, line = planted
    with open(copy / "clustergate" / path, "a") as f:
        f.write(line)
    proc = lint(copy)
    assert proc.returncode != 0, proc.stdout
    assert f"{broken}" in proc.stdout and "BROKEN" in proc.stdout, proc.stdout
