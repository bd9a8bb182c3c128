"""Helpers of benchmarks/gpu_session.sh: the session's profile, mamf-finder's arguments, and the closing table.

    python benchmarks/session_tools.py profile --gpus 1 --gpu-name "NVIDIA H100 80GB HBM3" -o OUT/thresholds.yaml
    python benchmarks/session_tools.py setting peak_bf16_tflops --thresholds OUT/thresholds.yaml --profile NAME
    python benchmarks/session_tools.py mamf --finder .peers/.../mamf-finder.py --dtype bfloat16 --gpus 8 --out DIR
    python benchmarks/session_tools.py table OUT/session

(Where a run's time went: benchmarks/quick_time.py.)

The table puts the suite's figures beside the peers' from the same session: matmul against
mamf-finder's best median (per shape too), small-message latency and busbw against nccl-tests, with
the ratio, and what the suite alone measured (sustained matmul and power, host link alone and all at
once, MFU). The parsers read the peers' own output formats (mamf-finder's results file, both its
'median: X TFLOPS @ MxNxK' summary and its per-shape rows; nccl-tests' data lines).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clustergate.criteria.thresholds import load  # noqa: E402
from workloads.gpu import matmul  # noqa: E402

_MAMF_SUMMARY = re.compile(r"^median:\s+([\d.]+)\s+TFLOPS\s+@\s+(\d+)x(\d+)x(\d+)", re.M)
_MAMF_HEADLINE = re.compile(r"^MAMF[^:]*:\s*([\d.]+)\s*TFLOPS.*?(\d+)x(\d+)x(\d+)", re.M)
_MAMF_ROW_V3 = re.compile(r"([\d.]+)\(mean\)\s+([\d.]+)\(median\)\s+([\d.]+)\(max\)\s+@\s+(\d+x\d+x\d+)")
_MAMF_ROW_V4 = re.compile(r"^\s*\d+\s+(\d+x\d+x\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s", re.M)


def session_profile(shipped: Path, gpus: int, gpu_name: str) -> tuple[str, str]:
    """(name, thresholds text) for a node of ``gpus`` GPUs named ``gpu_name``: the shipped profile the run itself
    chooses for that model and shape (``Thresholds.select``), the shipped file as it is; where the file has no
    profile of that shape (3 GPUs), a first profile that extends the model's for ``gpus`` GPUs a node (gpu_count
    and gpus_per_node; everything else inherited)."""
    chosen = load(shipped).select(gpu_name, gpu_node=True, gpus=gpus)
    if chosen.settings.get("gpus_per_node") == gpus:
        return chosen.name, shipped.read_text()
    data = yaml.safe_load(shipped.read_text())
    base = chosen.name
    name = f"{base}-{gpus}gpu"
    mine = {"description": f"{base} for a node of {gpus} GPU(s) (GPU session)", "extends": base,
            "match": data["profiles"][base].get("match") or [],
            # One GPU lent alone to a VM: NVML shows no NVLink (its switch ports are not passed through).
            "settings": {"gpus_per_node": gpus, **({"nvlinks_per_gpu": 0} if gpus == 1 else {})},
            # The lent machine's own shape (its description says how many GPUs it has): a spec, not a measurement.
            "metrics": {"gpu_count": {"min": gpus, "max": gpus, "unit": "GPUs", "source": "spec"}}}
    data["profiles"] = {name: mine, **data["profiles"]}
    return name, yaml.safe_dump(data, sort_keys=False, width=110)


def mamf_args(level: str) -> str:
    """mamf-finder's --m/--n/--k for the suite's sweep at ``level``: the very same shapes."""
    ms, ns, ks = matmul.SWEEPS[level]
    return " ".join(f"--{a} {' '.join(map(str, v))}" for a, v in (("m", ms), ("n", ns), ("k", ks)))


def run_mamf(finder: str, dtype: str, gpus: int, out: Path, level: str = "standard") -> int:
    """mamf-finder on every GPU at once (one process per GPU, as the suite measures every GPU at once),
    over the suite's sweep at ``level``; each GPU's results file is OUT/<dtype>-gpu<i>.txt."""
    short = {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    out.mkdir(parents=True, exist_ok=True)  # the results files and logs go there: a new session's folder
    procs = []
    for i in range(gpus):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}
        cmd = [sys.executable, finder, *mamf_args(level).split(), "--dtype", dtype,
               "--output_file", str(out / f"{short}-gpu{i}.txt")]
        with open(out / f"{short}-gpu{i}.stdout", "w") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    return max(p.wait() for p in procs) if procs else 0


def parse_mamf(text: str) -> dict[str, Any]:
    """Best median (and its shape) and every shape's median from a mamf-finder results file."""
    shapes = {shape: float(med) for _, med, _, shape in _MAMF_ROW_V3.findall(text)}
    shapes.update({shape: float(med) for shape, _, med, _ in _MAMF_ROW_V4.findall(text) if shape not in shapes})
    out: dict[str, Any] = {"shapes": shapes}
    if m := _MAMF_SUMMARY.search(text):
        out.update(best=float(m.group(1)), best_shape="x".join(m.group(2, 3, 4)), kind="best median")
    elif m := _MAMF_HEADLINE.search(text):
        out.update(best=float(m.group(1)), best_shape="x".join(m.group(2, 3, 4)), kind="MAMF headline (v4)")
    elif shapes:
        best = max(shapes, key=shapes.__getitem__)
        out.update(best=shapes[best], best_shape=best, kind="best of the rows (run cut short)")
    return out


