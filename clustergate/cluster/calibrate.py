"""Calibrate a site profile from finished runs of healthy nodes.

    clustergate calibrate RUN1/results.json RUN2/results.json --extends h200 -o site-thresholds.yaml
    torchrun ... -m pytest acceptance --thresholds site-thresholds.yaml

The new profile extends the shipped one (``--extends``) and is listed first, with the same ``match``,
so ``--thresholds site-thresholds.yaml`` selects it for the same GPUs (a profile for CPU runs, which matches no
GPU, is made the file's ``cpu_profile``: the same option alone selects it); the shipped profiles follow, copied.
Method, stated again in the file: GPUs that failed a health check are left out; per metric
a value worse than ``--fraction`` of the fleet's median is left out as an outlier; then, over every
GPU (or node, or job) of every run, a minimum = ``--fraction`` x the median (a maximum = the median /
``--fraction`` where lower is better), rounded to 3 significant digits. ``--fraction`` is 0.9 for GPU runs,
0.01 for CPU runs (``CPU_FRACTION``: CPU ranks share their cores and spread by tens). The node shape the
runs show is carried into ``settings`` (gpus_per_node, and every setting a hardware-shape test compares against: NVLinks
per GPU, PCIe generation and width under load, MIG mode, InfiniBand ports and rate: see
``calibration_samples.SHAPE``), so the profile accepts the machines it was calibrated on; a GPU short of the
fleet's shape (17 NVLinks where the others have 18) is left out as unhealthy. Checks the runs failed that
calibration does not change (configuration: persistence mode, versions, ...) are listed. Criteria whose source is
``spec`` stay (they are the contract), except those of node- and job-wide figures when the runs'
node shape differs from the shipped profile's (an 8-GPU all_reduce minimum says nothing of a 2-GPU
node); ``--override-spec`` calibrates them all. Each calibrated entry says ``source: {kind: measured,
tool, machine, date, n, runs}``, with its statistics in a comment above it. Old against new is printed.

It writes only what it can stand behind: every run must be complete (``clustergate.trust.completeness``), of one
level, of the GPU model ``--extends`` is for (CPU runs calibrate only a CPU profile, GPU runs never one);
and before the file is written every run is judged again under the new profile: if a GPU (node, job) that
calibration kept would fail it, nothing is written and the error names the run, the metric and the part, and
what would let it be written where it applies (``remedies``): a lower ``--fraction`` where a calibrated bound
fails them (with one tried that passes every run), ``--override-spec`` where a spec criterion kept does, runs of
healthy nodes where another kept criterion does.
The file is written whole, never through a link, and never over one of the runs or ``--thresholds``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from clustergate.cluster import calibration_samples as runs_data
from clustergate.common import inputfile
from clustergate.common.exit_codes import refused
from clustergate.common.numbers import number, percent
from clustergate.common.terminal import error_text, main_guarded
from clustergate.criteria.thresholds import Criterion, Profile, ThresholdsError, load, shipped_thresholds
from clustergate.record.outputs import OutputError, Parser, refuse_inputs, write_text
from clustergate.record.rejudge import rejudge
from clustergate.trust import known_metrics

DEFAULT_FRACTION = 0.9
"""A healthy H100/H200 varies about 1-3% from the fleet's median in matmul, copies and collectives:
0.9 passes it with a margin several times its spread, and still fails a GPU 10% short."""
CPU_FRACTION = 0.01
"""The default for CPU runs (``--extends cpu``): CPU ranks share their cores with whatever else runs, and their
figures spread by tens from run to run. Measured on a shared 2-core machine: three standard runs of 2 ranks put a
whole-job send/recv at 0.31 of its median and a rank's host copy at 0.44, where 0.9 and 0.5 failed the very runs
they were calibrated from; three quick runs of one rank, under a load of 15, put one bf16 matmul at 0.024 of the
median, where 0.05 failed. A hundredth of the median still fails a flow that broke outright; the shipped cpu
profile's own minimums are 45 times below what it measured."""
NOT_CALIBRATED = ("gpu_memory_gib",)
"""Exact properties of the hardware, not performance: a fraction of the median means nothing there."""


