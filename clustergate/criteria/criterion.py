"""A criterion: what one metric must satisfy in one profile, and everything that follows from it.

A criterion is a set of bounds (after ReFrame's reference bounds), each one kind of check with its
own key in thresholds.yaml. A bound knows how its value is range-checked, how a figure misses it,
which way is better, its headroom and how it reads; the criterion combines its bounds and also
judges per-GPU figures against their peers (node and cluster medians). Loading (thresholds.py),
judging (judge.py) and describing (the terminal summary and the report) all go through here.

A new kind of bound is one ``Bound`` subclass added to ``BOUNDS``, and its tests.

Every criterion also says where it comes from (``source``: spec, measured, published, peers or estimate;
see ``clustergate.criteria.sources``) and what a miss weighs (``severity``): ``fail`` (the default) fails the
test; ``warn`` lists the miss among the run's warnings and never turns accept into reject.

The peer bounds (``outlier_fraction``, ``outlier_multiple``) judge a part against the median of its peers: a
per-GPU figure against its node's GPUs and, in a run of several nodes, every GPU; a per-node figure against
every node of the run; and at merge every part against the fleet (``clustergate.cluster.fleet``), by the same
bounds and the same words.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from clustergate.common.numbers import number, percent, yaml_text_number
from clustergate.criteria.sources import Source, SourceError

TEXT_KEYS = {
    "unit": "the unit the metric must be recorded in",
    "description": "what the figure means, for the report",
}
SEVERITIES = ("fail", "warn")
WEIGHT_KEYS = {
    "severity": "fail (default): a miss fails the test; warn: a miss is listed as a warning, the verdict stands",
    "source": "where the figures come from: spec, estimate, peers, {kind: published, note} or "
              "{kind: measured, tool, machine, date, n}",
}


class CriterionError(ValueError):
    """A criterion is malformed: ``where`` names the key (the caller adds the file), ``problem`` the fix."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where, self.problem = where, problem


class Figure(NamedTuple):
    """One part's recorded figure, as a criterion judges it."""

    value: float
    unit: str
    node: int


@dataclass(frozen=True, slots=True)
class Bound:
    """One kind of check on a figure. Subclasses set the class attributes and override what differs."""

    value: float
    key: ClassVar[str]
    help: ClassVar[str]
    better: ClassVar[str | None] = None
    """``"up"``: a floor (higher is better); ``"down"``: a limit; None: no sense of better (a sanity bound)."""
    worst: ClassVar[str]
    """Which end of a metric's figures stands for it when this bound judges it: ``"low"`` or ``"high"``."""
    peers: ClassVar[bool] = False
    """Judges a per-GPU figure against the medians of its peers."""

    def check(self) -> str | None:
        """Why ``value`` is not a valid setting of this bound (None when it is)."""
        return None

    def missed(self, figure: float, medians: Mapping[str, float]) -> list[str]:
        """How ``figure`` misses this bound, one phrase each (empty when it does not)."""
        raise NotImplementedError

    def text(self) -> str:
        raise NotImplementedError

    def margin_pct(self, figure: float) -> float | None:
        """Headroom of ``figure`` against this bound in % (negative: missed); None where it has no sense."""
        return None

    def floor(self, median: float | None) -> float | None:
        """The lowest figure this bound passes, given its peers' median (None: it sets no floor)."""
        return None

    def limit(self, median: float | None) -> float | None:
        """The highest figure this bound passes, given its peers' median (None: it sets no limit)."""
        return None


class Min(Bound):
    key, help, better, worst = "min", "fail below this value", "up", "low"

    def missed(self, figure: float, medians: Mapping[str, float]) -> list[str]:
        return [f"expected >= {number(self.value)}"] if figure < self.value else []

    def floor(self, median: float | None) -> float | None:
        return self.value

    def text(self) -> str:
        return f">= {number(self.value)}"

    def margin_pct(self, figure: float) -> float | None:
        return (figure - self.value) / abs(self.value) * 100 if self.value else None


class Max(Bound):
    key, help, better, worst = "max", "fail above this value", "down", "high"

    def missed(self, figure: float, medians: Mapping[str, float]) -> list[str]:
        return [f"expected <= {number(self.value)}"] if figure > self.value else []

    def limit(self, median: float | None) -> float | None:
        return self.value

    def text(self) -> str:
        return f"<= {number(self.value)}"

    def margin_pct(self, figure: float) -> float | None:
        return (self.value - figure) / abs(self.value) * 100 if self.value else None


class Ceiling(Bound):
    key, worst = "ceiling", "high"
    help = "a value above this is physically impossible: a measurement error, reported as a failure"

    def missed(self, figure: float, medians: Mapping[str, float]) -> list[str]:
        if figure > self.value:
            return [f"above the physical ceiling {number(self.value)}: a measurement error, not a result"]
        return []

    def text(self) -> str:
        return f"ceiling {number(self.value)}"