def parse_nccl_tests(text: str) -> list[dict[str, float]]:
    """nccl-tests data lines: size, out-of-place time (us) and busbw, in-place time and busbw."""
    rows = []
    for line in text.splitlines():
        t = line.split()
        if len(t) >= 13 and t[0].isdigit() and t[2] in ("float", "half", "bfloat16", "double", "int32", "int8"):
            try:
                rows.append({"bytes": int(t[0]), "time_us": float(t[5]), "busbw_gbps": float(t[7]),
                             "inplace_time_us": float(t[9]), "inplace_busbw_gbps": float(t[11])})
            except ValueError:
                continue
    return rows


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _metric(results: dict[str, Any] | None, name: str) -> list[float]:
    for test in (results or {}).get("tests", []):
        for m in test.get("metrics", []):
            if m["name"] == name:
                return [p["value"] for p in m.get("per_rank") or [{"value": m["value"]}]]
    return []


def _suite_shapes(results: dict[str, Any] | None, dtype: str) -> dict[str, float]:
    """Per shape, the median over GPUs of the suite's per-shape medians."""
    for test in (results or {}).get("tests", []):
        if test["nodeid"].endswith(f"test_matmul_tflops[{dtype}]"):
            per: dict[str, list[float]] = {}
            for rank in (test.get("details") or {}).get("per_rank", []):
                for s in rank.get("shapes", []):
                    per.setdefault("x".join(map(str, s["shape"])), []).append(s["tflops"])
            return {k: statistics.median(v) for k, v in per.items()}
    return {}


def _latency_row(results: dict[str, Any] | None, scope: str) -> dict[str, Any]:
    """The judged (smallest) size's row of the suite's latency curve in ``scope``, or {}."""
    for test in (results or {}).get("tests", []):
        if test["nodeid"].endswith(f"test_allreduce_latency[{scope}]"):
            details = test.get("details") or {}
            for curve in (details.get("curves") or {}).values():
                return min(curve, key=lambda r: r["bytes"]) if curve else {}
    return {}


def _fmt(values: list[float], digits: str = ".1f") -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:{digits}}" if lo == hi else f"{lo:{digits}}-{hi:{digits}}"