@dataclass(frozen=True, slots=True)
class Change:
    metric: str
    """The metric's name; for a setting ``settings.NAME``; for a failure the test's name."""
    old: Any
    """The shipped criterion (a setting: its shipped value)."""
    new: Any
    """The calibrated criterion, None when the shipped one stays (a setting: the value the runs showed)."""
    note: str
    stats: dict[str, float] | None = None
    kind: str = "metric"
    """metric | setting (the node shape the runs showed) | failure (a check the runs failed that calibration
    does not change: the new profile fails it too)."""
    floor: str = ""
    """Where the shipped bound held the calibrated one: 'min 0.2 of shipped cpu' (the runs' fraction x median
    lay below it); with --allow-looser where the calibrated bound is looser than it (``looser``)."""
    looser: bool = False
    """Written looser than the shipped profile (only with --allow-looser): marked in the table and the file."""


def _round(x: float, up: bool) -> float:
    """3 significant digits, rounded towards leniency (a minimum down, a maximum up)."""
    if x == 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(abs(x))) - 2)
    return round((math.ceil(x / step) if up else math.floor(x / step)) * step, 12)


def _criterion_dict(c: Criterion) -> dict[str, Any]:
    """A criterion as thresholds.yaml writes it (bounds, unit, description, severity, source)."""
    out: dict[str, Any] = {b.key: b.value for b in c.bounds}
    if c.unit is not None:
        out["unit"] = c.unit
    if c.description:
        out["description"] = c.description
    if c.severity != "fail":
        out["severity"] = c.severity
    if c.source is not None:
        out["source"] = {"kind": c.source.kind, **dict(c.source.detail)} if c.source.detail else c.source.kind
    return out


def _measured(runs: list[runs_data.Run], model: str, shape: str, n: int) -> dict[str, Any]:
    """The ``source`` of a calibrated criterion: what measured it, where, when, how many samples."""
    return {"kind": "measured", "tool": "clustergate runs, clustergate calibrate",
            "machine": f"{model}, {shape}", "date": max(r.started[:10] for r in runs), "n": n, "runs": len(runs)}


def held_to_shipped(name: str, bound: dict[str, float], shipped: Profile | None,
                    allow_looser: bool) -> tuple[dict[str, float], str, bool]:
    """``bound`` (``{"min": x}`` or ``{"max": x}``) held to the shipped profile's bound of metric ``name``: a
    minimum never below the shipped minimum, a maximum never above the shipped maximum; with ``allow_looser`` it
    stays and is marked. Returns the bound, what held it (or what it is looser than), and whether it is looser."""
    crit = shipped.metrics.get(name) if shipped is not None else None
    key, value = next(iter(bound.items()))
    floor = crit.get(key) if crit is not None else None
    if shipped is None or floor is None or (value >= floor if key == "min" else value <= floor):
        return bound, "", False
    said = f"{key} {number(floor)} of shipped {shipped.name}"
    if allow_looser:
        return bound, f"{key} {number(value)} {'below' if key == 'min' else 'above'} {said} (--allow-looser)", True
    return {key: floor}, f"held at {said} (fraction x median: {number(value)}; --allow-looser to go below it)", False


