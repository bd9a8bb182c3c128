"""Where a run's wall time goes: the command's start to the first test, each test, the last test to the session's
end, the session's end to the command's exit.

    python benchmarks/quick_time.py breakdown REPORT_DIR --t0 EPOCH_S --t1 EPOCH_S [--json FILE]
    python benchmarks/quick_time.py run --cold 1 --warm 3 --out OUT -- clustergate run --level quick [ARGS]
    python benchmarks/quick_time.py run --warm 1 --out OUT -- clustergate run --level standard [ARGS]

``breakdown`` reads a finished run's report directory: progress.jsonl says when the session and each test started
and ended (rank 0's clock, exact), results.json how long pytest timed each test's phases; ``--t0``/``--t1`` are the
command's start and exit (seconds since the epoch, as ``date +%s.%N`` prints them). Each test's wall time is split
into pytest's (its setup, call and teardown) and the rest (the plugin: every rank's phase exchanges, the judging,
the report's row). The end is split at the session's last event (written once the final barrier is passed).

``run`` runs the command ``--cold`` times with an empty compile cache each (a fresh ``TORCHINDUCTOR_CACHE_DIR``:
torch.compile's and Triton's kernels; with ``--shared-dir`` in the command, the first cold run is a fleet's first
node, which compiles and saves its kernels there, and the next ones the nodes after it, which load them:
workloads.compiled), then ``--warm`` times keeping the cache of the run before, each with
``--report-dir OUT/NAME`` added, and prints each breakdown and a summary (per segment and per test: min, median,
max). Everything, the command's output included, stays under ``--out`` (``quick_time.json``: every figure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SEGMENTS = ("start", "to_session", "session_to_first_test", "tests", "between_tests", "end", "to_session_end",
            "session_end_to_exit")
"""The breakdown's figures (seconds): start = to_session + session_to_first_test; end = to_session_end +
session_end_to_exit; start + tests + between_tests + end = the wall time."""


def events(progress: Path) -> list[dict[str, Any]]:
    """progress.jsonl's events; a line cut short (a run killed while writing it) is left out."""
    out = []
    for line in progress.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and isinstance(event.get("time"), (int, float)):
                out.append(event)
    return out


def breakdown(report_dir: Path, t0: float, t1: float) -> dict[str, Any]:
    """The run's wall time ``t1 - t0`` in segments (``SEGMENTS``) and per test, in the order the tests ran.
    ValueError naming what is missing where the directory holds no such run."""
    progress = report_dir / "progress.jsonl"
    if not progress.is_file():
        raise ValueError(f"{progress} does not exist: not a run's report directory (or the run never started)")
    evs = events(progress)
    first = {e["event"]: float(e["time"]) for e in reversed(evs)}
    starts: dict[str, float] = {}
    tests: list[dict[str, Any]] = []
    for e in evs:
        if e["event"] == "test_start":
            starts[e.get("nodeid", "")] = float(e["time"])
        elif e["event"] == "test_end" and e.get("nodeid", "") in starts:
            began = starts.pop(e["nodeid"])
            tests.append({"nodeid": e["nodeid"], "outcome": e.get("outcome", "?"), "began": began,
                          "wall_s": float(e["time"]) - began})
    if not tests:
        raise ValueError(f"{progress} records no test that started and ended")
    results_path = report_dir / "results.json"
    try:
        results = json.loads(results_path.read_text())
    except (OSError, ValueError):
        results = {}
    pytest_s = {t.get("nodeid"): float(t.get("duration_s") or 0.0) for t in results.get("tests", [])}
    for t in tests:
        t["pytest_s"] = pytest_s.get(t["nodeid"])
        t["plugin_s"] = None if t["pytest_s"] is None else t["wall_s"] - t["pytest_s"]
    last_end = tests[-1]["began"] + tests[-1]["wall_s"]
    session_start = first.get("session_start", tests[0]["began"])
    session_end = first.get("session_end")
    wall_tests = sum(t["wall_s"] for t in tests)
    out = {"wall": t1 - t0, "start": tests[0]["began"] - t0, "to_session": session_start - t0,
           "session_to_first_test": tests[0]["began"] - session_start, "tests": wall_tests,
           "between_tests": last_end - tests[0]["began"] - wall_tests, "end": t1 - last_end,
           "to_session_end": None if session_end is None else session_end - last_end,
           "session_end_to_exit": None if session_end is None else t1 - session_end,
           "pytest_in_tests": sum(t["pytest_s"] or 0.0 for t in tests),
           "verdict": results.get("verdict"), "test_count": len(tests)}
    for t in tests:
        del t["began"]
    out["per_test"] = tests
    out["startup"] = startup_steps(evs)
    out["kernels"] = {t.get("nodeid", "").split("::", 1)[-1]: {k: t["details"]["kernels"].get(k) for k in
                                                               ("source", "artifact", "note", "saved")}
                      for t in results.get("tests", [])
                      if isinstance(t.get("details"), dict) and isinstance(t["details"].get("kernels"), dict)}
    return out


