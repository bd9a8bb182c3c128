"""Merging 1,000 nodes: under 30 s, a report.html under 20 MB, and the report opens in a browser.

1,000 synthetic 8-GPU nodes (tests/cluster_runs.py, about 190 KB of results.json each, 11 with a
planted slow HBM) are merged once per session by the command a user runs. The bound is the issue's:
30 s; it is checked on the merge's CPU time (user + system of the child process), which is what the
merge itself costs whatever else runs on the machine (it is single-threaded, so on an idle machine
wall time is the same; 17.8 s was measured on the 2-core development machine, 35 s before results files
were checked with jsonschema-rs). Headless Chromium then opens the report offline, as
tests/test_report_browser.py opens a run's report.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_runs import node_results, write_node
from report_runs import shared
from test_cluster_merge import schema_errors
from test_report_browser import CHROMIUM, CSS_URL, RESOURCE_ATTR, chromium, console_errors, page_requests

from torchrun_job import ROOT, job_env

pytestmark = pytest.mark.slow

NODES = 1000
SLOW_EVERY = 97
"""Every 97th node has one GPU with half the HBM bandwidth: 11 excluded nodes."""
LIMIT_S = 30.0
MAX_REPORT_BYTES = 20 * 1024 * 1024


TEMPLATES = 16
"""Healthy nodes are written from this many distinct runs (each its own noise), renamed: writing 1,000 files takes
a second or two instead of building and encoding 1,000 runs."""


def make_thousand(target: Path) -> None:
    nodes, run_id = target / "nodes", target.name
    healthy = []
    for t in range(TEMPLATES):
        results = node_results("gpuHOST", t)
        results["run_id"] = run_id
        healthy.append(json.dumps(results, indent=2))
    for i in range(NODES):
        host = f"gpu{i:04d}"
        if i % SLOW_EVERY == 0:
            write_node(nodes, host, node_results(host, i, {("hbm_bandwidth_tbps", 2): 0.5}))
            continue
        t = i % TEMPLATES  # its GPUs' serials made its own, as node_results(host, i) numbers them
        text = healthy[t].replace("gpuHOST", host).replace(f'"1654{t:05d}', f'"1654{i:05d}')
        (nodes / host).mkdir(parents=True)
        (nodes / host / "results.json").write_text(text)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "clustergate.report", "merge",
                           *sorted(str(p) for p in (target / "nodes").iterdir()), "-o", str(target / "run"),
                           "--expect-hosts", f"gpu[0000-{NODES - 1:04d}]"],
                          cwd=ROOT, env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    (target / "merge.json").write_text(json.dumps({"status": proc.returncode, "output": proc.stdout,
                                                   "cpu_s": cpu, "wall_s": wall}))


@pytest.fixture(scope="session")
def thousand(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared(tmp_path_factory, "cluster-1000", make_thousand)


def test_merging_1000_nodes_is_fast_and_small(thousand: Path) -> None:
    merged = json.loads((thousand / "merge.json").read_text())
    print(f"merge of {NODES} nodes: {merged['cpu_s']:.1f} s CPU, {merged['wall_s']:.1f} s wall")
    assert merged["status"] == 1, merged["output"]
    assert merged["cpu_s"] < LIMIT_S, merged
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
    assert dom.count('src="data:image/png;base64,') >= 20
