"""What finished runs measured, per metric, across GPUs and runs: the samples a site profile is calibrated from.

Reads results.json files (one node or many, accepted or not), checks they describe one GPU model
and one node shape, and collects every metric's values: per GPU for gpu-scope metrics, per node or
per job for the others. GPUs that failed a health check are left out of every metric; a value far
from its fleet's median is left out of that metric as an outlier. Pure data in, data out: the
command that writes the profile is ``clustergate calibrate`` (``clustergate.cluster.calibrate``).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clustergate.common.numbers import number
from clustergate.record import resultsfile
from clustergate.record.verdict import contradiction
from clustergate.trust import completeness
from clustergate.trust import manifest as suite_manifest
from workloads.node.checks import FABRIC_KINDS

HEALTH_TESTS = ("test_gpu_inventory.py",)
"""Test files whose failures mark a GPU unhealthy (ECC, row remapping, clocks, links, a process of another
job on the GPU, ...): such a GPU is left out of every metric of that run."""
SHAPE_TESTS = ("test_gpu_count", "test_nvlinks_active", "test_pcie_link", "test_mig_mode")
"""Health tests that compare a GPU with the profile's node shape: run under a profile of another shape (18
NVLinks expected of one GPU passed through to a VM) they fail every GPU alike. Their failures do not mark a
GPU unhealthy; the shape they saw is read instead (``observe_shape``), and a GPU is unhealthy only where it
differs from the fleet's (17 NVLinks where the others have 18)."""
CPU_MODEL = "CPU (no GPU)"


class CalibrationError(ValueError):
    """The inputs cannot be calibrated from; the message names the file or metric and what to do."""


@dataclass(frozen=True, slots=True)
class Run:
    path: Path
    results: dict[str, Any]
    model: str
    gpus_per_node: int
    started: str
    level: str = "standard"


@dataclass(frozen=True, slots=True)
class Sample:
    value: float
    run: int
    where: str
    """host, GPU index and serial (gpu scope), the node (node scope) or 'whole job'."""


@dataclass(slots=True)
class Samples:
    """One metric's values over every run: those kept and those left out, with why."""

    name: str
    unit: str
    scope: str
    kept: list[Sample] = field(default_factory=list)
    left_out: list[tuple[Sample, str]] = field(default_factory=list)

    def values(self) -> list[float]:
        return [s.value for s in self.kept]


def _fail(path: Path, problem: str) -> CalibrationError:
    return CalibrationError(f"{path}: {problem}")


def load_run(path: str | Path) -> Run:
    """One finished run's results.json, checked: a clustergate results file, finished, complete (every test of a
    node or fabric run: a partial run's figures describe what it happened to run), one GPU model, one node shape."""
    path = Path(path)
    try:
        data = resultsfile.read(path)
    except resultsfile.ResultsFileError as exc:
        raise CalibrationError(f"{exc}; give the results.json files of finished runs") from None
    manifest = suite_manifest.shipped()
    if (problem := contradiction(data, manifest)) is not None:
        raise _fail(path, f"its records contradict themselves ({problem}): not calibrated from")
    if data.get("verdict") == "running":
        raise _fail(path, "the run did not finish (verdict 'running'); calibrate from finished runs only")
    if partial := completeness.partial(data, manifest):
        raise _fail(path, f"a partial run ({'; '.join(partial)}): calibrate from complete runs only")
    names = {g.get("name") for n in data["nodes"] for g in n.get("gpus", [])} - {None}
    if len(names) > 1:
        raise _fail(path, f"GPUs of different models in one run ({', '.join(sorted(names))}); calibrate one model "
                          "at a time")
    shapes = {len(n.get("ranks", [])) for n in data["nodes"]}
    if len(shapes) > 1:
        raise _fail(path, f"nodes ran different numbers of ranks ({sorted(shapes)}); a profile is for one node shape")
    if not shapes or not data["tests"]:
        raise _fail(path, "the run has no nodes or no tests: nothing was measured")
    return Run(path=path, results=data, model=names.pop() if names else CPU_MODEL, gpus_per_node=shapes.pop(),
               started=str(data.get("started") or "?"), level=str(data.get("level")))


def check_alike(runs: list[Run]) -> tuple[str, int]:
    """The runs' one GPU model and node shape; a clear error when they differ."""
    if not runs:
        raise CalibrationError("no results.json given; pass the results.json files of one or more finished runs")
    for what, key in (("GPU models", "model"), ("node shapes (ranks per node)", "gpus_per_node"),
                      ("levels (a figure at quick is not one at standard)", "level")):
        seen = {getattr(r, key) for r in runs}
        if len(seen) > 1:
            listing = "; ".join(f"{r.path}: {getattr(r, key)}" for r in runs)
            raise CalibrationError(f"the runs have different {what}: {listing}; calibrate each kind on its own")
    return runs[0].model, runs[0].gpus_per_node