def startup_steps(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank 0's start, step by step (``session_start``'s ``startup``: clustergate.run.startclock): each step's end
    from its launcher's start and how long the step took; empty for a run of a version that did not say."""
    start = next((e for e in evs if e["event"] == "session_start"), {})
    steps, before = [], 0.0
    for step in start.get("startup") or []:
        at = float(step["at"])
        steps.append({"step": str(step["step"]), "at": at, "took": at - before})
        before = at
    return steps


def _s(value: float | None) -> str:
    return "   -  " if value is None else f"{value:6.2f}"


def text(b: dict[str, Any], top: int = 12) -> str:
    """One run's breakdown: the segments, then its longest tests (wall, pytest's part, the plugin's)."""
    lines = [f"wall {b['wall']:.2f} s = start {b['start']:.2f} + tests {b['tests']:.2f} + between tests "
             f"{b['between_tests']:.2f} + end {b['end']:.2f}; {b['test_count']} tests, verdict {b['verdict']}",
             f"  start: {_s(b['to_session'])} s command to the session's first event, "
             f"{_s(b['session_to_first_test'])} s more to the first test",
             f"  end:   {_s(b['to_session_end'])} s last test to the session's end (verdict, outputs, final "
             f"barrier), {_s(b['session_end_to_exit'])} s more to the exit",
             f"  tests: {b['pytest_in_tests']:.2f} s in pytest's phases, {b['tests'] - b['pytest_in_tests']:.2f} s "
             "in the plugin around them",
             *([("  start-up, rank 0, from its launcher's start: "
                 + ", ".join(f"{st['step']} {st['at']:.2f} (+{st['took']:.2f})" for st in b["startup"]))]
               if b.get("startup") else []),
             *(f"  kernels of {name}: {k['source']}{' (saved)' if k.get('saved') else ''}; {k.get('note') or ''}"
               for name, k in (b.get("kernels") or {}).items()),
             "    wall  pytest  plugin  outcome  test"]
    longest = sorted(b["per_test"], key=lambda t: -t["wall_s"])
    for t in longest[:top]:
        lines.append(f"  {t['wall_s']:6.2f}  {_s(t['pytest_s'])}  {_s(t['plugin_s'])}  {t['outcome']:8s} "
                     f"{t['nodeid'].split('::', 1)[-1]}")
    rest = longest[top:]
    if rest:
        lines.append(f"  {sum(t['wall_s'] for t in rest):6.2f}  {len(rest)} other tests")
    return "\n".join(lines)


def summary(runs: list[tuple[str, dict[str, Any]]], top: int = 12) -> str:
    """Several runs side by side: each segment's and each long test's min, median and max over the runs."""
    def row(name: str, values: list[float | None]) -> str:
        got = [v for v in values if v is not None]
        if not got:
            return f"  {name:44s}      -"
        return (f"  {name:44s} {min(got):7.2f} {statistics.median(got):7.2f} {max(got):7.2f}   "
                + " ".join(f"{v:6.2f}" if v is not None else "   -  " for v in values))
    lines = [f"  {'':44s} {'min':>7s} {'median':>7s} {'max':>7s}   " + " ".join(f"{n[:6]:>6s}" for n, _ in runs)]
    lines += [row(seg, [b[seg] for _, b in runs]) for seg in ("wall", *SEGMENTS)]
    steps: dict[str, list[float | None]] = {}
    for i, (_, b) in enumerate(runs):
        for st in b.get("startup") or []:
            steps.setdefault(f"start-up: {st['step']} (took)", [None] * len(runs))[i] = st["took"]
    lines += [row(name, values) for name, values in steps.items()]
    walls: dict[str, list[float | None]] = {}
    for i, (_, b) in enumerate(runs):
        for t in b["per_test"]:
            walls.setdefault(t["nodeid"].split("::", 1)[-1], [None] * len(runs))[i] = t["wall_s"]
    longest = sorted(walls, key=lambda n: -statistics.median(v for v in walls[n] if v is not None))
    lines += [row(name, walls[name]) for name in longest[:top]]
    return "\n".join(lines)


