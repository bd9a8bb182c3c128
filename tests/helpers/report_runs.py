"""Runs the report's tests share: each is made once per session, even across pytest-xdist workers.

- ``no_tests``: the shipped ``acceptance/test_world.py`` at world size 1 with nothing selected (the plugin sets
  the run error at sessionfinish). (The whole suite, run once, is ``trust_runs.node_run``.)
- ``demo_reject``: ``tests/data/report/demo_acceptance.py`` on 2 ranks under torchrun with a planted
  slow rank, a workload that prints a secret, and secrets in the environment and pytest-metadata.
- ``demo_baseline``: the demo again, every figure 20% higher, with ``--baseline`` the reject run.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from forked_pytest import pytest_forked
from report_results import RESULTS

from clustergate.record.resultsfile import schema_problems

from torchrun_job import ROOT, job_env, run_job

DATA = ROOT / "tests" / "data" / "report"
SECRET = "s3cr3t-4f9a-planted-token-value"
"""Planted in MY_API_TOKEN, HF_TOKEN's neighbour and --metadata: must never reach report.html."""
HF_SECRET = "hf_planted_0123456789abcdef"


def shared_path(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The folder of the session's shared run ``name``: the same for every xdist worker (pytest-xdist's recipe)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    return root / f"report-run-{name}"


def shared(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """``make(dir)`` once per session; xdist workers share the result (pytest-xdist's recipe)."""
    target = shared_path(tmp_path_factory, name)
    with FileLock(str(target) + ".lock"):
        if not (target / ".done").exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            make(target)
            (target / ".done").touch()
    return target


def _world_size_1(target: Path, *args: str) -> None:
    """``pytest acceptance/test_world.py`` from the checkout (its conftest.py enables the plugin), in a process of its
    own forked from the server that has imported torch (tests/helpers/forked_pytest.py)."""
    run = pytest_forked(ROOT, job_env(), ["acceptance/test_world.py", "--report-dir", str(target / "report"), *args],
                        target)
    (target / "output.txt").write_text("\n".join([*run.outlines, *run.errlines]))
    (target / "status").write_text(str(int(run.ret)))


def make_no_tests(target: Path) -> None:
    _world_size_1(target, "-k", "no_such_test")


def _demo(target: Path, env: dict[str, str], *args: str) -> None:
    shutil.copy(DATA / "demo_acceptance.py", target / "demo_acceptance.py")
    shutil.copy(DATA / "thresholds.yaml", target / "thresholds.yaml")
    job = run_job(target, ["demo_acceptance.py", "--thresholds", "thresholds.yaml", *args], nproc=2, env=env)
    (target / "output.txt").write_text(job.output)
    (target / "status").write_text(str(max(job.codes)))


def make_demo_reject(target: Path) -> None:
    _demo(target, {"REPORT_DEMO_FAIL": "1", "MY_API_TOKEN": SECRET, "HF_TOKEN": HF_SECRET},
          "--metadata", "MY_API_TOKEN", SECRET)


def results(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report" / "results.json").read_text())


def schema_errors(data: dict[str, Any]) -> list[str]:
    """Every way ``data`` breaks clustergate/results.schema.json (the report command's own check)."""
    return schema_problems(data)


@pytest.fixture(scope="session")
def no_tests_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared(tmp_path_factory, "no-tests", make_no_tests)


@pytest.fixture(scope="session")
def demo_reject(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared(tmp_path_factory, "demo-reject", make_demo_reject)


@pytest.fixture(scope="session")
def demo_baseline(tmp_path_factory: pytest.TempPathFactory, demo_reject: Path) -> Path:
    base = demo_reject / "report" / "results.json"
    return shared(tmp_path_factory, "demo-baseline",
                  lambda target: _demo(target, {"REPORT_DEMO_SCALE": "1.2"}, "--baseline", str(base)))


# ---- a run whose shown values carry markup (the report's escaping, and the browser that opens it) ----------------
MARKUP = "<img src=x onerror=document.title='pwned'>"
"""What a hostile value plants: script that renames the page when the browser inserts it as HTML."""
ESCAPED = "&lt;img src=x onerror=document.title=&#x27;pwned&#x27;&gt;"

MARKED_TEST = f'''
import pytest


@pytest.mark.parametrize("part", ["plain", "x{MARKUP}"])
def test_named(part, extras):
    from pytest_html import extras as kinds
    extras.append(kinds.html("<b>bold</b>{MARKUP}"))
    extras.append(kinds.url("javascript:document.title='pwned'", name="{MARKUP}"))
'''


def make_marked_run(target: Path) -> None:
    """A live run at world size 1 whose NCCL_* value, metadata, test id and extras carry markup."""
    (target / "test_marked.py").write_text(MARKED_TEST)
    run = pytest_forked(target, job_env({"NCCL_SOCKET_IFNAME": MARKUP}),
                        ["-p", "clustergate", "-p", "no:cacheprovider", "--rootdir", str(target), "--report-dir",
                         str(target / "report"), "test_marked.py", "--metadata", "site", MARKUP], target)
    (target / "output.txt").write_text("\n".join([*run.outlines, *run.errlines]))


@pytest.fixture(scope="session")
def marked_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared(tmp_path_factory, "marked", make_marked_run)


def marked_results() -> dict[str, Any]:
    """A recorded run whose host names, environment, test id and message carry markup (an edited file)."""
    r = copy.deepcopy(RESULTS)
    r["nodes"][1]["host"] = "node-1" + MARKUP
    r["environment"]["host"] = "n" + MARKUP
    r["environment"]["NCCL_SOCKET_IFNAME"] = MARKUP
    r["tests"][2]["nodeid"] = f"acceptance/test_hbm.py::test_hbm[{MARKUP}]"
    r["tests"][0]["message"] += "\n" + MARKUP
    return r


def rerender(tmp_path: Path) -> Path:
    path, out = tmp_path / "results.json", tmp_path / "rerendered.html"
    path.write_text(json.dumps(marked_results()))
    proc = subprocess.run([sys.executable, "-m", "clustergate", "render", str(path), "-o", str(out)], cwd=ROOT,
                          env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert out.is_file(), proc.stdout
    return out
