"""The plugin's own cost per test (gather, judge, broadcast) at several world sizes, on CPU.

Runs N trivial tests that each record one gpu-scope metric under torchrun with gloo, and reads the
per-test wall time off progress.jsonl (test_start to test_end: the three phase exchanges, the
judgement and pytest's own per-test work). A run without metrics gives the floor.

    python benchmarks/plugin_overhead.py --ranks 2 4 8 --tests 200
    python benchmarks/plugin_overhead.py --ranks 2 --tests 3      # the suite's own dry run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from torchrun_job import job_env  # noqa: E402

TESTS = """
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_plain(i):
    pass

@pytest.mark.parametrize("i", range({n}))
@pytest.mark.metrics("allreduce_busbw_gbps")
def test_trivial(cg, i):
    cg.record("allreduce_busbw_gbps", 1.0 + cg.rank, "GB/s")
"""


def per_test_ms(progress: Path) -> dict[str, list[float]]:
    """Milliseconds per test, keyed by the test function (plain: no metrics; trivial: one metric)."""
    starts: dict[str, float] = {}
    out: dict[str, list[float]] = {"test_plain": [], "test_trivial": []}
    for line in progress.read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "test_start":
            starts[e["nodeid"]] = e["time"]
        elif e["event"] == "test_end":
            out[e["nodeid"].split("::")[1].split("[")[0]].append((e["time"] - starts[e["nodeid"]]) * 1e3)
    return out


def measure(ranks: int, tests: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_bench.py").write_text(TESTS.format(n=tests))
        report = Path(tmp, "report")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               "-m", "pytest", "-q", "-p", "clustergate", "-p", "no:cacheprovider", "--rootdir", tmp,
               "--thresholds", str(ROOT / "thresholds.yaml"), "--report-dir", str(report), "test_bench.py"]
        # The planted file is not the acceptance suite, so the run is partial (exit 1): only its timings count.
        done = subprocess.run(cmd, cwd=tmp, env=job_env(), capture_output=True, text=True)
        if done.returncode not in (0, 1) or not (report / "progress.jsonl").is_file():
            raise SystemExit(f"plugin_overhead: the run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        times = per_test_ms(report / "progress.jsonl")
    out: dict[str, float] = {"ranks": ranks}
    for kind, ms in times.items():
        ms = ms[5:] if len(ms) > 10 else ms  # the first few include warm-up (a dry run has too few to drop)
        out[kind] = statistics.median(ms)
        out[kind + "_p90"] = sorted(ms)[int(0.9 * len(ms))]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--tests", type=int, default=200)
    args = parser.parse_args()
    print(f"{'ranks':>5} {'no metric: median':>18} {'p90':>7} {'one metric: median':>19} {'p90':>7}  (ms per test)")
    for ranks in args.ranks:
        r = measure(ranks, args.tests)
        print(f"{r['ranks']:>5} {r['test_plain']:>18.2f} {r['test_plain_p90']:>7.2f} "
              f"{r['test_trivial']:>19.2f} {r['test_trivial_p90']:>7.2f}")


if __name__ == "__main__":
    main()
