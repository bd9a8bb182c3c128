"""metrics.prom: a results document in the OpenMetrics text format, for node_exporter's textfile collector.

Pure: a results dict in, text out. The text is valid OpenMetrics (``# EOF`` last) and equally valid in the
Prometheus text format that node_exporter's textfile collector parses (gauges only, no timestamps on
samples: the collector refuses them; the run's time is a sample of its own).

Every figure is one sample of one family, ``clustergate_metric_value``, with the metric as a label: the
suite's metric names stay data (a new metric adds series, never a new family), and each series is one
part's figure: ``{host, gpu, serial, metric, unit}`` (``gpu`` is ``rank N`` on a node without GPUs). Its
series count is GPUs x per-GPU metrics plus nodes x per-node metrics: about 25 x 8 for a node.

A run's document (a node of the node phase, a fabric run):

    clustergate_run_info{kind="run", profile, level, version} 1
    clustergate_verdict{kind="run", verdict="running"|"accept"|...} 1 for the run's verdict, 0 for the others
    clustergate_run_timestamp_seconds{kind} / clustergate_run_duration_seconds{kind}
    clustergate_metric_value{host, gpu, serial, metric, unit}      the part's figure
    clustergate_metric_verdict{host, gpu, serial, metric, unit}    0 pass, 1 warn, 2 fail (absent: unjudged)
    clustergate_metric_drift_fraction{...}                         how far below its first accepted figure

A merge's cluster document: its verdict, time, node counts, each node's status
(``clustergate_node_accepted{kind, host}``), the fleet's distribution of each metric
(``clustergate_fleet_metric{metric, unit, stat}``) and its outliers. The GPUs' own figures are not repeated:
each node's own metrics.prom carries them, and the same figure under two exporters would count twice in
every sum and average. A sign-off's document gives its verdict, time and each host's status.

A family is declared once (``FAMILIES``: its HELP text and label names), whichever document writes it: node_exporter's
textfile collector reads every file of its directory into one exposition and refuses a family whose HELP differs
between files (it then drops that family's series of every file but the first, and logs an error at every scrape).
Every family that a node's, a merge's and a sign-off's file all have carries ``kind`` (run, cluster, signoff):
one collector may read all three files without two series of the same name and labels.

Label values are escaped as both formats require (backslash, double quote, newline).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, get_args

from clustergate import __version__
from clustergate.criteria.criterion import Criterion
from clustergate.record.verdict import VerdictName
from clustergate.store.rows import kind_of, part_verdict, seconds

RUN_VERDICTS: tuple[str, ...] = get_args(VerdictName)
CLUSTER_VERDICTS = ("accept", "reject")
FIGURE_VERDICT = {"pass": 0, "warn": 1, "fail": 2}
FLEET_STATS = ("count", "min", "p05", "median", "p95", "max", "floor")

Labels = Mapping[str, str]
Sample = tuple[Labels, float]


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as every document writes it."""

    help: str
    """Its HELP text: one text for the family, whichever document (run, merge, sign-off) writes it."""
    labels: tuple[str, ...]
    """Its label names, in order; a sample that lacks one has it empty (which Prometheus reads as absent)."""


PART = ("host", "gpu", "serial", "metric", "unit")
"""The labels naming one part's figure of one metric (``gpu`` is ``rank N`` on a node without GPUs)."""