def where_of(entry: dict[str, Any], scope: str) -> str:
    """A part as calibration names it: "HOST gpu N serial S", "node N (HOST)" or "whole job"."""
    if scope == "world":
        return "whole job"
    if scope == "node":
        return f"node {entry.get('node_rank')} ({entry.get('host')})"
    gpu = f"gpu {entry['gpu_index']}" if entry.get("gpu_index") is not None else f"rank {entry.get('rank')}"
    serial = f" serial {entry['gpu_serial']}" if entry.get("gpu_serial") else ""
    return f"{entry.get('host')} {gpu}{serial}"


def test_name(test: dict[str, Any]) -> str:
    """The test function's name of a results.json test entry (no file, no parameters)."""
    return str(test.get("nodeid", "")).split("::")[-1].split("[")[0]


def unhealthy_ranks(run: Run) -> dict[int, str]:
    """Ranks that failed a health check in ``run``, with the test's name (shape checks aside: ``SHAPE_TESTS``)."""
    out: dict[int, str] = {}
    for test in run.results["tests"]:
        if test.get("outcome") in ("failed", "error") and test.get("nodeid", "").split("::")[0].endswith(HEALTH_TESTS) \
                and test_name(test) not in SHAPE_TESTS:
            for rank in test.get("failed_ranks", []):
                out.setdefault(rank, test["nodeid"].split("::")[-1])
    return out


# ---- node shape: what the hardware-shape tests compare with the profile, as the runs saw it ----------------

@dataclass(frozen=True, slots=True)
class Seen:
    """One GPU's (or node's) value of a shape setting in one run."""

    run: int
    rank: int
    where: str
    value: Any


@dataclass(slots=True)
class ShapeSetting:
    """A profile setting the hardware-shape tests compare against, and what the runs showed for it."""

    setting: str
    scope: str
    """gpu or node"""
    source: str
    """Where results.json records the observed value."""
    seen: list[Seen] = field(default_factory=list)
    value: Any = None
    """The fleet's value: the most common over the healthy GPUs (nodes) of every run (a tie: the better)."""
    odd: list[tuple[Seen, str]] = field(default_factory=list)
    """GPUs (nodes) short of the fleet's value, with why: unhealthy, left out of every metric."""

    def counts(self) -> str:
        """'18 on 14 GPU(s), 17 on 2 GPU(s)'."""
        return ", ".join(f"{v} on {n} {self.scope.upper() if self.scope == 'gpu' else self.scope}(s)"
                         for v, n in Counter(json.dumps(s.value) for s in self.seen).most_common())


def _tests(run: Run, name: str) -> list[dict[str, Any]]:
    return [t for t in run.results["tests"] if test_name(t) == name]


def _rows(run: Run, name: str, key: str) -> dict[int, dict[str, Any]]:
    """{rank: row} of a settled inventory check's per-rank table (acceptance.gpu_helpers.settle)."""
    out: dict[int, dict[str, Any]] = {}
    for test in _tests(run, name):
        for row in (test.get("details") or {}).get(key) or []:
            if isinstance(row, dict) and isinstance(row.get("rank"), int):
                out[row["rank"]] = row
    return out


def _snapshots(run: Run) -> dict[int, dict[str, Any]]:
    """{rank: NVML snapshot} as test_gpu_count records them (workloads.gpu.inventory.snapshot)."""
    out: dict[int, dict[str, Any]] = {}
    for test in _tests(run, "test_gpu_count"):
        snaps = (test.get("details") or {}).get("snapshots") or []
        out.update({s.get("rank", r): s for r, s in enumerate(snaps) if isinstance(s, dict)})
    return out


def _nvlinks(run: Run) -> dict[int, int]:
    """Active NVLinks per GPU: the snapshot's link states (none listed: NVML reports no NVLink, 0), else the
    NVLink check's own table."""
    out: dict[int, int] = {}
    for rank, snap in _snapshots(run).items():
        gpu = snap.get("gpu") or {}
        if isinstance(gpu.get("nvlink_states"), list):
            out[rank] = sum(1 for link in gpu["nvlink_states"] if link.get("active"))
        elif "nvlink_states" in (snap.get("unsupported") or {}):
            out[rank] = 0
    for rank, row in _rows(run, "test_nvlinks_active", "nvlinks").items():
        if rank in out:
            continue
        if isinstance(row.get("value"), dict) and "active" in row["value"]:
            out[rank] = int(row["value"]["active"])
    return out


def _pcie(run: Run, key: str) -> dict[int, int]:
    """The PCIe link each GPU trained at under load (test_pcie_link's table; never an idle reading)."""
    return {rank: int(row["value"][key]) for rank, row in _rows(run, "test_pcie_link", "pcie_link").items()
            if isinstance(row.get("value"), dict) and isinstance(row["value"].get(key), int)
            and row["value"].get("pcie_measured_under_load")}