class OutlierFraction(Bound):
    key, better, worst, peers = "outlier_fraction", "up", "low", True
    help = ("fail a part whose value is below this fraction of the median of its peers (a GPU: its node's GPUs and "
            "every GPU of the run; a node: every node of the run; at merge: the fleet); higher is better")

    def check(self) -> str | None:
        return None if 0 < self.value <= 1 else f"must lie in (0, 1], got {number(self.value)}"

    def missed(self, figure: float, medians: Mapping[str, float]) -> list[str]:
        return [f"below {percent(self.value)} of the {peers} median {number(median)}"
                for peers, median in medians.items() if figure < self.value * median]

    def floor(self, median: float | None) -> float | None:
        return None if median is None else self.value * median

    def text(self) -> str:
        return f">= {percent(self.value)} of peers' median"


class OutlierMultiple(Bound):
    key, better, worst, peers = "outlier_multiple", "down", "high", True
    help = ("fail a part whose value is above this multiple of the median of its peers (lower is better: latency); "
            "peers as for outlier_fraction")

    def check(self) -> str | None:
        return None if 1 < self.value <= 100 else f"must lie in (1, 100], got {number(self.value)}"

    def missed(self, figure: float, medians: Mapping[str, float]) -> list[str]:
        return [f"above {number(self.value)}x the {peers} median {number(median)}"
                for peers, median in medians.items() if figure > self.value * median]

    def limit(self, median: float | None) -> float | None:
        return None if median is None else self.value * median

    def text(self) -> str:
        return f"<= {number(self.value)}x peers' median"


BOUNDS: dict[str, type[Bound]] = {b.key: b for b in (Min, Max, Ceiling, OutlierFraction, OutlierMultiple)}
"""Every kind of bound, in the order a criterion lists them."""

ORDER = (("min", "max"), ("min", "ceiling"))
ABSOLUTE = ("min", "max")
"""The bounds that hold a figure to a number of its own: what a source must cite."""
"""(low, high) pairs whose values must not cross: a criterion no figure can meet is a typo."""

TABLE_KEY = "by_nodes"
TABLE_HELP = ("a table by the job's node count, {2: {min: ...}, 8: {...}}: each row's keys replace the criterion's; "
              "the row of the largest count <= the job's nodes judges it (fewer nodes than the first row: the "
              "criterion's own keys)")
KEYS = {**{k: b.help for k, b in BOUNDS.items()}, **TEXT_KEYS, **WEIGHT_KEYS, TABLE_KEY: TABLE_HELP}
"""Every key a criterion takes in thresholds.yaml, with what it means."""


