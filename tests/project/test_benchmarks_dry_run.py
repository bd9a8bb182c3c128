"""Every benchmark script runs, on CPU, so none can rot between GPU sessions.

The scripts in benchmarks/ are run by hand or by gpu_session.sh on a lent GPU machine, where a crash costs
the session (latency_diag.py once called a function the latency workload no longer had). Each one has a dry
run here: the GPU diagnostics under torchrun on 2 CPU ranks over gloo (their CPU modes, tiny sizes), the
plugin benchmark with a handful of tests, the session helpers through their command line. A script added to
benchmarks/ without a dry run fails ``test_every_benchmark_script_has_a_dry_run``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from torchrun_job import job_env  # noqa: E402

# The benchmarks' scripts start their torchrun jobs and commands themselves, out of sight of tests/conftest.py's
# marking (tests/helpers/torchrun_use.py): 116 CPU s for 13 of these tests, measured on 2 loaded cores.
pytestmark = pytest.mark.slow

# Hang guards, not speed bounds: each dry run takes 10-30 s on CI's 2 busy cores.
TIMEOUT_S = 300


def torchrun(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(BENCH / script), *args]
    return subprocess.run(cmd, cwd=cwd, env=job_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / name), *args], cwd=cwd, env=job_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return proc.stdout


def dry_latency_diag(tmp: Path) -> None:
    out = ok(torchrun("latency_diag.py", "--dry-run", "--out", str(tmp / "latency.json"), cwd=tmp))
    data = json.loads((tmp / "latency.json").read_text())
    rows = data["ranks"][0]["rows"]
    assert {r["comm"] for r in rows} >= {"default", "new_group", "suite-node", "suite-world", "bare NCCL (ctypes)"}
    assert all(isinstance(r["sync_host_us"], float) and isinstance(r["async_host_us"], float)
               for r in rows if "error" not in r)
    assert "suite run 3 (node)" in out and "written:" in out


def dry_matmul_diag(tmp: Path) -> None:
    # The quick level, as gpt_diag's dry run: the standard level's third shape adds seconds, not a path.
    out = ok(torchrun("matmul_diag.py", "--dtype", "bf16", "--level", "quick", "--out", str(tmp / "matmul.json"),
                      cwd=tmp))
    data = json.loads((tmp / "matmul.json").read_text())
    variants = [r["variant"] for r in data["ranks"][0]["rows"]]
    assert variants == ["mamf", "settled", "mamf", "sustained"] and "written:" in out
    assert data["level"] == "quick"


def dry_gpt_diag(tmp: Path) -> None:
    out = ok(torchrun("gpt_diag.py", "--level", "quick", "--out", str(tmp / "gpt.json"), cwd=tmp))
    rows = json.loads((tmp / "gpt.json").read_text())["ranks"][0]["rows"]
    assert [r["variant"] for r in rows] == ["suite", "minimal", "minimal_noclip", "minimal_ddp"], rows
    assert all(r["tokens_per_s"] > 0 for r in rows) and "kinds_ms_per_step" in rows[1]["profile"]
    assert "written:" in out


def dry_plugin_overhead(tmp: Path) -> None:
    out = ok(script("plugin_overhead.py", "--ranks", "2", "--tests", "3", cwd=tmp))
    row = out.strip().splitlines()[-1].split()
    assert row[0] == "2" and len(row) == 5 and all(float(x) > 0 for x in row[1:]), out


FINDER = '''
import argparse, pathlib
p = argparse.ArgumentParser()
for a in ("--m", "--n", "--k"):
    p.add_argument(a, nargs="+")
p.add_argument("--dtype")
p.add_argument("--output_file")
a = p.parse_args()
pathlib.Path(a.output_file).write_text("median: 727.1 TFLOPS @ 4096x4096x8192 (MxNxK)\\n")
'''


def dry_session_tools(tmp: Path) -> None:
    profile = ok(script("session_tools.py", "profile", "--gpus", "1", "--gpu-name", "NVIDIA H100 80GB HBM3", "-o",
                        str(tmp / "t.yaml"), cwd=tmp)).strip()
    assert profile == "h100-sxm-80gb-1gpu"
    peak = ok(script("session_tools.py", "setting", "peak_bf16_tflops", "--thresholds", str(tmp / "t.yaml"),
                     "--profile", profile, cwd=tmp)).strip()
    assert float(peak) == 989
    assert "--m 4096 8192" in ok(script("session_tools.py", "mamf-args", "standard", cwd=tmp))
    finder = tmp / "mamf-finder.py"
    finder.write_text(FINDER)
    session = tmp / "session"
    # --out names a folder that does not exist yet (a new session's): it is made.
    ok(script("session_tools.py", "mamf", "--finder", str(finder), "--dtype", "bfloat16", "--gpus", "1", "--out",
              str(session / "mamf"), cwd=tmp))
    assert "727.1" in (session / "mamf" / "bf16-gpu0.txt").read_text()
    table = ok(script("session_tools.py", "table", str(session), cwd=tmp))
    assert "727.1" in table and (session / "summary.json").exists()


FAKE_RUN = """
import json, os, sys, time
report = sys.argv[sys.argv.index("--report-dir") + 1]
os.makedirs(report)
t = time.time()
events = [("session_start", None), ("test_start", "a.py::test_x"), ("test_end", "a.py::test_x")]
with open(os.path.join(report, "progress.jsonl"), "w") as f:
    for i, (event, nodeid) in enumerate(events):
        f.write(json.dumps({"time": t + i * 0.01, "event": event, "nodeid": nodeid, "outcome": "passed"}) + "\\n")
    f.write("{cut short\\n")
    f.write(json.dumps({"time": t + 0.05, "event": "session_end"}) + "\\n")