def plan(base: Profile, samples: dict[str, runs_data.Samples], gpus_per_node: int, fraction: float, min_samples: int,
         override_spec: bool, model_has_gpus: bool = True, shipped: Profile | None = None,
         allow_looser: bool = False) -> list[Change]:
    """What happens to every judged metric of ``base``; one error for every metric with too few samples. Each
    calibrated bound is held to ``shipped`` (the profile it extends: ``held_to_shipped``) where that bound is for
    the runs' node shape (a per-GPU figure, or the same gpus_per_node)."""
    same_shape = base.settings.get("gpus_per_node") == gpus_per_node
    changes: list[Change] = []
    sparse: list[str] = []
    for name, crit in base.metrics.items():
        if crit.get("min") is None and crit.get("max") is None:
            continue
        got = samples.get(name)
        if name == "gpu_count" and model_has_gpus:
            new = {**_criterion_dict(crit), "min": gpus_per_node, "max": gpus_per_node}
            changes.append(Change(name, crit, new, "the runs' node shape"))
        elif name in NOT_CALIBRATED or name.endswith("_loss_drop"):
            changes.append(Change(name, crit, None, "kept: a correctness check, not a rate"))
        elif got is None or not got.kept and not got.left_out:
            changes.append(Change(name, crit, None, "kept: not measured in these runs"))
        elif crit.source is not None and crit.source.kind == "spec" and not override_spec \
                and (same_shape or got.scope == "gpu"):
            changes.append(Change(name, crit, None, "kept: spec"))
        else:
            higher = crit.get("min") is not None
            uniform = runs_data.drop_outliers(got, fraction, higher)
            if len(got.kept) < min_samples:
                sparse.append(f"{name} ({len(got.kept)} after {len(got.left_out)} left out)")
                continue
            stats = runs_data.describe(got.values())
            bound = {"min": _round(fraction * stats["median"], up=False)} if higher else \
                {"max": _round(stats["median"] / fraction, up=True)}
            # The floor holds where the shipped figure is for this shape: a per-GPU one, or any of the same shape.
            floored = shipped if same_shape or got.scope == "gpu" else None
            bound, floor, looser = held_to_shipped(name, bound, floored, allow_looser)
            worse = [v for v in got.values() if (v < bound["min"] if higher else v > bound["max"])]
            note = "; ".join(filter(None, [floor, uniform, f"{len(worse)} kept sample(s) fail it: spread too wide "
                                                               f"for {fraction}" if worse else ""]))
            changes.append(Change(name, crit, {**_criterion_dict(crit), **bound}, note, stats, floor=floor,
                                  looser=looser))
    if sparse:
        raise runs_data.CalibrationError(f"too few samples (need {min_samples}) for: {', '.join(sparse)}; give more "
                                         "runs, or pass --min-samples N to accept fewer")
    if model_has_gpus:
        changes += shape_changes(base, getattr(samples, "shape", []))
    changes += [Change(test, "failed", None, f"run {run + 1}: {message}", kind="failure")
                for run, test, message in getattr(samples, "failures", [])]
    return changes


def shape_changes(base: Profile, shape: list[runs_data.ShapeSetting]) -> list[Change]:
    """The node shape the runs showed, one setting each (gpus_per_node is written apart): what the
    hardware-shape tests then compare with, so the new profile accepts the machines it was calibrated on."""
    out = []
    for seen in shape:
        old = base.settings.get(seen.setting)
        if seen.value is None or seen.setting == "ib_ports_per_node" and not seen.value and not old:
            continue  # no InfiniBand seen and none required: nothing to say
        odd = f"; short of it: {', '.join(f'{s.where} ({s.value!r})' for s, _ in seen.odd[:4])}" if seen.odd else ""
        runs = len({s.run for s in seen.seen})
        note = f"seen in {runs} run(s): {seen.counts()}{odd}"
        out.append(Change(f"settings.{seen.setting}", old, seen.value, note, kind="setting"))
    return out


