"""What the report says, derived from the results.json dict: pure functions, no HTML, no pytest.

The terminal summary (``clustergate.report.summary``), the HTML report and the re-render command all
read the run through these, so they agree on every figure, margin and highlight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clustergate.common.numbers import percent
from clustergate.common.parts import gpu_label, rank_index
from clustergate.criteria.criterion import Criterion
from clustergate.trust import keyed


@dataclass(frozen=True, slots=True)
class CriterionRow:
    """One judged metric of one test: a row of the criteria table."""

    test: str
    metric: str
    scope: str
    value: float
    unit: str
    criterion: str
    margin_pct: float | None
    """Headroom against the tightest bound in %, negative when the criterion is missed."""
    passed: bool
    judged: bool
    where: str
    """The part the measured figure comes from (the worst GPU/node), or how many parts."""
    description: str = ""
    warned: bool = False
    """A part missed a ``warn`` criterion: shown amber, the verdict stands."""
    source: str = ""
    """Where the criterion's figures come from: ``spec``, ``measured (tool, machine, date, n=...)``, ``estimate``."""

    @property
    def margin(self) -> str:
        """The margin as the terminal and the report print it (``+12.3%``; empty without one)."""
        return percent(None if self.margin_pct is None else self.margin_pct / 100, signed=True)

    @property
    def result(self) -> str:
        """FAIL, WARN, PASS or ``not judged``: the word the terminal and the report show."""
        return "FAIL" if not self.passed else "WARN" if self.warned else "PASS" if self.judged else "not judged"


@dataclass(frozen=True, slots=True)
class Failure:
    test: str
    outcome: str
    ranks: tuple[str, ...]
    """Each failing rank with host, GPU index and serial."""
    message: str


def _where(metric: dict[str, Any], ranks: dict[int, dict[str, Any]]) -> str:
    per = metric.get("per_rank") or []
    if not per:
        return ""
    scope = metric.get("scope", "gpu")
    if scope == "world":
        return "whole job"
    # A CPU rank is no GPU: a per-GPU figure of a run without GPUs is a rank's (it names no GPU index).
    word = "node" if scope == "node" else "GPU" if any(p.get("gpu_index") is not None for p in per) else "rank"
    parts = f"{len(per)} {word}{'s' if len(per) > 1 else ''}"
    if not Criterion.from_json(metric.get("criterion")).judged:
        return f"median of {parts}" if len(per) > 1 else _label(per[0], scope, ranks)
    failing, word = [p for p in per if not p.get("passed", True)], "fail"
    if not failing:
        failing, word = [p for p in per if p.get("warned")], "warn"
    # The judge's figure is the worst part's value: name that part.
    worst = min(failing or per, key=lambda p: abs(p["value"] - metric["value"]))
    label = _label(worst, scope, ranks)
    if failing:
        return f"{len(failing)}/{parts} {word}; worst {label}"
    return f"{parts}; worst {label}" if len(per) > 1 else label


def _label(p: dict[str, Any], scope: str, ranks: dict[int, dict[str, Any]]) -> str:
    ident = {**ranks.get(p["rank"], {}), **p}
    return f"node {ident.get('node_rank')} ({ident.get('host')})" if scope == "node" else gpu_label(ident)


def criteria_rows(results: dict[str, Any]) -> list[CriterionRow]:
    """Every metric of every test; failures first, then judged by margin (tightest first)."""
    ranks = rank_index(results)
    rows = []
    for test in results.get("tests", []):
        for m in test.get("metrics", []):
            crit = Criterion.from_json(m.get("criterion"))
            said = crit.describe()
            rows.append(CriterionRow(
                test=test["nodeid"], metric=m["name"], scope=m.get("scope", "gpu"), value=float(m["value"]),
                unit=m.get("unit", ""), criterion=said["criterion"], margin_pct=crit.margin_pct(float(m["value"])),
                passed=bool(m.get("passed")), judged=crit.judged, where=_where(m, ranks),
                description=m.get("description", ""), warned=bool(m.get("warned")), source=said["source"],
            ))
    return sorted(rows, key=lambda r: (r.passed, not r.warned, not r.judged,
                                       r.margin_pct if r.margin_pct is not None else 1e9))


def failures(results: dict[str, Any]) -> list[Failure]:
    """Failed and errored tests with every failing rank named by host, GPU index and serial."""
    ranks = rank_index(results)
    out = []
    for test in results.get("tests", []):
        if test.get("outcome") not in ("failed", "error"):
            continue
        named = tuple(gpu_label(ranks.get(r, {"rank": r})) for r in test.get("failed_ranks", []))
        out.append(Failure(test["nodeid"], test["outcome"], named, test.get("message", "")))
    return out