FAMILIES: dict[str, Family] = {
    "clustergate_run_info": Family("what was run, merged or signed off (kind: run, cluster or signoff); always 1",
                                   ("kind", "profile", "level", "version")),
    "clustergate_verdict": Family("1 for the verdict of the run, merge or sign-off (kind), 0 for each other verdict",
                                  ("kind", "verdict")),
    "clustergate_run_timestamp_seconds": Family("when the run, merge or sign-off (kind) started, seconds since the "
                                                "epoch", ("kind",)),
    "clustergate_run_duration_seconds": Family("how long the run took, seconds", ("kind",)),
    "clustergate_metric_value": Family("a part's figure of one metric (a GPU's, a node's, or the whole job's); its "
                                       "unit in the unit label", PART),
    "clustergate_metric_verdict": Family("the figure against its criterion: 0 pass, 1 warn (missed a severity-warn "
                                         "criterion), 2 fail; absent where the metric is not judged", PART),
    "clustergate_metric_drift_fraction": Family("how far the figure fell below its own first accepted figure, where "
                                                "that is more than the profile allows", PART),
    "clustergate_cluster_nodes": Family("nodes of the merge by status (expected, results, accepted, excluded, "
                                        "missing, fleet_outliers)", ("status",)),
    "clustergate_node_accepted": Family("1 for a host the merge or sign-off (kind) accepted, 0 for one it excluded",
                                        ("kind", "host")),
    "clustergate_fleet_metric": Family("the fleet's distribution of a metric over every GPU (or node): count, min, "
                                       "p05, median, p95, max, and the outlier floor", ("metric", "unit", "stat")),
    "clustergate_fleet_outlier_value": Family("a GPU's figure below the fleet's floor for that metric",
                                              (*PART, "severity")),
}


def escape(value: str) -> str:
    """A label value as both text formats write it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    """A sample value: a whole number without a fraction, else Python's shortest exact form (1e-05)."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def family(name: str, samples: Iterable[Sample]) -> list[str]:
    """One gauge family as ``FAMILIES`` declares it: its HELP and TYPE lines and a line per sample, each with the
    family's labels in their order (none at all without samples). ValueError for a label the family lacks."""
    declared = FAMILIES[name]
    lines = []
    for labels, value in samples:
        if unknown := set(labels) - set(declared.labels):
            raise ValueError(f"{name} has no label {sorted(unknown)[0]!r}; its labels are {declared.labels}")
        pairs = ",".join(f'{k}="{escape(labels.get(k, ""))}"' for k in declared.labels)
        lines.append(f"{name}{{{pairs}}} {number(value)}" if pairs else f"{name} {number(value)}")
    return [f"# HELP {name} {declared.help}", f"# TYPE {name} gauge", *lines] if lines else []


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _enum(kind: str, values: tuple[str, ...], current: Any) -> list[Sample]:
    return [({"kind": kind, "verdict": v}, 1.0 if v == current else 0.0) for v in values]


def _head(results: Mapping[str, Any], verdicts: tuple[str, ...], when: Any, duration: Any = None) -> list[list[str]]:
    """The families every document starts with, alike for a run, a merge and a sign-off: what it was, its verdict,
    when it started and (a run) how long it took."""
    kind = kind_of(results)
    version = (results.get("clustergate") or {}).get("version") or __version__
    out = [family("clustergate_run_info", [({"kind": kind, "profile": _text(results.get("profile")),
                                             "level": _text(results.get("level")), "version": _text(version)}, 1.0)]),
           family("clustergate_verdict", _enum(kind, verdicts, results.get("verdict")))]
    t = seconds(_text(when) or None)
    if t is not None:
        out.append(family("clustergate_run_timestamp_seconds", [({"kind": kind}, t)]))
    if isinstance(duration, (int, float)) and not isinstance(duration, bool):
        out.append(family("clustergate_run_duration_seconds", [({"kind": kind}, float(duration))]))
    return out


def _part_labels(metric: Mapping[str, Any], part: Mapping[str, Any], only_host: str | None) -> dict[str, str]:
    scope = metric.get("scope", "gpu")
    host = part.get("host") if scope != "world" else only_host
    gpu = scope == "gpu"
    return {"host": _text(host), "gpu": _gpu_label(part) if gpu else "",
            "serial": _text(part.get("gpu_serial")) if gpu else "", "metric": str(metric["name"]),
            "unit": _text(metric.get("unit"))}


def _gpu_label(part: Mapping[str, Any]) -> str:
    """The ``gpu`` label of every family that names a GPU (figures, verdicts, drift, outliers): the GPU's index;
    on a node without GPUs (the cpu profile) each rank is a part of its own, ``rank N``: with one empty label for
    every rank of a host, two ranks' figures would be one series."""
    if part.get("gpu_index") is None and part.get("rank") is not None:
        return f"rank {part['rank']}"
    return _text(part.get("gpu_index"))


