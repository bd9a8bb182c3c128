"""How long ``clustergate health`` takes, as a scheduler pays for it: a new Python process each time.

    python benchmarks/health_time.py [--repeats 5] [--profile NAME] [--out FILE]   # this node (a lent GPU)
    python benchmarks/health_time.py --fake-gpus 8 --repeats 3                       # a made-up node, on CPU
    python benchmarks/health_time.py --profile cpu                                   # the CPU answer's cost

Each repeat runs ``python -m clustergate health --json`` and keeps its wall time (interpreter start, imports,
NVML, reading and judging), the time the command itself reports (``duration_s``: from its first line to its
verdict) and its exit status; then the time of the imports alone. The bounds it is held to: 3 s on one H100,
5 s on a node of 8 GPUs, 2 s for ``--profile cpu`` on a CPU machine (there it finds nothing to check: exit 4,
never healthy; what is timed is the command's cost); ``--limit S`` exits 1 when the slowest
repeat takes longer. ``--fake-gpus N`` builds a node of N GPUs with the suite's fake NVML (tests/helpers/health_node.py)
under a temporary directory: a dry run that needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    return time.perf_counter() - t0, proc


def measure(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "clustergate", "health", "--json", *(["--profile", args.profile] if args.profile
                                                                      else [])]
    runs = []
    for _ in range(args.repeats):
        wall, proc = timed(cmd, env)
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            raise SystemExit(f"clustergate health printed no JSON (exit {proc.returncode}): "
                             f"{(proc.stdout + proc.stderr)[-2000:]}") from None
        runs.append({"wall_s": round(wall, 3), "command_s": report.get("duration_s"), "exit": proc.returncode,
                     "status": report.get("status"), "profile": report.get("profile"),
                     "gpus": len(report.get("gpus") or []), "failures": len(report.get("failures") or [])})
    imports, proc = timed([sys.executable, "-c", "import clustergate.health.command, pynvml"], env)
    walls = [r["wall_s"] for r in runs]
    return {"runs": runs, "imports_s": round(imports, 3) if proc.returncode == 0 else None,
            "wall_median_s": statistics.median(walls), "wall_max_s": max(walls), "wall_min_s": min(walls)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", default=None, help="passed to clustergate health (default: chosen as a run chooses)")
    p.add_argument("--fake-gpus", type=int, default=None, metavar="N",
                   help="time it on a made-up node of N GPUs (the suite's fake NVML; no GPU needed)")
    p.add_argument("--limit", type=float, default=None, metavar="S", help="exit 1 when the slowest repeat exceeds S")
    p.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as tmp:
        if args.fake_gpus is not None:
            from health_node import GpuNode

            env = GpuNode(Path(tmp) / "host", gpus=args.fake_gpus).env()
        figures = measure(args, env)
    figures["node"] = f"made-up node of {args.fake_gpus} GPUs (fake NVML)" if args.fake_gpus is not None else \
        "this node"
    first = figures["runs"][0]
    print(f"clustergate health on {figures['node']}: profile {first['profile']}, {first['gpus']} GPUs, "
          f"{first['status']} (exit {first['exit']})")
    print(f"wall per check: median {figures['wall_median_s']:.2f} s, min {figures['wall_min_s']:.2f} s, max "
          f"{figures['wall_max_s']:.2f} s over {len(figures['runs'])}; the command's own time "
          f"{statistics.median(r['command_s'] for r in figures['runs']):.2f} s; imports alone "
          + (f"{figures['imports_s']:.2f} s" if figures["imports_s"] is not None else "not timed (no pynvml)"))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")
        print(f"written: {args.out}")
    if args.limit is not None and figures["wall_max_s"] > args.limit:
        print(f"slower than the limit: {figures['wall_max_s']:.2f} s > {args.limit} s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
