"""What merging a large fleet costs: ``clustergate merge`` of N synthetic 8-GPU nodes, timed as a user runs it.

The nodes are tests/helpers/cluster_runs.py's (about 300 KB of results.json each, the shape of a real 8-GPU node's,
every 97th with one slow GPU), written once into a temporary REPORTS/RUN_ID/nodes/; each repeat then runs the command in
a fresh process and takes its CPU seconds (user + system of the child: what the merge costs whatever else
runs on the machine; it is single-threaded) and its wall seconds.

    python benchmarks/merge_time.py                       # 1,000 nodes, 3 merges
    python benchmarks/merge_time.py --nodes 200 --repeats 1 --json merge.json

Run it with PYTHONPATH=OTHER_CHECKOUT to time another version on nodes written by that version (a node file
records the suite's digest, and a merge excludes a node of another version: that is another, slower path).
Each merge's peak resident memory is the child's ``ru_maxrss`` (what ``/usr/bin/time -v`` calls its maximum
resident set size).

Figures (issue 55.3; 2 cores shared with other test runs, load ~14: CPU seconds are the comparable figure,
wall seconds are inflated several times; one merge each, /usr/bin/time -v):

    nodes    before: CPU s, peak RSS, results.json     after: CPU s, peak RSS, results.json, report.html
    1,000    21.9 s, 868 MB, 21.2 MB                   21.5 s, 236 MB, 0.81 MB, 2.0 MB (22.1 s, 201 MB: 2nd step)
    10,000   136 s, 8.13 GB, 212 MB (issue 55's)       146.9 s, 1.27 GB, 7.2 MB, 3.0 MB (18 min wall at load 14)

Memory no longer holds each node's record: a node file is read once, its figures go into the fleet and what stays
is ``clustergate.cluster.node_facts``. Measured growth from 1,000 to 10,000 nodes: 114 KB a node of peak RSS (it
was 0.8 MB); keeping of a passed test only what the fleet's skips read then cut what a node holds from 96 to 67 KB
(tracemalloc over 150 nodes; after the 10,000-node figure). The merged record references each node file (directory,
sha256) and keeps each fleet metric's histogram: 0.72 KB a node. On paper at 100,000 nodes: 8-11 GB of memory
(67-114 KB a node), a merged record of about 75 MB (a seventh of the 512 MiB its readers take), a page of 2,000
node rows at most. CPU is unchanged by this step (each node file parsed strictly, schema-checked and its verdict
judged again: about 15-20 ms a node on this shared machine): the 60 CPU s budget at 10,000 nodes is not met yet.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from cluster_runs import write_fleet  # noqa: E402

from torchrun_job import job_env  # noqa: E402

SLOW_EVERY = 97


def merge_once(run_dir: Path, nodes: int) -> dict[str, float]:
    """One ``clustergate merge`` of every node under ``run_dir/nodes`` into a fresh output: its seconds and status."""
    out = Path(tempfile.mkdtemp(dir=run_dir, prefix="merged-"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "clustergate", "merge",
                           *sorted(str(p) for p in (run_dir / "nodes").iterdir()), "-o", str(out),
                           "--expect-hosts", f"gpu[0000-{nodes - 1:04d}]"],
                          env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"merge_time: the merge failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    merged = json.loads((out / "results.json").read_text())
    excluded = len(merged["excluded"])
    expected = len(range(0, nodes, SLOW_EVERY))
    if excluded != expected:  # a slower path (every node of another version) is not the one measured here
        raise SystemExit(f"merge_time: {excluded} nodes excluded where {expected} have a slow GPU: "
                         f"{merged['excluded'][0]['reasons'][:2]}")
    return {"cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "wall_s": wall,
            # The largest child's peak so far (KiB on Linux): each merge is a fresh process of about the same size.
            "peak_rss_mb": after.ru_maxrss / 1024,
            "status": proc.returncode, "report_bytes": (out / "report.html").stat().st_size,
            "results_bytes": (out / "results.json").stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1000, help="synthetic 8-GPU nodes to merge (default 1000)")
    p.add_argument("--repeats", type=int, default=3, help="merges timed, each in a fresh process (default 3)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="merge-time-") as tmp:
        run_dir = Path(tmp) / "run-merge-time"
        t0 = time.monotonic()
        write_fleet(run_dir / "nodes", args.nodes, SLOW_EVERY)
        print(f"{args.nodes} synthetic 8-GPU nodes written in {time.monotonic() - t0:.1f} s")
        runs = []
        for i in range(args.repeats):
            runs.append(merge_once(run_dir, args.nodes))
            print(f"merge {i + 1}: {runs[-1]['cpu_s']:.2f} s CPU, {runs[-1]['wall_s']:.2f} s wall, "
                  f"peak RSS {runs[-1]['peak_rss_mb']:.0f} MB, "
                  f"results.json {runs[-1]['results_bytes'] / 1e6:.1f} MB, report.html "
                  f"{runs[-1]['report_bytes'] / 1e6:.1f} MB")
    figures = {"nodes": args.nodes, "runs": runs, "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
               "wall_s_median": statistics.median(r["wall_s"] for r in runs),
               "peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}
    print(f"merge of {args.nodes} nodes: median {figures['cpu_s_median']:.2f} s CPU, "
          f"{figures['wall_s_median']:.2f} s wall over {len(runs)} merges, peak RSS {figures['peak_rss_mb']:.0f} MB")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