def render(name: str, base: Profile, base_path: Path, runs: list[runs_data.Run], model: str, gpus_per_node: int,
           changes: list[Change], samples: dict[str, runs_data.Samples], fraction: float) -> str:
    """The site thresholds file: header with the method, the new profile first, the shipped ones copied."""
    shipped = yaml.safe_load(inputfile.read_text(base_path, "thresholds"))
    dates = sorted(r.started[:10] for r in runs)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = model == runs_data.CPU_MODEL
    shape = f"{gpus_per_node} {'ranks' if cpu else 'GPUs'} a node"
    describe = f"{base.name} calibrated on {len(runs)} run(s) of {model}, {shape}"
    lines = [
        f"# Site thresholds written by `clustergate calibrate` on {now}.",
        f"# Calibrated from {len(runs)} run(s) ({dates[0]}..{dates[-1]}) of {model}, {shape}:",
        *[f"#   {r.path} (verdict {r.results.get('verdict')}, level {r.results.get('level')})" for r in runs],
        "# Method: GPUs that failed a health check are left out; per metric, values worse than the fraction",
        f"# {fraction} of the fleet's median are left out as outliers; then minimum = {fraction} x median over",
        f"# every GPU (node, job) of every run (maximum = median / {fraction} where lower is better), rounded to",
        "# 3 significant digits. Spec criteria stay unless the node shape differs (node- and job-wide figures).",
        f"# Profile '{name}' extends '{base.name}' of {base_path}; the shipped profiles are copied below it.",
        *(["# It is this file's cpu_profile: a machine without a GPU runs it, --thresholds alone chooses it."]
          if cpu else []),
        "schema: 1",
        f"fallback_profile: {shipped['fallback_profile']}",
        # A CPU profile matches no GPU model: a run chooses it as the file's cpu_profile, so the file names it there.
        f"cpu_profile: {name if cpu else shipped['cpu_profile']}",
        "profiles:",
        f"  {name}:",
        f"    description: {json.dumps(describe)}",
        f"    extends: {base.name}",
        f"    match: {json.dumps(list(base.match))}",
        # CPU ranks keep the base's gpus_per_node (0: the CPU profile's marker for "no GPU").
        *(["    settings:", f"      gpus_per_node: {gpus_per_node}"] if not cpu else []),
    ]
    for c in changes:
        if c.kind == "setting":
            shipped_value = "unset" if c.old is None else json.dumps(c.old)
            lines += [f"      # {c.note}; shipped {base.name}: {shipped_value}",
                      f"      {c.metric.removeprefix('settings.')}: {json.dumps(c.new)}"]
    failed = [c for c in changes if c.kind == "failure"]
    if failed:
        lines.append("    # The runs failed these checks, which calibration does not change (this profile fails them "
                     "too; fix the nodes, or the profile's expect):")
        lines += [f"    #   {c.metric}: {c.note}" for c in failed]
    lines.append("    metrics:")
    for c in changes:
        if c.new is None or c.kind != "metric":
            continue
        if c.stats:
            s, got = c.stats, samples[c.metric]
            left = f", {len(got.left_out)} left out" if got.left_out else ""
            lines.append(f"      # {len({x.run for x in got.kept})} run(s), n={s['n']}{left}, {dates[0]}..{dates[-1]}: "
                         f"median {number(s['median'])}, spread {percent(s['spread'])}, p1 {number(s['p1'])}, "
                         f"p5 {number(s['p5'])}, min {number(s['min'])}, max {number(s['max'])}"
                         + (f"; {c.note}" if c.note else ""))
        n = int(c.stats["n"]) if c.stats else len(runs)
        if c.looser:  # the loader reads no such key: a comment, and list, run, merge and sign-off say it again
            lines.append(f"      # LOOSER THAN SHIPPED: {c.floor}")
        lines.append(f"      {c.metric}: {json.dumps({**c.new, 'source': _measured(runs, model, shape, n)})}")
    body = yaml.safe_dump({"profiles": shipped["profiles"]}, sort_keys=False, width=110).split("\n", 1)[1]
    return "\n".join(lines) + "\n" + body


