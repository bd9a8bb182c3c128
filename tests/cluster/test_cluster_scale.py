"""Merging 1,000 nodes: every node judged, the excluded named, a report.html under 20 MB that opens in a browser.

1,000 synthetic 8-GPU nodes (tests/helpers/cluster_runs.py, about 300 KB of results.json each, 11 with a planted slow
HBM) are merged once per session by the command a user runs. How long that takes is measured by
benchmarks/merge_time.py, not asserted here: CI's machine is shared, and a test of the merge's outcome must not
fail on a busy one. Headless Chromium then opens the report offline, as tests/report/test_report_browser.py opens a
run's report."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser import CHROMIUM, CSS_URL, RESOURCE_ATTR, chromium, console_errors, page_requests
from cluster_runs import schema_errors, write_fleet
from report_runs import shared

from torchrun_job import ROOT, job_env

pytestmark = pytest.mark.slow

NODES = 1000
SLOW_EVERY = 97
"""Every 97th node has one GPU with half the HBM bandwidth: 11 excluded nodes."""
MAX_REPORT_BYTES = 20 * 1024 * 1024


def make_thousand(target: Path) -> None:
    write_fleet(target / "nodes", NODES, SLOW_EVERY)
    proc = subprocess.run([sys.executable, "-m", "clustergate", "merge",
                           *sorted(str(p) for p in (target / "nodes").iterdir()), "-o", str(target / "run"),
                           "--expect-hosts", f"gpu[0000-{NODES - 1:04d}]"],
                          cwd=ROOT, env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=600)  # a hang guard: the merge takes about 20 s on an idle 2-core machine
    (target / "merge.json").write_text(json.dumps({"status": proc.returncode, "output": proc.stdout}))


@pytest.fixture(scope="session")
def thousand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared(tmp_path_factory, "cluster-1000", make_thousand)


def test_merging_1000_nodes_names_every_excluded_node_in_a_small_report(thousand: Path) -> None:
    merged = json.loads((thousand / "merge.json").read_text())
    assert merged["status"] == 1, merged["output"]
    report = thousand / "run" / "report.html"
    assert report.stat().st_size < MAX_REPORT_BYTES
    cluster = json.loads((thousand / "run" / "results.json").read_text())
    assert schema_errors(cluster) == []
    slow = [f"gpu{i:04d}" for i in range(0, NODES, SLOW_EVERY)]
    assert [e["host"] for e in cluster["excluded"]] == slow and len(cluster["accepted"]) == NODES - len(slow)
    assert (thousand / "run" / "excluded-hostlist.txt").read_text().strip() == f"gpu[{','.join(h[3:] for h in slow)}]"
    accepted = (thousand / "run" / "accepted-hostlist.txt").read_text().strip()
    assert accepted.startswith("gpu[0001-0096,0098-0193,") and len(accepted) < 200
    hbm = next(f for f in cluster["fleet"] if f["metric"] == "hbm_bandwidth_tbps")
    assert hbm["count"] == 8 * NODES and sorted({o["host"] for o in hbm["outliers"]}) == slow


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed: apt-get install chromium "
                                             "(.ci/run installs it)")
def test_1000_node_report_opens_offline_in_a_browser(thousand: Path, tmp_path: Path) -> None:
    report = thousand / "run" / "report.html"
    text = report.read_text()
    assert RESOURCE_ATTR.search(text) is None and CSS_URL.search(text) is None
    run = chromium(report.as_uri(), tmp_path / "profile", "--dump-dom")
    assert run.returncode == 0, run.stderr[-3000:]
    assert page_requests(run.stderr) == [] and console_errors(run.stderr) == []
    dom = run.stdout
    verdict = re.search(r'id="cg-verdict"><div class="cg-verdict">(\w+)</div>', dom)
    assert verdict is not None and verdict.group(1) == "REJECT"
    nodes = dom[dom.index("<h3>Nodes</h3>"):dom.index("<h3>Fleet distributions</h3>")]
    assert nodes.count("<tr") == 1 + NODES
    assert dom.count('src="data:image/svg+xml;base64,') >= 20


def test_the_merged_record_references_each_node_file_and_stays_small_per_node(thousand: Path) -> None:
    """The merged results.json names each node file by its directory and sha256 rather than copying its figures (no
    per-GPU samples, no per-node figure table): a bounded size a node, so that 100,000 nodes stay well under the
    512 MiB its readers take."""
    run = thousand / "run"
    text = (run / "results.json").read_text()
    cluster = json.loads(text)
    assert len(cluster["nodes"]) == NODES
    for node in cluster["nodes"][::97]:
        raw = (run / node["directory"] / "results.json").read_bytes()
        assert node["digest"] == "sha256:" + hashlib.sha256(raw).hexdigest()
        assert "worst" not in node
    for fm in cluster["fleet"]:
        assert "samples" not in fm and len(fm["histogram"]["counts"]) <= 40
        assert sum(fm["histogram"]["counts"]) == fm["count"]
    # About 0.6 KB a healthy node (its row, its name in the host lists); the excluded carry their reasons and steps.
    assert len(text) / NODES < 1500, len(text) / NODES
    assert len(text) / NODES * 100_000 < 512 * 1024 * 1024 / 3