def _mig(run: Run) -> dict[int, str]:
    out: dict[int, str] = {}
    for rank, row in _rows(run, "test_mig_mode", "mig_mode").items():
        if isinstance(row.get("value"), dict) and row["value"].get("current") in ("enabled", "disabled"):
            out[rank] = row["value"]["current"]
        elif row.get("status") == "ok" and row.get("value") is None:
            out[rank] = "disabled"  # MIG not supported on this GPU, hence disabled
    return out


def _ib_nodes(run: Run) -> dict[int, tuple[int, float | None]]:
    """{node's lowest rank: (ACTIVE InfiniBand or RoCE ports at the node's fastest rate, that rate)} from
    test_nodes_built_alike's discovery (what test_infiniband_ports_active counts: link layer InfiniBand or Ethernet,
    state ACTIVE). The rails are the fastest ports: a slower storage or management NIC (often RoCE) would lower the
    rate every rail is held to, so it is left out."""
    first = {n.get("node_rank"): min(n.get("ranks") or [0]) for n in run.results["nodes"]}
    out: dict[int, tuple[int, float | None]] = {}
    for test in _tests(run, "test_nodes_built_alike"):
        for node in (test.get("details") or {}).get("discovery") or []:
            ports = node.get("infiniband")
            if not isinstance(ports, list):
                continue
            active = [p for p in ports if p.get("state") == "ACTIVE" and p.get("link_layer") in FABRIC_KINDS]
            rates = [p["rate_gbps"] for p in active if isinstance(p.get("rate_gbps"), (int, float))]
            top = max(rates) if rates else None
            rails = [p for p in active if top is None or p.get("rate_gbps") == top]
            out[first.get(node.get("node_rank"), 0)] = (len(rails), top)
    return out


def _where_rank(run: Run, rank: int, scope: str = "gpu") -> str:
    for node in run.results["nodes"]:
        if rank in (node.get("ranks") or []):
            if scope == "node":
                return f"node {node.get('node_rank')} ({node.get('host')})"
            gpu = next((g for g in node.get("gpus", []) if g.get("rank") == rank), None)
            if gpu is None and len(node.get("gpus", [])) == len(node.get("ranks") or []):
                gpu = node["gpus"][(node.get("ranks") or []).index(rank)]
            if gpu:
                return f"{node.get('host')} gpu {gpu.get('index')}" + (f" serial {gpu['serial']}" if gpu.get("serial")
                                                                       else "")
            return f"{node.get('host')} rank {rank}"
    return f"rank {rank}"


Better = Callable[[Any, Any], bool]
SHAPE: tuple[tuple[str, str, str, Callable[[Run], dict[int, Any]], Better], ...] = (
    ("nvlinks_per_gpu", "gpu", "test_gpu_count details.snapshots[].gpu.nvlink_states (test_nvlinks_active's table)",
     _nvlinks, lambda a, b: a > b),
    ("pcie_generation", "gpu", "test_pcie_link details.pcie_link[].value.pcie_gen_current (under load)",
     lambda r: _pcie(r, "pcie_gen_current"), lambda a, b: a > b),
    ("pcie_width", "gpu", "test_pcie_link details.pcie_link[].value.pcie_width_current (under load)",
     lambda r: _pcie(r, "pcie_width_current"), lambda a, b: a > b),
    ("mig_mode", "gpu", "test_mig_mode details.mig_mode[].value.current", _mig, lambda a, b: False),
    ("ib_ports_per_node", "node", "test_nodes_built_alike details.discovery[].infiniband (ACTIVE, InfiniBand or RoCE)",
     lambda r: {k: v[0] for k, v in _ib_nodes(r).items()}, lambda a, b: a > b),
    ("ib_rate_gbps", "node", "test_nodes_built_alike details.discovery[].infiniband[].rate_gbps (ACTIVE ports)",
     lambda r: {k: v[1] for k, v in _ib_nodes(r).items() if v[1] is not None}, lambda a, b: a > b),
)
"""(setting, scope, where results.json records it, reader, better(a, b)): every setting of thresholds.yaml a
hardware-shape test compares against, beside gpus_per_node (the ranks per node, ``Run.gpus_per_node``).
Not here: gpu_name (the model: ``check_alike`` and the base's ``match``), required_transport (the fabric, seen
only across nodes; a run that fell back to sockets must not teach a profile that sockets are fine)."""