def table(changes: list[Change]) -> str:
    def bound(c: Criterion | dict[str, Any] | None) -> str:
        if c is None:
            return "="
        return ", ".join(f"{'>=' if k == 'min' else '<='} {number(c.get(k))}" for k in ("min", "max")
                         if c.get(k) is not None)
    rows = [f"{'metric':36} {'old':>18} {'new':>18} {'n':>4} {'median':>10} {'spread':>7}  note"]
    for c in changes:
        if c.kind == "setting":
            rows.append(f"{c.metric:36} {'unset' if c.old is None else str(c.old):>18} {str(c.new):>18} "
                        f"{'':>4} {'':>10} {'':>7}  {c.note}")
            continue
        if c.kind == "failure":
            continue
        s = c.stats or {}
        mark = "LOOSER THAN SHIPPED: " if c.looser else ""
        rows.append(f"{c.metric:36} {bound(c.old):>18} {bound(c.new):>18} {s.get('n', ''):>4} "
                    f"{format(s['median'], '.4g') if s else '':>10} {format(s['spread'], '.1%') if s else '':>7}  "
                    f"{mark}{c.note}")
    failed = [c for c in changes if c.kind == "failure"]
    if failed:
        rows.append("the runs failed these checks, which calibration does not change (the new profile fails them too):")
        rows += [f"  {c.metric}: {c.note}" for c in failed]
    return "\n".join(rows)


def model_problem(model: str, base: Profile, cpu_profile: str) -> str | None:
    """Why runs of ``model`` cannot calibrate ``base`` (None when they can): CPU runs only the CPU profile (or one
    for no GPU), GPU runs only a profile whose ``match`` names their model."""
    cpu_base = base.name == cpu_profile or base.settings.get("gpus_per_node") == 0
    if model == runs_data.CPU_MODEL:
        if cpu_base:
            return None
        return (f"the runs are CPU runs (no GPU), but profile {base.name!r} is for GPUs ({list(base.match)}, "
                f"{base.settings.get('gpus_per_node', '?')} a node): a CPU's figures say nothing of them; pass "
                f"--extends {cpu_profile}, or give runs of that GPU model")
    if cpu_base:
        return f"the runs' GPUs are {model!r} but profile {base.name!r} is for nodes without a GPU: pass --extends " \
               "with the profile of that model"
    if base.match and not any(m.lower() in model.lower() for m in base.match):
        return (f"the runs' GPUs are {model!r} but profile {base.name!r} matches {list(base.match)}; pass --extends "
                "with the profile of that model")
    return None


@dataclass(frozen=True, slots=True)
class Miss:
    """A part calibration kept as healthy that the new profile fails."""

    run: Path
    metric: str
    value: float
    where: str
    criterion: str

    def __str__(self) -> str:
        return (f"{self.run}: {self.metric}={number(self.value)} at {self.where} fails the new profile "
                f"({self.criterion})")


def would_fail(runs: list[runs_data.Run], profile: Profile, samples: runs_data.SampleSet) -> list[Miss]:
    """Every part calibration kept as healthy (no health check failed, an outlier in no metric) that the new profile
    fails, per run and metric: a profile that rejects the healthy machines it was calibrated on is not written."""
    unhealthy = {(x.run, x.where) for got in samples.values() for x, _ in got.left_out}
    out = []
    for i, run in enumerate(runs):
        judged = rejudge(run.results, profile)
        for test in judged["tests"]:
            for m in test.get("metrics") or []:
                for part in m.get("per_rank") or []:
                    where = runs_data.where_of(part, m.get("scope", "gpu"))
                    if part.get("passed", True) or (i, where) in unhealthy:
                        continue
                    out.append(Miss(run.path, str(m["name"]), float(part["value"]), where,
                                    Criterion.from_json(m.get("criterion")).text()))
    return out


def _listed(names: set[str]) -> str:
    shown = sorted(names)
    return ", ".join(shown[:4]) + (f" and {len(shown) - 4} more" if len(shown) > 4 else "")