def table(session: Path) -> tuple[str, dict[str, Any]]:
    """The closing comparison (text) and the same as data."""
    res = _load(session / "suite" / "results.json")
    rows: list[tuple[str, str, str, str]] = []
    summary: dict[str, Any] = {"verdict": (res or {}).get("verdict", "no results.json"),
                               "profile": (res or {}).get("profile"), "warnings": len((res or {}).get("warnings", [])),
                               "failed": [t["nodeid"].split("::")[-1] for t in (res or {}).get("tests", [])
                                          if t["outcome"] in ("failed", "error")]}
    for dtype in ("bf16", "fp16"):
        suite = _metric(res, f"matmul_{dtype}_tflops")
        peers = [parse_mamf(p.read_text(errors="replace")) for p in sorted(session.glob(f"mamf/{dtype}-gpu*.txt"))]
        best = [p["best"] for p in peers if "best" in p]
        ratio = f"{statistics.median(suite) / statistics.median(best):.3f}" if suite and best else "-"
        rows.append((f"matmul {dtype} TFLOPS (best median)", _fmt(suite), _fmt(best), ratio))
        ours = _suite_shapes(res, dtype)
        theirs: dict[str, list[float]] = {}
        for p in peers:
            for shape, v in p["shapes"].items():
                theirs.setdefault(shape, []).append(v)
        for shape in sorted(set(ours) & set(theirs), key=lambda s: -ours[s])[:3]:
            mine, peer = ours[shape], statistics.median(theirs[shape])
            rows.append((f"  {dtype} {shape}", f"{mine:.1f}", f"{peer:.1f}", f"{mine / peer:.3f}"))
        summary[f"matmul_{dtype}"] = {"suite": suite, "mamf": best, "ratio": ratio,
                                      "mamf_kind": sorted({p.get("kind", "?") for p in peers})}
    nccl = {p.stem: parse_nccl_tests(p.read_text(errors="replace")) for p in sorted(session.glob("nccl-tests/*.out"))}
    # Like for like: the suite's CUDA-graph figure beside nccl-tests -G, its host-clock figure beside plain
    # nccl-tests (out-of-place column); a row's timing says which the judged figure is.
    lat_peer = [r["time_us"] for r in nccl.get("all_reduce_8B", []) if r["bytes"] == 8]
    graph_peer = [r["time_us"] for r in nccl.get("all_reduce_8B_graph", []) if r["bytes"] == 8]
    for scope, name in (("node", "intranode_allreduce_latency_us"), ("world", "allreduce_latency_us")):
        row = _latency_row(res, scope)
        suite = _metric(res, name)
        graphed = row.get("timing") == "CUDA graph"
        peer = graph_peer if graphed else lat_peer
        rows.append((f"{name} ({'CUDA graph; nccl-tests -G' if graphed else 'host clock; nccl-tests'})",
                     _fmt(suite), _fmt(peer), f"{suite[0] / peer[0]:.2f}x" if suite and peer else "-"))
        if graphed and "host_time_us" in row:
            host = [row["host_time_us"]]
            rows.append(("  its host clock (nccl-tests -b 8 -e 8)", _fmt(host), _fmt(lat_peer),
                         f"{host[0] / lat_peer[0]:.2f}x" if lat_peer else "-"))
    bw_peer = [r["busbw_gbps"] for r in nccl.get("all_reduce_1G", [])]
    suite_bw = _metric(res, "intranode_allreduce_busbw_gbps")
    rows.append(("intranode all_reduce busbw GB/s, 1 GiB", _fmt(suite_bw), _fmt(bw_peer),
                 f"{suite_bw[0] / bw_peer[0]:.3f}" if suite_bw and bw_peer else "-"))
    for name, label in (("matmul_bf16_sustained_tflops", "sustained bf16 TFLOPS"), ("sustained_power_w", "power W"),
                        ("sustained_power_fraction", "power / limit"), ("sustained_sm_clock_mhz", "SM clock MHz"),
                        ("h2d_bandwidth_gbps", "h2d GB/s, each GPU alone"), ("d2h_bandwidth_gbps", "d2h GB/s, alone"),
                        ("h2d_bandwidth_all_gpus_gbps", "h2d GB/s, all at once"),
                        ("d2h_bandwidth_all_gpus_gbps", "d2h GB/s, all at once"), ("train_mfu", "GPT MFU (the suite)")):
        rows.append((label, _fmt(_metric(res, name), ".3f" if "fraction" in name or "mfu" in name else ".1f"), "", ""))
    gpt_out = session / "diag" / "gpt_batch32.out"
    gpt32 = re.findall(r"train_mfu = ([\d.]+)", gpt_out.read_text(errors="replace")) if gpt_out.exists() else []
    if gpt32:
        rows.append(("GPT MFU at batch 32 (diagnostic)", gpt32[-1], "", ""))
    head = (f"verdict {summary['verdict']} (profile {summary['profile']}), {summary['warnings']} warning(s), "
            f"failed: {', '.join(summary['failed']) or 'none'}")
    width = max(len(r[0]) for r in rows)
    lines = [head, f"{'figure':{width}}  {'suite':>15}  {'peer':>15}  {'suite/peer':>10}"]
    lines += [f"{a:{width}}  {b:>15}  {c:>15}  {d:>10}" for a, b, c, d in rows]
    summary["rows"] = rows
    return "\n".join(lines), summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--gpu-name", required=True)
    p.add_argument("--thresholds", default=str(ROOT / "thresholds.yaml"))
    p.add_argument("-o", "--output", required=True)
    p = sub.add_parser("setting")
    p.add_argument("name")
    p.add_argument("--thresholds", required=True)
    p.add_argument("--profile", required=True)
    p = sub.add_parser("mamf")
    p.add_argument("--finder", required=True)
    p.add_argument("--dtype", required=True, choices=("bfloat16", "float16"))
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--out", required=True)
    sub.add_parser("mamf-args").add_argument("level")
    sub.add_parser("table").add_argument("session")
    args = parser.parse_args()
    if args.cmd == "profile":
        name, text = session_profile(Path(args.thresholds), args.gpus, args.gpu_name)
        Path(args.output).write_text(text)
        print(name)
    elif args.cmd == "setting":
        print(load(args.thresholds).profile(args.profile).setting(args.name, ""))
    elif args.cmd == "mamf":
        return run_mamf(args.finder, args.dtype, args.gpus, Path(args.out))
    elif args.cmd == "mamf-args":
        print(mamf_args(args.level))
    else:
        text, summary = table(Path(args.session))
        (Path(args.session) / "summary.json").write_text(json.dumps(summary, indent=1))
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