def with_report_dir(command: list[str], report_dir: Path) -> list[str]:
    """``command`` writing its report to ``report_dir`` (one it names already is refused: the runs need their own)."""
    if any(a == "--report-dir" or a.startswith("--report-dir=") for a in command):
        raise SystemExit("quick_time: leave --report-dir out of the command: each run gets its own under --out")
    return [*command, "--report-dir", str(report_dir)]


def run_once(command: list[str], out: Path, name: str, env: dict[str, str]) -> dict[str, Any]:
    report = out / name
    with open(out / f"{name}.out", "w") as log:
        t0 = time.time()
        done = subprocess.run(with_report_dir(command, report), env=env, stdout=log, stderr=subprocess.STDOUT)
        t1 = time.time()
    try:
        b = breakdown(report, t0, t1)
    except ValueError as exc:
        raise SystemExit(f"quick_time: run {name} (exit {done.returncode}, output in {out / name}.out): {exc}") \
            from None
    return {"name": name, "exit": done.returncode, "t0": t0, "t1": t1, **b}


def run(command: list[str], out: Path, cold: int, warm: int, top: int) -> list[dict[str, Any]]:
    if not command:
        raise SystemExit("quick_time: name the command after --, e.g. -- clustergate run --level quick")
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    runs = []
    cache = env.get("TORCHINDUCTOR_CACHE_DIR")
    for i in range(cold + warm):
        if i < cold:
            cache = str(out / f"inductor-cache-{i + 1}")  # empty: this run compiles every kernel
        name = f"cold{i + 1}" if i < cold else f"warm{i - cold + 1}"
        if cache is not None:
            env["TORCHINDUCTOR_CACHE_DIR"] = cache
        r = run_once(command, out, name, env)
        runs.append(r)
        print(f"{name} (exit {r['exit']}):\n{text(r, top)}\n", flush=True)
    (out / "quick_time.json").write_text(json.dumps({"command": command, "runs": runs}, indent=1))
    for kind in ("cold", "warm"):
        chosen = [(r["name"], r) for r in runs if r["name"].startswith(kind)]
        if len(chosen) > 1:
            print(f"{kind} runs ({len(chosen)}), seconds:\n{summary(chosen, top)}\n")
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("breakdown", help="one finished run's breakdown")
    b.add_argument("report_dir")
    b.add_argument("--t0", type=float, required=True, help="the command's start, seconds since the epoch")
    b.add_argument("--t1", type=float, required=True, help="its exit")
    b.add_argument("--top", type=int, default=12, help="the longest tests listed")
    b.add_argument("--json", default=None, help="also write the figures as JSON here")
    r = sub.add_parser("run", help="run the command, cold then warm, and break each run down")
    r.add_argument("--cold", type=int, default=1, help="runs with an empty compile cache each (default 1)")
    r.add_argument("--warm", type=int, default=3, help="runs keeping the cache of the run before (default 3)")
    r.add_argument("--out", required=True, help="a folder for every run's report, output and the figures")
    r.add_argument("--top", type=int, default=12)
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command (no --report-dir)")
    args = p.parse_args(argv)
    if args.cmd == "breakdown":
        try:
            figures = breakdown(Path(args.report_dir), args.t0, args.t1)
        except ValueError as exc:
            print(f"quick_time: {exc}", file=sys.stderr)
            return 2
        print(text(figures, args.top))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    run(command, Path(args.out), args.cold, args.warm, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