def _run(results: Mapping[str, Any]) -> list[list[str]]:
    nodes = results.get("nodes") or []
    only_host = nodes[0].get("host") if len(nodes) == 1 else None
    values: list[Sample] = []
    verdicts: list[Sample] = []
    seen: dict[tuple[str, ...], str] = {}
    for test in results.get("tests") or []:
        for m in test.get("metrics") or []:
            criterion = Criterion.from_json(m.get("criterion"))
            for p in m.get("per_rank") or [{"value": m["value"], "passed": m.get("passed", True),
                                            "warned": m.get("warned", False), "host": only_host}]:
                labels = _part_labels(m, p, only_host)
                key = tuple(labels.values())
                if key in seen:
                    raise ValueError(f"metric {m['name']} of {labels['host'] or 'the whole job'} is recorded by "
                                     f"{seen[key]} and {test.get('nodeid')}: a metric's name is its series' "
                                     "identity, so one test records it")
                seen[key] = str(test.get("nodeid"))
                values.append((labels, float(p["value"])))
                verdict = part_verdict(criterion, p)
                if verdict in FIGURE_VERDICT:
                    verdicts.append((labels, float(FIGURE_VERDICT[verdict])))
    drifted = [({"host": _text(d.get("host")), "gpu": _gpu_label(d) if d.get("scope", "gpu") == "gpu" else "",
                 "serial": _text(d.get("serial")), "metric": str(d.get("metric")), "unit": _text(d.get("unit"))},
                float(d.get("fraction", 0)))
               for d in (results.get("drift") or {}).get("findings") or []]
    return [*_head(results, RUN_VERDICTS, results.get("started"), results.get("duration_s")),
            family("clustergate_metric_value", values), family("clustergate_metric_verdict", verdicts),
            family("clustergate_metric_drift_fraction", drifted)]


def _decided(results: Mapping[str, Any]) -> list[Sample]:
    kind = kind_of(results)
    if kind == "signoff":
        hosts = {**{h: 1.0 for h in results.get("accepted") or []},
                 **{e["host"]: 0.0 for e in results.get("excluded") or []}}
    else:
        hosts = {n["host"]: 1.0 if n.get("status") == "accepted" else 0.0 for n in results.get("nodes") or []}
        hosts.update({e["host"]: 0.0 for e in results.get("excluded") or [] if e["host"] not in hosts})
    return [({"kind": kind, "host": str(h)}, v) for h, v in sorted(hosts.items())]


def _cluster(results: Mapping[str, Any]) -> list[list[str]]:
    counts = [({"status": k}, float(v)) for k, v in (results.get("counts") or {}).items() if isinstance(v, int)]
    stats: list[Sample] = []
    outliers: list[Sample] = []
    for f in results.get("fleet") or []:
        for stat in FLEET_STATS:
            if isinstance(f.get(stat), (int, float)):
                stats.append(({"metric": str(f["metric"]), "unit": _text(f.get("unit")), "stat": stat},
                              float(f[stat])))
        for o in f.get("outliers") or []:
            outliers.append(({"host": _text(o.get("host")), "gpu": _gpu_label(o),
                              "serial": _text(o.get("gpu_serial")), "metric": str(f["metric"]),
                              "unit": _text(f.get("unit")), "severity": _text(o.get("severity"))},
                             float(o["value"])))
    return [*_head(results, CLUSTER_VERDICTS, results.get("created")),
            family("clustergate_cluster_nodes", counts), family("clustergate_node_accepted", _decided(results)),
            family("clustergate_fleet_metric", stats), family("clustergate_fleet_outlier_value", outliers)]


def render(results: Mapping[str, Any]) -> str:
    """metrics.prom for a run's results.json, a merge's cluster results.json or a signoff.json.
    ValueError when one metric's figure of one part is recorded twice (by two tests)."""
    families = _run(results) if kind_of(results) == "run" else _cluster(results)
    return "\n".join([line for f in families for line in f] + ["# EOF"]) + "\n"
