"""The compact summary rank 0 prints at the end of the terminal output (pure: results dict -> lines)."""

from __future__ import annotations

from typing import Any

from clustergate.common.numbers import number, percent
from clustergate.common.terminal import printable
from clustergate.record.results import selection_line, short_test_name
from clustergate.record.verdict import word_of
from clustergate.report import model

MESSAGE_LINES = 3
"""Lines of each failing test's message printed (the report and results.json have all of it)."""
MAX_WARNINGS = 10
"""Warnings listed one per line; the rest are counted."""
MAX_ROWS = 40
"""Criteria rows printed; failures come first, so a long run still shows every one that matters."""


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def summary_lines(results: dict[str, Any]) -> list[str]:
    """Verdict line, facts, criteria table (failures first), failing tests with ranks, baseline flags."""
    f = model.facts(results)
    verdict = word_of(results)
    plural = "" if f["ranks"] == "1" else "s"
    lines = [f"{verdict}   profile {f['profile']}   level {f['level']}   {f['ranks']} rank{plural} on {f['hosts']}   "
             f"{f['gpus']}   {f['duration']}"]
    if not results.get("sign_off", True):
        lines.append(f"profile {f['profile']!r} has no sign-off criteria: figures are measured, not judged")
    if selection_line(results):
        lines.append(str(selection_line(results)))
    weaker = [w for w in results.get("looser_than_shipped") or [] if isinstance(w, dict)]
    if weaker:  # a site profile that asks less than the shipped one is never read as the shipped one
        lines.append(f"LOOSER THAN SHIPPED: profile {f['profile']} asks less than shipped {weaker[0].get('shipped')} "
                     f"in {len(weaker)} criteria (results.json looser_than_shipped):")
        lines += [f"  {w.get('metric')}: {w.get('kind')} ({w.get('detail')})" for w in weaker[:MAX_WARNINGS]]
        if len(weaker) > MAX_WARNINGS:
            lines.append(f"  ... {len(weaker) - MAX_WARNINGS} more (see results.json)")
    steps = [a for a in results.get("actions") or [] if isinstance(a, dict)]
    if results.get("error"):
        lines.append(f"run error: {str(results['error']).splitlines()[0]}")
        lines += [f"  do: {a.get('text', '')}" for a in steps if not a.get("test")]
    elif results.get("reason") and results.get("verdict") != "accept":
        lines.append(f"why: {results['reason']}")
    rows = model.criteria_rows(results)
    if rows:
        width = max(6, *(len(r.metric) for r in rows))
        lines.append(f"  {'metric':<{width}}  {'scope':<5}  {'measured':>18}  {'criterion':<28}  {'source':<9}  "
                     f"{'margin':>8}  result")
        for r in rows[:MAX_ROWS]:
            result = {"PASS": "ok", "not judged": "-"}.get(r.result, r.result)
            lines.append(f"  {r.metric:<{width}}  {r.scope:<5}  {_cut(number(r.value, r.unit), 18):>18}  "
                         f"{_cut(r.criterion, 28):<28}  {r.source.split(' ')[0]:<9}  {r.margin:>8}  {result}"
                         + (f"  {_cut(r.where, 60)}" if not r.passed or r.warned else ""))
        if len(rows) > MAX_ROWS:
            lines.append(f"  ... {len(rows) - MAX_ROWS} more rows passed (see report.html / results.json)")
    warnings = results.get("warnings") or []
    if warnings:
        lines.append(f"warnings: {len(warnings)} (a warn criterion missed; the verdict does not use them)")
        lines += [f"  WARN {w['metric']} = {number(w['value'])} ({w['criterion']}) at {_cut(str(w['where']), 60)}"
                  for w in warnings[:MAX_WARNINGS]]
        if len(warnings) > MAX_WARNINGS:
            lines.append(f"  ... {len(warnings) - MAX_WARNINGS} more (see report.html / results.json)")
    counts = model.test_counts(results)
    never = model.never_ran(results)
    told = [f"{n} {k}" for k, n in sorted(counts.items())] + ([f"{never} never ran"] if never else [])
    lines.append("tests: " + (", ".join(told) or "none ran"))
    for fail in model.failures(results):
        said = [line.strip() for line in fail.message.splitlines() if line.strip()][:MESSAGE_LINES] or [fail.outcome]
        lines.append(f"  {fail.outcome.upper()} {short_test_name(fail.test)}: {_cut(said[0], 100)}")
        lines += [f"    {_cut(line, 110)}" for line in said[1:]]
        if fail.ranks:
            lines.append(f"    ranks: {_cut('; '.join(fail.ranks), 110)}")
        lines += [f"    do: {_cut(str(a.get('text', '')), 400)}" for a in steps if a.get("test") == fail.test]
    drift = results.get("drift")
    if isinstance(drift, dict):
        lines += drift_lines(drift)
    base = results.get("baseline")
    if isinstance(base, dict):
        flagged = [c for c in base.get("metrics", []) + base.get("per_gpu", []) if c.get("flagged")]
        lines.append(f"baseline {base.get('source', '')}: {len(flagged)} change{'s' if len(flagged) != 1 else ''} "
                     f"beyond {percent(float(base.get('tolerance', 0)))}")
        for c in sorted(flagged, key=lambda c: -abs(c["change"]) if c.get("change") is not None else -1e9)[:10]:
            change = "from 0" if c.get("change") is None else percent(c["change"], signed=True)
            lines.append(f"  {c['name']} {c.get('gpu', c.get('scope', ''))}: {number(c['baseline'])} -> "
                         f"{number(c['current'], c.get('unit', ''))} ({change}, {c.get('direction')})")
    return [printable(line) for line in lines]


def drift_lines(drift: dict[str, Any]) -> list[str]:
    """The run's ``drift`` section in a line: why it was not judged, or how many figures drifted (each is listed
    among the warnings, or fails its test, above)."""
    if drift.get("problem"):
        return [str(drift["problem"])]
    n = len(drift.get("findings") or [])
    return [f"drift against {drift.get('store')}: {n} figure{'s' if n != 1 else ''} more than "
            f"{percent(float(drift.get('fraction', 0)))} below its first accepted figure (drift_severity "
            f"{drift.get('severity')})"]