def remedies(misses: list[Miss], changes: list[Change], fraction: float,
             passes: Callable[[float], bool]) -> list[str]:
    """What would let the profile be written, only what applies to ``misses``: a lower ``--fraction`` where a
    calibrated bound fails them (with one that passes every run, tried: ``passes``), ``--override-spec`` where a
    spec criterion kept from the shipped profile does, healthier nodes where another kept criterion does."""
    by_metric = {c.metric: c for c in changes if c.kind == "metric"}
    held = {m.metric for m in misses if m.metric in by_metric and by_metric[m.metric].floor.startswith("held")}
    calibrated = {m.metric for m in misses if m.metric in by_metric and by_metric[m.metric].stats} - held
    spec = {m.metric for m in misses if m.metric in by_metric and by_metric[m.metric].note == "kept: spec"}
    other = {m.metric for m in misses} - calibrated - spec - held
    out = []
    if held:
        out.append(f"--allow-looser to calibrate {_listed(held)} below the shipped bound these nodes miss (marked as "
                   "looser than shipped in the file, and by list, run, merge and sign-off)")
    if calibrated:
        medians = {name: float((by_metric[name].stats or {}).get("median", 0.0)) for name in calibrated}
        # How far the worst miss lies from its median, as a fraction (below it, or above where lower is better).
        needed = min((min(m.value, medians[m.metric]) / max(m.value, medians[m.metric])
                      for m in misses if m.metric in calibrated and max(m.value, medians[m.metric]) > 0), default=0.0)
        tried = math.floor(needed * 0.95 * 100) / 100
        found = next((f for f in (tried, tried * 0.8, tried * 0.6, tried * 0.4) if 0 < f < fraction
                      and passes(round(f, 3))), None)
        said = f"; --fraction {round(found, 3)} passes every run" if found is not None else ""
        out.append(f"a lower --fraction than {fraction} (the kept figures of {_listed(calibrated)} spread wider than "
                   f"that of their median{said})")
    if spec:
        out.append(f"--override-spec to calibrate the spec criteria of {_listed(spec)} as well (kept as shipped, they "
                   "fail these nodes: or the nodes miss the spec and want fixing)")
    if other:
        out.append(f"runs of healthy nodes (the shipped criteria of {_listed(other)}, which calibration keeps, fail "
                   "them)")
    return out


