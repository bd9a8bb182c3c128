"""What merging a large fleet costs: ``clustergate merge`` of N synthetic 8-GPU nodes, timed as a user runs it.

The nodes are tests/helpers/cluster_runs.py's (about 300 KB of results.json each, the shape of a real 8-GPU node's,
every 97th with one slow GPU), written once into a temporary REPORTS/RUN_ID/nodes/; each repeat then runs the command in
a fresh process and takes its CPU seconds (user + system of the child: what the merge costs whatever else
runs on the machine; it is single-threaded) and its wall seconds.

    python benchmarks/merge_time.py                       # 1,000 nodes, 3 merges
    python benchmarks/merge_time.py --nodes 200 --repeats 1 --json merge.json

Run it with PYTHONPATH=OTHER_CHECKOUT to time another version on nodes written by that version (a node file
records the suite's digest, and a merge excludes a node of another version: that is another, slower path).
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
                  f"results.json {runs[-1]['results_bytes'] / 1e6:.1f} MB, report.html "
                  f"{runs[-1]['report_bytes'] / 1e6:.1f} MB")
    figures = {"nodes": args.nodes, "runs": runs, "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
               "wall_s_median": statistics.median(r["wall_s"] for r in runs)}
    print(f"merge of {args.nodes} nodes: median {figures['cpu_s_median']:.2f} s CPU, "
          f"{figures['wall_s_median']:.2f} s wall over {len(runs)} merges")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