def facts(results: dict[str, Any]) -> dict[str, str]:
    """The banner's facts: profile, level, date, duration, hosts, GPUs, versions."""
    nodes = results.get("nodes", [])
    hosts = [n.get("host", "?") for n in nodes]
    gpus = [g for n in nodes for g in n.get("gpus", [])]
    models = sorted({g.get("name") or "?" for g in gpus})
    env = results.get("environment", {})
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "cuda", "nccl", "driver", "python") if env.get(k))
    shown_hosts = ", ".join(hosts[:8]) + (f" and {len(hosts) - 8} more" if len(hosts) > 8 else "")
    duration = float(results.get("duration_s") or 0)
    return {
        "profile": str(results.get("profile", "?")),
        "level": str(results.get("level", "?")),
        "started": str(results.get("started", "?")),
        "duration": f"{int(duration // 3600):d}h{int(duration % 3600 // 60):02d}m{duration % 60:04.1f}s"
        if duration >= 60 else f"{duration:.1f} s",
        "hosts": f"{len(hosts)} node{'s' if len(hosts) != 1 else ''}: {shown_hosts}",
        "gpus": (f"{len(gpus)} x {', '.join(models)}" if gpus else
                 f"no GPU ({results.get('world_size', '?')} CPU rank{'s' if results.get('world_size') != 1 else ''})"),
        "ranks": str(results.get("world_size", "?")),
        "versions": versions,
    }


def test_counts(results: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for test in results.get("tests", []):
        counts[test.get("outcome", "?")] = counts.get(test.get("outcome", "?"), 0) + 1
    return counts


def never_ran(results: dict[str, Any]) -> int:
    """Selected tests the run never started (it ended early: interrupted, stopped by -x, a rank lost)."""
    selected = (results.get("selection") or {}).get("selected")
    return max(0, selected - len(results.get("tests") or [])) if isinstance(selected, int) else 0


def identity(said: dict[str, Any]) -> list[tuple[str, str]]:
    """What a page was judged by, the same block on a run's report and on the sign-off: the clustergate version, the
    profile and its digest, the thresholds file, the suite's digest, the run id, the level and the site key (or
    none). ``said``: ``version``, ``profile``, ``profile_digest``, ``thresholds``, ``suite_digest``, ``run_id``,
    ``level``, ``signed`` (True, False, or None where it is not known); a fact not known reads ``?``."""
    def shown(key: str) -> str:
        value = said.get(key)
        return "?" if value in (None, "") else str(value)

    digest = f" (digest {said['profile_digest']})" if said.get("profile_digest") else ""
    key = {True: "signed with the site key: every record carries a valid HMAC",
           False: "none: the records carry no HMAC"}.get(said.get("signed"), "?")  # type: ignore[arg-type]
    return [("clustergate", shown("version")), ("profile", f"{shown('profile')}{digest}"),
            ("thresholds", shown("thresholds")), ("suite", shown("suite_digest")), ("run id", shown("run_id")),
            ("level", shown("level")), ("site key", key)]


def run_identity(results: dict[str, Any]) -> list[tuple[str, str]]:
    """``identity`` of a run's results.json (its ``clustergate`` and ``attestation`` sections)."""
    own = results.get("clustergate") if isinstance(results.get("clustergate"), dict) else {}
    attested = results.get("attestation") if isinstance(results.get("attestation"), dict) else {}
    return identity({"version": own.get("version"), "profile": results.get("profile"),
                     "profile_digest": own.get("thresholds_digest"), "thresholds": own.get("thresholds"),
                     "suite_digest": attested.get("suite_digest"), "run_id": results.get("run_id"),
                     "level": results.get("level"),
                     # A record written before the run said so is known signed by its HMAC alone.
                     "signed": own.get("signed", True if keyed.FIELD in results else None)})


@dataclass(frozen=True, slots=True)
class Skipped:
    """Tests skipped for one reason: a row of the report's table of what was skipped and why."""

    reason: str
    fact: str
    """The recorded fact that allows the skip (``no_gpu``, ``not_required: expect.driver``), or empty."""
    tests: tuple[str, ...]
    """Their node ids, relative to the suite's root as pytest names them."""


def fact_text(fact: Any) -> str:
    """A test's recorded skip fact in words: the fact, then what it names (``not_required: expect.driver``,
    ``dcgm_not_requested: needs 3``)."""
    if not isinstance(fact, dict) or not fact.get("fact"):
        return ""
    # A name stands alone (expect.driver, deepspeed); a level or a figure says what it is (level standard, needs 3).
    named = [str(v) if isinstance(v, str) and k != "level" else f"{k} {v}" for k, v in fact.items()
             if k != "fact" and v not in (None, "")]
    return str(fact["fact"]) + (f": {', '.join(named)}" if named else "")


def skipped(results: dict[str, Any]) -> list[Skipped]:
    """The skipped tests grouped by their reason and fact, the largest group first."""
    groups: dict[tuple[str, str], list[str]] = {}
    for test in results.get("tests", []):
        if test.get("outcome") == "skipped":
            reason = str(test.get("message") or "").strip() or "skipped (no reason given)"
            groups.setdefault((reason, fact_text(test.get("skip_fact"))), []).append(str(test["nodeid"]))
    return [Skipped(reason, fact, tuple(tests))
            for (reason, fact), tests in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))]