with open(os.path.join(report, "results.json"), "w") as f:
    json.dump({"verdict": "reject", "cache": os.environ["TORCHINDUCTOR_CACHE_DIR"],
               "tests": [{"nodeid": "a.py::test_x", "duration_s": 0.004}]}, f)
sys.exit(1)
"""


def dry_quick_time(tmp: Path) -> None:
    """The breakdown's figures from a made-up run (exact), the cold and warm caches of ``run`` with a stand-in
    command, and one real ``clustergate run`` on a CPU rank broken down."""
    report = tmp / "report"
    report.mkdir()
    t0 = 1795608000.0  # the command started; 8.5 s to the session's first event, 2.5 s more to the first test
    events = [("session_start", 8.5, None), ("test_start", 11.0, "a.py::test_slow"),
              ("test_end", 23.5, "a.py::test_slow"), ("test_start", 23.6, "a.py::test_fast"),
              ("test_end", 24.6, "a.py::test_fast"), ("session_end", 26.0, None)]
    (report / "progress.jsonl").write_text("".join(
        json.dumps({"time": t0 + at, "event": e, "nodeid": n, "outcome": "passed"}) + "\n" for e, at, n in events))
    (report / "results.json").write_text(json.dumps({"verdict": "accept", "tests": [
        {"nodeid": "a.py::test_slow", "duration_s": 12.0}, {"nodeid": "a.py::test_fast", "duration_s": 0.9}]}))
    text = ok(script("quick_time.py", "breakdown", str(report), "--t0", str(t0), "--t1", str(t0 + 27.0), "--json",
                     str(tmp / "b.json"), cwd=tmp))
    assert text.startswith("wall 27.00 s = start 11.00 + tests 13.50 + between tests 0.10 + end 2.40"), text
    figures = json.loads((tmp / "b.json").read_text())
    assert figures["to_session"] == pytest.approx(8.5) and figures["to_session_end"] == pytest.approx(1.4)
    assert figures["session_end_to_exit"] == pytest.approx(1.0)
    assert [round(t["plugin_s"], 3) for t in figures["per_test"]] == [0.5, 0.1]
    assert "12.50   12.00    0.50  passed   test_slow" in text
    gone = script("quick_time.py", "breakdown", str(tmp / "nowhere"), "--t0", "0", "--t1", "1", cwd=tmp)
    assert gone.returncode == 2 and "progress.jsonl does not exist" in gone.stderr
    # run: each cold run compiles into an empty cache of its own, the warm ones keep the last one's.
    (tmp / "fake_run.py").write_text(FAKE_RUN)
    ok(script("quick_time.py", "run", "--cold", "2", "--warm", "2", "--out", str(tmp / "fake"), "--",
              sys.executable, str(tmp / "fake_run.py"), cwd=tmp))
    runs = json.loads((tmp / "fake" / "quick_time.json").read_text())["runs"]
    caches = [json.loads((tmp / "fake" / r["name"] / "results.json").read_text())["cache"] for r in runs]
    assert [r["name"] for r in runs] == ["cold1", "cold2", "warm1", "warm2"] and [r["exit"] for r in runs] == [1] * 4
    assert caches[0] != caches[1] and caches[1] == caches[2] == caches[3], caches
    # A real run: clustergate run on one CPU rank, one test (partial: -k narrows it, so exit 1).
    out = ok(script("quick_time.py", "run", "--cold", "0", "--warm", "1", "--out", str(tmp / "real"), "--",
                    sys.executable, "-m", "clustergate", "run", "--nproc-per-node", "1", "--profile", "cpu", "-k",
                    "test_world_matches_profile", cwd=tmp))
    [real] = json.loads((tmp / "real" / "quick_time.json").read_text())["runs"]
    assert real["exit"] == 1 and real["verdict"] == "partial" and real["test_count"] == 1, out
    parts = real["start"] + real["tests"] + real["between_tests"] + real["end"]
    assert parts == pytest.approx(real["wall"]) and real["start"] > real["to_session"] > 0 and real["end"] > 0


def dry_gpu_contender(tmp: Path) -> None:
    out = ok(script("gpu_contender.py", "--seconds", "0.5", "--devices", "cpu", cwd=tmp))
    assert "bf16 256^3 matmuls on cpu" in out and "products, done" in out


def dry_hostlink_contender(tmp: Path) -> None:
    out = ok(script("hostlink_contender.py", "--seconds", "0.5", "--device", "cpu", cwd=tmp))
    assert "1 MiB pinned copies h2d+d2h on cpu" in out and "done" in out
    said = out.splitlines()[-1]
    assert said.startswith("hostlink_contender pid ") and " h2d " in said and " d2h " in said and "GB/s" in said
    one = ok(script("hostlink_contender.py", "--seconds", "0.2", "--device", "cpu", "--direction", "h2d", cwd=tmp))
    assert "copies h2d on cpu" in one and " d2h " not in one.splitlines()[-1]


def dry_health_time(tmp: Path) -> None:
    out = ok(script("health_time.py", "--fake-gpus", "8", "--repeats", "2", "--out", str(tmp / "h.json"), cwd=tmp))
    figures = json.loads((tmp / "h.json").read_text())
    assert [(r["gpus"], r["exit"], r["status"], r["profile"]) for r in figures["runs"]] == \
        [(8, 0, "healthy", "h100-sxm-80gb")] * 2, out
    assert all(r["wall_s"] > r["command_s"] > 0 for r in figures["runs"]) and figures["imports_s"] > 0
    assert "made-up node of 8 GPUs" in out and "wall per check: median" in out
    cpu = ok(script("health_time.py", "--profile", "cpu", "--repeats", "1", "--limit", "60", cwd=tmp))
    assert "profile cpu, 0 GPUs, could not run (exit 4)" in cpu  # nothing to check on a CPU machine: never healthy


def dry_redaction_cost(tmp: Path) -> None:
    node = tmp / "gpu-node-07"
    node.mkdir()
    (node / "results.json").write_text((ROOT / "tests" / "data" / "fleet" / "node-run.json").read_text())
    (node / "report.html").write_text("<html><pre>NCCL_DEBUG=WARN</pre></html>\n")
    (node / "junit.xml").write_text("<testsuite/>\n")
    (node / "progress.jsonl").write_text('{"event": "session_start", "time": 1.0}\n')
    out = ok(script("redaction_cost.py", str(node), "--repeats", "1", "--json", str(tmp / "cost.json"), cwd=tmp))
    [figures] = json.loads((tmp / "cost.json").read_text())
    assert {"results.json first s", "results.json again s", "store record s", "report.html s", "junit.xml s",
            "progress.jsonl s", "evidence bundle s", "end of run s"} <= set(figures), figures
    assert all(v >= 0 for k, v in figures.items() if k.endswith(" s")) and "end of run s" in out


def dry_hang_plants(tmp: Path) -> None:
    """One plant (the skipped collective: the quickest the liveness judges), the whole harness around it: the
    planted file, the fault timed to the job's end, the process table, the tar."""
    out = ok(script("hang_plants.py", "--dry-run", "--plants", "skip", "--out", str(tmp / "out"), cwd=tmp))
    assert out.startswith("skip: ") and "error_ranks [1]; hang skipped via gloo flight recorder; left []" in out, out
    with tarfile.open(tmp / "out" / "hang_plants.tgz") as tar:
        summary = json.load(tar.extractfile("hang_plants/hang_plants.json"))  # type: ignore[arg-type]
        names = tar.getnames()
    [row] = summary["plants"]
    assert row["within_60_s"] and row["left"] == [] and row["killed_after"] == [] and row["verdict"] == "reject"
    assert "hang_plants/skip/report/results.json" in names and "hang_plants/skip/torchrun.out" in names
    assert "_dump_fr_trace_json" in summary["torch"]["dumps"] and list((tmp / "out").iterdir()) == \
        [tmp / "out" / "hang_plants.tgz"]