def observe_shape(runs: list[Run]) -> list[ShapeSetting]:
    """Every shape setting the runs show: per GPU (node) of each run, the fleet's value and the odd ones out.

    GPUs that failed another health check do not vote. A GPU short of the fleet's value (fewer links, a
    slower PCIe link, another MIG mode) is odd: ``collect`` leaves it out of every metric."""
    out: list[ShapeSetting] = []
    sick = [unhealthy_ranks(run) for run in runs]
    for setting, scope, source, read, better in SHAPE:
        shape = ShapeSetting(setting, scope, source)
        for i, run in enumerate(runs):
            for rank, value in sorted(read(run).items()):
                shape.seen.append(Seen(i, rank, _where_rank(run, rank, scope), value))
        voters = [s for s in shape.seen if s.rank not in sick[s.run]] or shape.seen
        if not voters:
            continue
        tally = Counter(json.dumps(s.value) for s in voters)
        top = max(tally.values())
        candidates = [json.loads(v) for v, n in tally.items() if n == top]
        value = candidates[0]
        for c in candidates[1:]:
            value = c if better(c, value) else value
        shape.value = value
        shape.odd = [(s, f"{setting} {s.value!r} where the fleet's GPUs have {value!r}" if scope == "gpu" else
                      f"{setting} {s.value!r} where the fleet's nodes have {value!r}")
                     for s in shape.seen if s.value != value and not better(s.value, value)]
        out.append(shape)
    return out


class SampleSet(dict[str, Samples]):
    """Every metric's samples (a dict by metric name), with the node shape the runs showed."""

    shape: list[ShapeSetting]
    failures: list[tuple[int, str, str]]
    """(run, test, message) of tests that failed on a check, not on a metric's criterion, shape checks aside:
    calibration changes figures and the node shape, so a profile calibrated from these runs fails them too."""


def check_failures(runs: list[Run]) -> list[tuple[int, str, str]]:
    out = []
    for i, run in enumerate(runs):
        for test in run.results["tests"]:
            if test.get("outcome") not in ("failed", "error") or test_name(test) in SHAPE_TESTS:
                continue
            if any(m.get("passed") is False for m in test.get("metrics") or []):
                continue  # a figure missed its criterion: calibration judges the figures anew
            first = str(test.get("message") or "").strip().splitlines()
            out.append((i, str(test["nodeid"]).split("::")[-1], first[0][:200] if first else test["outcome"]))
    return out


def collect(runs: list[Run]) -> SampleSet:
    """Every metric's samples over ``runs``; GPUs that failed a health check, or that are short of the fleet's
    node shape, already left out; the shape itself in ``.shape``."""
    out = SampleSet()
    out.shape = observe_shape(runs)
    out.failures = check_failures(runs)
    for i, run in enumerate(runs):
        sick = {rank: f"failed {name}" for rank, name in unhealthy_ranks(run).items()}
        for shape in out.shape:
            for seen, why in shape.odd:
                if seen.run == i and shape.scope == "gpu":
                    sick.setdefault(seen.rank, why)
        for test in run.results["tests"]:
            for m in test.get("metrics", []):
                scope = m.get("scope", "gpu")
                samples = out.setdefault(m["name"], Samples(m["name"], m.get("unit", ""), scope))
                for entry in m.get("per_rank") or [{"value": m["value"], "rank": 0}]:
                    sample = Sample(float(entry["value"]), i, where_of(entry, scope))
                    if scope == "gpu" and entry.get("rank") in sick:
                        samples.left_out.append((sample, f"{sick[entry['rank']]} in {run.path}"))
                    else:
                        samples.kept.append(sample)
    return out


def drop_outliers(samples: Samples, fraction: float, higher_is_better: bool) -> str:
    """Leave out the values worse than ``fraction`` of the median (higher is better) or above median /
    ``fraction`` (lower is better): one bad GPU must not pull a site's minimum down. Only a minority
    (at most a quarter) is an outlier: beyond that the fleet is not uniform, nothing is left out, and
    the returned note says so."""
    if len(samples.kept) < 3:
        return ""  # two values have no majority to tell the odd one out
    med = statistics.median(samples.values())
    bad = [s for s in samples.kept if (s.value < fraction * med if higher_is_better else s.value > med / fraction)]
    if len(bad) * 4 > len(samples.kept):
        return (f"not uniform: {len(bad)} of {len(samples.kept)} samples are {fraction} of the median or worse; "
                "nothing left out, look at those GPUs and runs before trusting this bound")
    samples.left_out += [(s, f"outlier: {number(s.value)} against the median {number(med)}") for s in bad]
    samples.kept = [s for s in samples.kept if s not in bad]
    return ""


def describe(values: list[float]) -> dict[str, float]:
    """n, median, spread (median absolute deviation / median), low and high percentiles, min and max."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"n": len(values), "median": med, "spread": mad / med if med else 0.0, "p1": cuts[0], "p5": cuts[4],
            "p95": cuts[94], "p99": cuts[98], "min": min(values), "max": max(values)}