def _candidate(text: str, out: Path, name: str) -> Profile:
    """The new profile as ``--thresholds`` will load it: the text loaded from a private file beside ``out``."""
    try:
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".check.yaml")
    except OSError as exc:  # the folder -o names, not the private file's name
        raise OSError(exc.errno, exc.strerror, str(out)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            return load(tmp).profile(name)
        except ThresholdsError as exc:  # name the file it would have been, not the private one
            raise ThresholdsError(str(exc).replace(tmp, str(out))) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def main(argv: list[str] | None = None) -> int:
    return main_guarded("clustergate calibrate", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = Parser(prog="clustergate calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="*", help="results.json of finished runs (one GPU model, one node shape)")
    parser.add_argument("--extends", required=True, help="the shipped profile to extend, e.g. h200")
    parser.add_argument("--thresholds", default=str(shipped_thresholds()),
                        help="the thresholds file whose profile it extends (default: the one clustergate "
                             "ships, %(default)s)")
    parser.add_argument("-o", "--output", default="site-thresholds.yaml",
                        help="the site profile to write; never the --thresholds file, and an existing file only "
                             "with --force")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --output")
    parser.add_argument("--name", default=None, help="the new profile's name (default: EXTENDS-site)")
    parser.add_argument("--fraction", type=float, default=None,
                        help=f"minimum = FRACTION x median (default {DEFAULT_FRACTION}; {CPU_FRACTION} for CPU runs, "
                             "whose ranks share their cores)")
    parser.add_argument("--min-samples", type=int, default=3, help="fewest samples a metric is calibrated from")
    parser.add_argument("--override-spec", action="store_true", help="calibrate spec criteria too")
    parser.add_argument("--allow-looser", action="store_true",
                        help="let a calibrated bound be looser than the shipped profile's (a minimum below it, a "
                             "maximum above it), marked in the table and the file; without it the shipped bound "
                             "is the floor")
    args = parser.parse_args(argv)
    try:
        if args.fraction is not None and not 0 < args.fraction < 1:  # nan fails it too
            raise runs_data.CalibrationError(f"--fraction {args.fraction} must lie in (0, 1)")
        if args.min_samples < 1:
            raise runs_data.CalibrationError(f"--min-samples {args.min_samples} must be at least 1")
        out = Path(args.output)
        if out.is_dir():
            raise runs_data.CalibrationError(f"-o {out} is a directory: name the site profile's file "
                                             "(-o site-thresholds.yaml)")
        if out.resolve() == Path(args.thresholds).resolve():
            raise runs_data.CalibrationError(f"-o {out} is the --thresholds file it extends: write the site profile "
                                             "to a file of its own (-o site-thresholds.yaml)")
        refuse_inputs("-o", [out], [Path(r) for r in args.results] + [Path(args.thresholds)],
                      "write the site profile to a file of its own (-o site-thresholds.yaml)")
        if out.exists() and not args.force:
            raise runs_data.CalibrationError(f"-o {out} exists: pass --force to overwrite it, or choose another -o")
        thresholds = known_metrics.check(load(args.thresholds))  # the file first: it is one line to mend
        base = thresholds.profile(args.extends)
        runs = [runs_data.load_run(p) for p in args.results]
        model, gpus_per_node = runs_data.check_alike(runs)
        if (problem := model_problem(model, base, thresholds.cpu_profile)) is not None:
            raise runs_data.CalibrationError(problem)
        cpu = model == runs_data.CPU_MODEL
        fraction = args.fraction if args.fraction is not None else CPU_FRACTION if cpu else DEFAULT_FRACTION
        name = args.name or f"{base.name}-site"

        def attempt(at: float) -> tuple[runs_data.SampleSet, list[Change], str, list[Miss]]:
            """The profile calibrated at fraction ``at``, and the parts of its own runs it would fail."""
            samples = runs_data.collect(runs)
            changes = plan(base, samples, gpus_per_node, at, args.min_samples, args.override_spec,
                           model_has_gpus=not cpu, shipped=base, allow_looser=args.allow_looser)
            text = render(name, base, Path(args.thresholds), runs, model, gpus_per_node, changes, samples, at)
            return samples, changes, text, would_fail(runs, _candidate(text, out, name), samples)  # it must load

        samples, changes, text, failing = attempt(fraction)
        if failing:
            more = f" (and {len(failing) - 5} more)" if len(failing) > 5 else ""
            fixes = remedies(failing, changes, fraction, lambda at: not attempt(at)[3])
            raise runs_data.CalibrationError("nothing written: the new profile would fail parts of the runs it was "
                                             "calibrated from that calibration kept as healthy: "
                                             + "; ".join(map(str, failing[:5])) + more + "; to write it, give "
                                             + "; or ".join(fixes))
        write_text(out, text)
    except (runs_data.CalibrationError, ThresholdsError, OutputError, OSError) as exc:
        print(f"clustergate calibrate: {error_text(exc)}", file=sys.stderr)
        return refused(exc)
    ranks = f"{gpus_per_node} rank{'' if gpus_per_node == 1 else 's'} a node"
    print(f"{len(runs)} run(s) of {model}, {ranks} -> profile {name!r} in {out} (minimum = {fraction} x median)")
    print(table(changes))
    unhealthy = sorted({(x.run, x.where, why) for got in samples.values() for x, why in got.left_out
                        if not why.startswith("outlier")})
    for run, where, why in unhealthy:
        print(f"left out of every metric: {where} (run {run + 1}): {why}")
    for c in changes:
        for x, why in samples[c.metric].left_out if c.stats else []:
            if why.startswith("outlier"):
                print(f"left out of {c.metric}: {x.where} (run {x.run + 1}): {why}")
    print(f"use it: --thresholds {out} on every phase" + ("" if base.match or cpu else f" --profile {name}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
