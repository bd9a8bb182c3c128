"""The README's first day, as a newcomer without a GPU follows it: the rehearsal on one machine, run as written.

The block under "Rehearsing the first day on one machine" is taken from README.md and run by bash from the
checkout, as it stands but for two words: ``REPORTS`` (a folder of the test's own) and the fabric phase's port (a
free one: other jobs may hold 29500). Every command in it is real: three calibration runs, calibrate with
``--extends cpu`` at its CPU default, the node phase under the site file named by ``--thresholds`` alone, merge,
the fabric phase of one torchrun agent per accepted node at 127.0.0.1, and the sign-off. The steps' own commands
(the GPU cluster's) are held to the rehearsal where the two must agree: the calibration runs name no site file that
does not exist yet, and the file calibrate writes is the one every later phase is given.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clustergate.report.signoff_words import DRY_RUN

from torchrun_job import ROOT, free_port, job_env

pytestmark = pytest.mark.slow

README = ROOT / "README.md"


def section(heading: str) -> str:
    """The README's text under ``heading`` (a ## or ### heading), up to the next heading of any level."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(r"^#{2,3} ", text[start:], re.M)
    return text[start:start + following.start()] if following else text[start:]


def code_blocks(text: str) -> list[str]:
    """Each indented code block of ``text``: a run of lines indented four spaces or more (a list item's prose goes on
    at three), dedented by the block's first line's indentation."""
    blocks: list[list[str]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("    ") and line.strip():
            if not (previous.startswith("    ") and previous.strip()):
                blocks.append([])
            blocks[-1].append(line)
        previous = line
    margins = [len(b[0]) - len(b[0].lstrip()) for b in blocks]
    return ["\n".join(line[margin:] for line in block) for block, margin in zip(blocks, margins, strict=True)]


def rehearsal() -> str:
    [block] = code_blocks(section("### Rehearsing the first day on one machine"))
    return block


def first_day_commands() -> list[str]:
    """The commands of the first day's steps, one string each (continuation lines joined)."""
    return [re.sub(r"\s*\\\n\s*", " ", block) for block in code_blocks(section("## First day: signing off a cluster"))]


def test_the_steps_calibrate_before_any_phase_names_the_site_file() -> None:
    """Step 2's calibration runs name no file that does not exist yet; the file its calibrate command writes is the
    one the node phase, merge, fabric phase and sign-off are each given with --thresholds, and nothing more (no
    --profile: the site profile is chosen by the file alone)."""
    commands = first_day_commands()
    calibration_run, calibrate = commands[0], commands[1]
    assert calibration_run.startswith("CLUSTERGATE_RUN_ID=calibration torchrun ") and "--thresholds" not in \
        calibration_run, calibration_run
    assert calibrate.startswith("clustergate calibrate REPORTS/calibration/*/results.json ")
    site = calibrate.split(" -o ", 1)[1].split()[0]
    phases = commands[2:6]  # node phase, merge, fabric phase, sign-off
    assert [c.split()[1 if c.startswith("CLUSTERGATE_RUN_ID") else 0] for c in phases] == [
        "torchrun", "clustergate", "torchrun", "clustergate"], phases
    for command in phases:
        assert f"--thresholds {site}" in command and "--profile" not in command, command


def test_the_readme_rehearsal_signs_off_two_cpu_nodes(tmp_path: Path) -> None:
    block = rehearsal()
    assert block.startswith("REPORTS=reports ") and "127.0.0.1:29500" in block, block
    script = block.replace("REPORTS=reports ", f"REPORTS={tmp_path} ", 1)
    script = script.replace("127.0.0.1:29500", f"127.0.0.1:{free_port()}")
    env = job_env({"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])})
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD")  # as a user types it: the checkout's pytest configuration does it
    # A hang guard only: five quick node runs of one rank and a fabric phase of two agents take minutes on 2 cores.
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=2400)
    output = proc.stdout
    assert proc.returncode == 0, output[-6000:]

    site = tmp_path / "site-thresholds.yaml"
    written = yaml.safe_load(site.read_text())
    assert written["cpu_profile"] == "cpu-site" and list(written["profiles"])[0] == "cpu-site"
    assert f"use it: --thresholds {site} on every phase\n" in output
    for name in ("cg-1", "cg-2"):  # --thresholds alone chose the site profile
        node = json.loads((tmp_path / "rehearsal" / "nodes" / name / "results.json").read_text())
        assert (node["verdict"], node["profile"], node["level"]) == ("accept", "cpu-site", "quick"), node["reason"]
    merged = json.loads((tmp_path / "rehearsal" / "results.json").read_text())
    assert merged["accepted"] == ["cg-1", "cg-2"] and merged["dry_run"] is True
    fabric = json.loads((tmp_path / "rehearsal" / "fabric" / "results.json").read_text())
    assert fabric["verdict"] == "accept" and sorted(n["host"] for n in fabric["nodes"]) == ["cg-1", "cg-2"]
    out = json.loads((tmp_path / "rehearsal" / "signoff.json").read_text())
    assert (out["verdict"], out["profile"], out["dry_run"], out["accepted"]) == ("accept", "cpu-site", True,
                                                                                 ["cg-1", "cg-2"])
    assert f"SIGNED OFF: 2 hosts accepted, 0 excluded ({DRY_RUN})" in output
    said = "The sign-off's first line says `SIGNED OFF: 2 hosts accepted, 0 excluded (DRY RUN, no GPU: ...)`."
    assert said in " ".join(section("### Rehearsing the first day on one machine").split())


def test_the_readme_says_what_plain_torchrun_prints_around_a_failure(tmp_path: Path) -> None:
    """Next to the exit table the README says what plain torchrun adds to a rank's failure: its exit status 1, its
    ChildFailedError traceback, and a summary whose Root Cause gives the rank's exitcode (the table's). A bad option
    under real torchrun shows each."""
    readme = " ".join(section("## Everyday commands").split())
    for said in ("it exits 1 whenever a rank exits other than 0", "ChildFailedError", '"Root Cause"', "`exitcode`",
                 "`clustergate run` reads them for you and exits by the table"):
        assert said in readme, said
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                           "pytest", "acceptance", "--profile", "no-such-profile", "--report-dir", str(tmp_path)],
                          cwd=ROOT, env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=600)  # a hang guard: the ranks stop at start-up
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "ChildFailedError" in proc.stdout and "Root Cause (first observed failure)" in proc.stdout
    assert re.search(r"exitcode\s*: 2 ", proc.stdout), proc.stdout[-3000:]