def dry_merge_time(tmp: Path) -> None:
    out = ok(script("merge_time.py", "--nodes", "20", "--repeats", "1", "--json", str(tmp / "m.json"), cwd=tmp))
    figures = json.loads((tmp / "m.json").read_text())
    [run] = figures["runs"]
    assert figures["nodes"] == 20 and run["status"] == 1 and run["cpu_s"] > 0 and run["wall_s"] > 0, figures
    # The merged record references the node files: 20 nodes about 100 KB (it copied 21 KB a node, 420 KB, before).
    assert 0 < run["peak_rss_mb"] <= figures["peak_rss_mb"] and run["results_bytes"] < 250_000, figures
    assert "merge of 20 nodes: median" in out and list(tmp.iterdir()) == [tmp / "m.json"]  # nothing else left


DRY_RUNS = {"gpu_contender.py": dry_gpu_contender, "gpt_diag.py": dry_gpt_diag, "hang_plants.py": dry_hang_plants,
            "health_time.py": dry_health_time, "hostlink_contender.py": dry_hostlink_contender,
            "latency_diag.py": dry_latency_diag, "matmul_diag.py": dry_matmul_diag, "merge_time.py": dry_merge_time,
            "plugin_overhead.py": dry_plugin_overhead, "quick_time.py": dry_quick_time,
            "redaction_cost.py": dry_redaction_cost,
            "session_tools.py": dry_session_tools}


def test_every_benchmark_script_has_a_dry_run() -> None:
    scripts = sorted(p.name for p in BENCH.glob("*.py"))
    assert scripts == sorted(DRY_RUNS), f"benchmarks without a dry run here: {sorted(set(scripts) - set(DRY_RUNS))}"


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_benchmark_dry_run(tmp_path: Path, name: str) -> None:
    DRY_RUNS[name](tmp_path)
