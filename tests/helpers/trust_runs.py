"""One real complete node run, made once per session and shared by the contract's tests.

README's command 1 exactly (``clustergate run``: the cpu profile on 2 ranks, level standard), as one node of a
cluster run: ``CLUSTERGATE_RUN_ID=run-trust``, node name
``cg-a``, into ``REPORTS/run-trust/nodes/cg-a``. The tests of the manifest, merge, sign-off, calibrate and
the re-render craft their inputs from its results.json (renamed hosts, narrowed copies) rather than start
more torchrun jobs.

Where ``CLUSTERGATE_TEST_NODE_RUN`` names a folder, that run is taken instead of making one: CI runs README's
command 1 as this node (the two variables above, ``--report-dir FOLDER/reports/run-trust/nodes/cg-a``, its
output in FOLDER/output.txt and exit status in FOLDER/status) before the suite's own tests, and the same run
need not be made twice on its two cores. A folder that is not such a run is an error naming what is wrong.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from report_runs import shared

from torchrun_job import ROOT, job_env

RUN_ID = "run-trust"
HOST = "cg-a"
COMMAND = ["clustergate", "run"]
"""README's command 1 (clustergate is run as ``python -m clustergate``, the same program)."""


GIVEN_RUN = "CLUSTERGATE_TEST_NODE_RUN"
"""A folder that holds this run made already (the module's docstring says how)."""


def given_run_problem(folder: Path) -> str | None:
    """What keeps ``folder`` from being this run, or None."""
    for part in ("status", "output.txt", f"reports/{RUN_ID}/nodes/{HOST}/results.json"):
        if not (folder / part).is_file():
            return f"it has no {part}"
    results = json.loads((folder / "reports" / RUN_ID / "nodes" / HOST / "results.json").read_text())
    hosts = sorted({node.get("host") for node in results.get("nodes", [])})
    if results.get("run_id") != RUN_ID or hosts != [HOST]:
        return f"its run is {results.get('run_id')!r} on {hosts}, not {RUN_ID!r} on [{HOST!r}]"
    if (results.get("profile"), results.get("level"), results.get("world_size")) != ("cpu", "standard", 2):
        return (f"it ran profile {results.get('profile')!r}, level {results.get('level')!r} on "
                f"{results.get('world_size')} ranks, not README's command 1 (cpu, standard, 2)")
    return None


def make_node_run(target: Path) -> None:
    if given := os.environ.get(GIVEN_RUN):
        if (problem := given_run_problem(Path(given))) is not None:
            raise RuntimeError(f"{GIVEN_RUN}={given} is not README's command 1 run as node {HOST} of {RUN_ID}: "
                               f"{problem} (unset it and the tests make the run themselves)")
        shutil.copytree(given, target, dirs_exist_ok=True)
        return
    report = target / "reports" / RUN_ID / "nodes" / HOST
    argv = [sys.executable, "-m", *COMMAND, "--report-dir", str(report)]
    # A hang guard only: the whole suite on 2 CPU ranks takes 1-3 minutes on CI's 2 busy cores.
    env = job_env({"CLUSTERGATE_RUN_ID": RUN_ID, "CLUSTERGATE_NODE_NAME": HOST})
    del env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"]  # as a user types it: the checkout's pytest configuration turns it off
    proc = subprocess.run(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=900)
    (target / "output.txt").write_text(proc.stdout)
    (target / "status").write_text(str(proc.returncode))


@pytest.fixture(scope="session")
def node_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report directory of the shared run (REPORTS/run-trust/nodes/cg-a)."""
    return shared(tmp_path_factory, "trust-node", make_node_run) / "reports" / RUN_ID / "nodes" / HOST


def recorded(node_run: Path) -> dict[str, Any]:
    """A fresh copy of the shared run's results.json, to change."""
    return copy.deepcopy(json.loads((node_run / "results.json").read_text()))


def as_node(results: dict[str, Any], host: str, run_id: str = RUN_ID) -> dict[str, Any]:
    """The run's results as another node's: its host renamed everywhere a node's name is recorded."""
    text = json.dumps(results).replace(f'"{HOST}"', json.dumps(host))
    out = json.loads(text)
    out["run_id"] = run_id
    return out


def write_node(run_dir: Path, host: str, results: dict[str, Any]) -> Path:
    """``results`` as RUN_DIR/nodes/HOST/results.json."""
    directory = run_dir / "nodes" / host
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(results, indent=2))
    return directory