def _table(own: Mapping[str, Any], raw: Any, where: str) -> tuple[tuple[int, Criterion], ...]:
    """The ``by_nodes`` rows, each the criterion's own keys with the row's over them; CriterionError naming the key."""
    if not isinstance(raw, Mapping) or not raw:
        raise CriterionError(where, f"must be a non-empty mapping of node count to criterion keys, e.g. "
                                    f"{{2: {{min: 350}}, 8: {{min: 300}}}}; got {raw!r}")
    rows = []
    for count, row in raw.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            quoted = " (quoted in YAML: write it bare)" if isinstance(count, str) and count.isdigit() else ""
            raise CriterionError(f"{where}.{count}", f"a node count must be a whole number >= 1, got {count!r}{quoted}")
        if not isinstance(row, Mapping) or TABLE_KEY in row:
            raise CriterionError(f"{where}.{count}", f"must be a mapping of criterion keys (no {TABLE_KEY} inside), "
                                                     f"got {row!r}")
        rows.append((count, Criterion.parse({**own, **row}, f"{where}.{count}")))
    return tuple(sorted(rows, key=lambda r: r[0]))


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CriterionError(where, f"must be a finite number, got {value!r}{yaml_text_number(value)}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Criterion:
    """Pass criteria of one metric in one profile. An empty criterion measures without judging."""

    bounds: tuple[Bound, ...] = ()
    unit: str | None = None
    description: str = ""
    severity: str = "fail"
    source: Source | None = None
    by_nodes: tuple[tuple[int, Criterion], ...] = ()
    """The ``by_nodes`` table: (node count, the criterion of that row), counts ascending."""
    row: int | None = None
    """The row of the table this criterion is (``for_nodes``); None: the criterion's own keys."""

    # ---- reading -------------------------------------------------------------------------------
    @classmethod
    def parse(cls, raw: Any, where: str) -> Criterion:
        """A criterion from thresholds.yaml (``None`` is the empty one); CriterionError naming the key."""
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise CriterionError(where, f"must be a mapping of {', '.join(KEYS)}, got {raw!r}")
        unknown = sorted(set(raw) - set(KEYS))
        if unknown:
            raise CriterionError(f"{where}.{unknown[0]}", f"unknown key; a criterion takes {', '.join(KEYS)}")
        if TABLE_KEY in raw:
            own = {k: v for k, v in raw.items() if k != TABLE_KEY}
            table = _table(own, raw[TABLE_KEY], f"{where}.{TABLE_KEY}")
            return dataclasses.replace(cls.parse(own, where), by_nodes=table)
        bounds = tuple(kind(_number(f"{where}.{key}", raw[key])) for key, kind in BOUNDS.items() if key in raw)
        for bound in bounds:
            if problem := bound.check():
                raise CriterionError(f"{where}.{bound.key}", problem)
        values = {b.key: b.value for b in bounds}
        for low, high in ORDER:
            if low in values and high in values and values[low] > values[high]:
                raise CriterionError(where, f"{low} {number(values[low])} is above {high} {number(values[high])}: "
                                            "no figure can pass; fix the typo")
        for key in TEXT_KEYS:
            if key in raw and not isinstance(raw[key], str):
                raise CriterionError(f"{where}.{key}", f"must be a string, got {raw[key]!r}")
        severity = raw.get("severity", "fail")
        if severity not in SEVERITIES:
            raise CriterionError(f"{where}.severity", f"must be fail or warn, got {severity!r}")
        try:
            source = Source.parse(raw["source"]) if "source" in raw else None
        except SourceError as exc:
            raise CriterionError(f"{where}.source", str(exc)) from None
        if source is not None and source.kind == "peers" and (absolute := [b.key for b in bounds if b.key in ABSOLUTE]):
            raise CriterionError(f"{where}.source", f"peers judges against the part's peers only, but the criterion "
                                                    f"sets {', '.join(absolute)}: cite where that comes from (spec, "
                                                    "measured, published) or leave it out")
        if source is not None and source.kind == "peers" and not any(b.peers for b in bounds):
            raise CriterionError(f"{where}.source", "peers, but the criterion has no outlier_fraction or "
                                                    "outlier_multiple to judge a part against its peers by")
        return cls(bounds=bounds, unit=raw.get("unit"), description=raw.get("description", ""), severity=severity,
                   source=source)

    @classmethod
    def of(cls, **raw: Any) -> Criterion:
        """A criterion from keyword arguments, as in thresholds.yaml: ``Criterion.of(min=700, unit="TFLOPS")``."""
        return cls.parse(raw, "criterion")

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Criterion:
        """The criterion a results.json metric carries (keys this version does not know are ignored)."""
        data = data or {}
        bounds = tuple(kind(float(data[key])) for key, kind in BOUNDS.items() if data.get(key) is not None)
        return cls(bounds=bounds, unit=data.get("unit"), severity=data.get("severity", "fail"),
                   source=Source.from_json(data.get("source"), data.get("source_detail")))

    def as_json(self) -> dict[str, Any]:
        """The results.json form: the bounds, the unit, the severity, and the source where known."""
        out: dict[str, Any] = {b.key: b.value for b in self.bounds}
        if self.unit is not None:
            out["unit"] = self.unit
        out["severity"] = self.severity
        if self.source is not None:
            out["source"] = self.source.kind
            if self.source.detail:
                out["source_detail"] = dict(self.source.detail)
        if self.row is not None:
            out["by_nodes_row"] = self.row
        if self.by_nodes:
            out[TABLE_KEY] = {str(n): c.as_json() for n, c in self.by_nodes}
        return out

    def for_nodes(self, nodes: int) -> Criterion:
        """The criterion that judges a job of ``nodes`` nodes: the ``by_nodes`` row of the largest count <= ``nodes``
        (its ``row`` says which), else the criterion's own keys; either way without the table."""
        rows = [(n, c) for n, c in self.by_nodes if n <= nodes]
        if not rows:
            return dataclasses.replace(self, by_nodes=())
        n, c = rows[-1]
        return dataclasses.replace(c, row=n)

    def get(self, key: str) -> float | None:
        """The value of bound ``key`` (``"min"``, ...), None when the criterion has none."""
        return next((b.value for b in self.bounds if b.key == key), None)

    # ---- judging -------------------------------------------------------------------------------
    @property
    def judged(self) -> bool:
        return bool(self.bounds)

    @property
    def higher_is_better(self) -> bool | None:
        """True for a floor (min, outlier_fraction), False for a limit (max), None when it says neither."""
        senses = {b.better for b in self.bounds}
        return True if "up" in senses else False if "down" in senses else None

    def floor(self, peers: Sequence[float]) -> float:
        """The lowest figure a part may show among ``peers`` (the figures it is compared with): the highest
        floor of the criterion's bounds (``min``; ``outlier_fraction`` x the peers' median); 0 without one.
        The node-pair rounds judge each pair by it."""
        median = statistics.median(peers) if peers else None
        return max((f for b in self.bounds if (f := b.floor(median)) is not None), default=0.0)

    def peer_floor(self, median: float) -> float | None:
        """Below this a part is an outlier among peers whose median is ``median`` (the peer bounds alone:
        ``outlier_fraction``); None where the criterion sets no floor by its peers."""
        return max((f for b in self.bounds if b.peers and (f := b.floor(median)) is not None), default=None)

    def peer_limit(self, median: float) -> float | None:
        """Above this a part is an outlier among peers whose median is ``median`` (``outlier_multiple``); None where
        the criterion sets no limit by its peers."""
        return min((f for b in self.bounds if b.peers and (f := b.limit(median)) is not None), default=None)

    @property
    def judges_peers(self) -> bool:
        """The criterion compares a part with its peers (``outlier_fraction``, ``outlier_multiple``)."""
        return any(b.peers for b in self.bounds)

    def peer_misses(self, figure: float, median: float, peers: str) -> list[str]:
        """How ``figure`` falls behind ``peers`` whose median is ``median`` (the peer bounds alone, in the words the
        run uses: "below 90% of the fleet median 760"); empty where it does not. The fleet view's rule."""
        return [p for b in self.bounds if b.peers for p in b.missed(figure, {peers: median})]

    def stand_in(self, values: Sequence[float]) -> float:
        """The figure that stands for the metric: the worst against the criterion, else the median."""
        worst = {b.worst for b in self.bounds}
        return min(values) if "low" in worst else max(values) if "high" in worst else statistics.median(values)

    def judge(self, figures: Sequence[Figure], scope: str) -> list[list[str]]:
        """Why each figure misses the criterion (one list per figure, empty where it passes).

        Per-GPU figures are also judged against the medians of their node's and the cluster's GPUs
        (a node's median only with two or more GPUs on it; the cluster's with two or more nodes), per-node
        figures against the median of every node (two or more nodes).
        """
        peered = scope in ("gpu", "node") and self.judges_peers
        by_node: dict[int, list[float]] = {}
        for f in figures:
            by_node.setdefault(f.node, []).append(f.value)
        out: list[list[str]] = []
        for f in figures:
            if self.unit is not None and f.unit != self.unit:
                out.append([f"recorded in {f.unit!r}, the profile expects {self.unit!r}"])
                continue
            medians: dict[str, float] = {}
            if peered and scope == "gpu" and len(by_node[f.node]) > 1:
                medians["node"] = statistics.median(by_node[f.node])
            if peered and len(by_node) > 1:
                medians["cluster"] = statistics.median(x.value for x in figures)
            out.append([p for b in self._judging_order() for p in b.missed(f.value, medians)])
        return out

    def weigh(self, figures: Sequence[Figure], scope: str) -> list[tuple[list[str], list[str]]]:
        """(failures, warnings) of each figure: what ``judge`` finds, weighed by the severity. A figure
        recorded in another unit always fails: it is not a figure of this metric at all."""
        out: list[tuple[list[str], list[str]]] = []
        for f, problems in zip(figures, self.judge(figures, scope), strict=True):
            warn = self.severity == "warn" and (self.unit is None or f.unit == self.unit)
            out.append(([], problems) if warn else (problems, []))
        return out

    def _judging_order(self) -> list[Bound]:
        """A measurement error (ceiling) is named before the floors and limits it makes meaningless."""
        return sorted(self.bounds, key=lambda b: b.key != "ceiling")

    # ---- describing ------------------------------------------------------------------------------
    def text(self) -> str:
        """``>= 700, ceiling 989, >= 90% of peers' median`` (``not judged`` for the empty criterion)."""
        return ", ".join(b.text() for b in self.bounds) or "not judged"

    def source_text(self) -> str:
        """Where the figures come from, for the report (empty when the criterion does not say)."""
        return self.source.text() if self.source else ""

    def describe(self) -> dict[str, Any]:
        """The criterion as every listing of criteria shows it (the report's criteria table, ``clustergate list``):
        its bounds in words and as figures, unit, severity, source and description."""
        out = {"criterion": self.text(), "bounds": {b.key: b.value for b in self.bounds}, "unit": self.unit or "",
               "severity": self.severity, "source": self.source_text(), "description": self.description}
        if self.by_nodes:
            rows = "; ".join(f"{n}+ nodes: {c.text()}" + (f" ({c.source.kind})" if c.source else "")
                             for n, c in self.by_nodes)
            out["criterion"] += f"; by node count: {rows}"
            out["by_nodes"] = {str(n): c.describe() for n, c in self.by_nodes}
        return out

    def margin_pct(self, figure: float) -> float | None:
        """Headroom against the tightest bound that has one, in % (negative: missed); None without one."""
        margins = [m for b in self.bounds if (m := b.margin_pct(figure)) is not None]
        return min(margins) if margins else None
