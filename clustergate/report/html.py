"""HTML fragments pytest-html embeds: the verdict banner, criteria, failures, per-GPU and per-node
tables, baseline changes and figures (summary section), and each test's own table (row extras).

Plain strings built from the results.json dict; every text is escaped, every image is a data: URI,
and nothing refers to a network resource, so the report opens offline.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from clustergate.common.numbers import number, percent
from clustergate.criteria.criterion import Criterion
from clustergate.record.results import selection_line, short_test_name
from clustergate.record.verdict import INTERRUPTED, word_of
from clustergate.report import figures, model, support, tables
from clustergate.report.markup import cell, esc, table

MAX_MESSAGE_CHARS = 20_000
"""A failure message longer than this is cut in the summary (the test's row keeps it whole)."""

STYLE = """
<style>
/* The verdict first: the summary (banner, criteria, tables, figures) and the test table above
   pytest-html's environment table, which is long and matters least to the person signing. */
body { display: flex; flex-direction: column; color: #333; }
#title { order: -5; } .summary { order: -4; } #results-table { order: -3; }
.cg-banner { border-radius: 6px; padding: 14px 18px; margin: 8px 0 14px; color: #fff; }
.cg-banner.cg-accept { background: #1e7b34; } .cg-banner.cg-reject { background: #b3261e; }
.cg-banner.cg-unjudged { background: #5f6368; }
.cg-verdict { font-size: 34px; font-weight: bold; letter-spacing: 2px; }
.cg-why { font-size: 14px; margin: 4px 0 8px; }
.cg-facts td { padding: 1px 14px 1px 0; color: #fff; font-size: 12px; vertical-align: top; }
.cg-facts td:first-child { opacity: 0.8; }
.cg h3 { color: #000; font-size: 15px; margin: 18px 0 6px; }
.cg p, .cg li { color: #333; }
table.cg-table { border: 1px solid #ccc; margin: 4px 0 10px; font-size: 12px; color: #222; }
table.cg-table th { background: #eee; text-align: left; padding: 4px 8px; border-bottom: 1px solid #ccc; }
table.cg-table td { padding: 3px 8px; border-bottom: 1px solid #eee; vertical-align: top; }
table.cg-table td.num { text-align: right; font-variant-numeric: tabular-nums; }
.cg-fail { background: #fde0dc; color: #8a1c13; font-weight: bold; }
.cg-outlier { background: #fff1c2; color: #6b4e00; }
.cg-warn { background: #ffd8a8; color: #7a3e00; font-weight: bold; }
.cg-source { color: #666; font-size: 11px; }
.cg-pass { color: #1e7b34; font-weight: bold; } .cg-muted { color: #888; }
.cg-figures { display: flex; flex-wrap: wrap; gap: 10px; }
.cg-figures figure { margin: 0; border: 1px solid #ddd; padding: 4px; background: #fff; }
.cg-figures figcaption { font-size: 11px; color: #555; max-width: 640px; }
.cg-figures img { max-width: 100%; display: block; }
.cg details pre, .cg-extra pre { white-space: pre-wrap; font-size: 11px; color: #222; background: #f6f6f6;
  padding: 6px; max-height: 360px; overflow: auto; }
.cg-legend span { padding: 1px 6px; margin-right: 6px; }
.cg-scroll { max-width: 100%; overflow-x: auto; }
table.cg-table th { max-width: 14em; }
</style>
"""


@lru_cache(maxsize=256)
def png_of(spec: figures.Figure) -> str:
    """The figure as base64 PNG, drawn once however often the report shows it."""
    from clustergate.report import plots  # matplotlib only where a figure is drawn (rank 0, with figures)

    return plots.png(spec)


def figure(spec: figures.Figure, caption: str = "") -> str:
    alt = esc(spec.title)
    return (f'<figure><img alt="{alt}" src="data:image/png;base64,{png_of(spec)}"/>'
            f"<figcaption>{esc(caption or spec.title)}</figcaption></figure>")


def banner(results: dict[str, Any]) -> str:
    """ACCEPT / REJECT, why, and the run's facts."""
    verdict = str(results.get("verdict", "reject"))
    sign_off = results.get("sign_off", True)
    counts = model.test_counts(results)
    why: list[str] = []
    if results.get("error"):
        why.append(f"run error: {str(results['error']).splitlines()[0]}")
    bad = [t for t in results.get("tests", []) if t.get("outcome") in ("failed", "error")]
    if bad:
        names = ", ".join(short_test_name(t["nodeid"]) for t in bad[:6]) + (" ..." if len(bad) > 6 else "")
        why.append(f"{len(bad)} of {len(results.get('tests', []))} tests failed: {names}")
    elif not results.get("error") and results.get("reason") and verdict != "accept":
        why.append(str(results["reason"]))  # e.g. every test skipped: nothing was measured
    failing = [r for r in model.criteria_rows(results) if not r.passed]
    if failing:
        why.append(f"{len(failing)} metric{'s' if len(failing) > 1 else ''} missed: "
                   + ", ".join(sorted({r.metric for r in failing})))
    warnings = results.get("warnings") or []
    if warnings:
        why.append(f"{len(warnings)} warning{'s' if len(warnings) > 1 else ''} (a warn criterion missed; the verdict "
                   "does not use them): " + ", ".join(sorted({w["metric"] for w in warnings})))
    if verdict == "accept":
        why.append(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no tests")
    if selection_line(results):
        why.append(str(selection_line(results)))
    base = results.get("baseline")
    if isinstance(base, dict):
        why.append(f"against the baseline: {base.get('flagged', 0)} changes beyond "
                   f"{percent(float(base.get('tolerance', 0)))} (informative; the verdict does not use them)")
    cls = "cg-accept" if verdict == "accept" else "cg-reject"
    if not sign_off:
        why.insert(0, f"NOT A SIGN-OFF: profile {results.get('profile')!r} has no sign-off criteria; "
                      "figures are measured, not judged")
        cls = "cg-unjudged" if verdict == "unjudged" else cls
    if verdict == "partial" or word_of(results) == INTERRUPTED:  # what passed is shown; it is not a sign-off,
        cls = "cg-unjudged"  # nor does an interruption say anything of the node
    f = model.facts(results)
    rows = [("profile", f["profile"]), ("level", f["level"]), ("started", f["started"]),
            ("duration", f["duration"]), ("hosts", f["hosts"]), ("GPUs", f["gpus"]), ("ranks", f["ranks"]),
            ("versions", f["versions"])]
    if results.get("rejudged"):
        rj = results["rejudged"]
        rows.append(("re-judged", f"with {rj.get('thresholds')} profile {rj.get('profile')} "
                                  f"(recorded under {rj.get('original_profile')})"))
    facts = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in rows if v)
    word = word_of(results)
    return (f'<div class="cg-banner {cls}" id="cg-verdict"><div class="cg-verdict">{esc(word)}</div>'
            + "".join(f'<div class="cg-why">{esc(w)}</div>' for w in why)
            + f'<table class="cg-facts">{facts}</table></div>')


def criteria_table(results: dict[str, Any]) -> str:
    rows = model.criteria_rows(results)
    if not rows:
        return '<p class="cg-muted">No metric was recorded.</p>'
    cells, classes = [], []
    for r in rows:
        missed = "cg-fail" if not r.passed else "cg-warn" if r.warned else ""
        margin = r.margin
        cells.append([cell(r.metric, title=r.description), cell(short_test_name(r.test), title=r.test),
                      cell(r.scope), cell(number(r.value, r.unit), "num"), cell(r.criterion),
                      cell(r.source, "cg-source"),
                      cell(margin, "num " + (missed if r.margin_pct is not None and r.margin_pct < 0 else "")),
                      cell(r.result, RESULT_CLASS[r.result]), cell(r.where)])
        classes.append("cg-row-fail" if not r.passed else "cg-row-warn" if r.warned else "")
    return table(["metric", "test", "scope", "measured", "criterion", "source", "margin", "result", "where"], cells,
                  "cg-table cg-criteria", classes)


RESULT_CLASS = {"PASS": "cg-pass", "FAIL": "cg-fail", "WARN": "cg-warn", "not judged": "cg-muted"}


def failures_section(results: dict[str, Any]) -> str:
    fails = model.failures(results)
    parts = []
    if results.get("error"):
        parts.append(f'<details open><summary class="cg-fail">run error</summary><pre>{esc(results["error"])}</pre>'
                     "</details>")
    for f in fails:
        msg = f.message if len(f.message) <= MAX_MESSAGE_CHARS else f.message[:MAX_MESSAGE_CHARS] + "\n[... cut]"
        where = "; ".join(f.ranks) or "no rank failed on its own (a metric or consistency check)"
        said = [line.strip() for line in msg.splitlines() if line.strip()][:3] or [f.outcome]
        parts.append(f'<details><summary><b>{esc(short_test_name(f.test))}</b> ({esc(f.outcome)}): '
                     + "<br/>".join(esc(line) for line in said)
                     + f'<br/><span class="cg-muted">ranks: {esc(where)}</span></summary>'
                     + f"<pre>{esc(msg)}</pre></details>")
    return "".join(parts)


def warnings_table(warnings: list[dict[str, Any]]) -> str:
    """Every part that missed a warn criterion (results.json ``warnings``): amber, never a failure."""
    rows = [[cell(w.get("metric", "")), cell(short_test_name(w.get("test", "")), title=w.get("test", "")),
             cell(number(w.get("value")), "num cg-warn"), cell(w.get("criterion", "")), cell(w.get("where", ""))]
            for w in warnings]
    note = ('<p class="cg-muted">A warn criterion is an estimate not yet measured, or a figure that informs: '
            "a miss is shown, and the verdict stands.</p>")
    return note + table(["metric", "test", "measured", "criterion", "where"], rows)


def actions_table(steps: list[dict[str, Any]]) -> str:
    """What to do about each failure (results.json ``actions``), most urgent first."""
    rows = [[cell(str(a.get("action", "")), "cg-fail"), cell(short_test_name(str(a.get("test") or "the run")),
                                                          title=str(a.get("test") or "")),
             cell(str(a.get("where", ""))), cell(str(a.get("meaning", ""))), cell(str(a.get("next_step", ""))),
             cell(str(a.get("escalate") or ""))] for a in steps]
    return table(["action", "test", "where", "what failed", "what to do", "if it recurs"], rows)


def drift_section(results: dict[str, Any]) -> str:
    """The run's ``drift`` section: each figure that fell below its own first accepted figure, beside the
    criterion (the minimum) it is also held to."""
    drift = results["drift"]
    if drift.get("problem"):
        return f'<p class="cg-warn">{esc(drift["problem"])}</p>'
    criteria = {(t.get("nodeid"), m.get("name")): Criterion.from_json(m.get("criterion")).text()
                for t in results.get("tests", []) for m in t.get("metrics", [])}
    head = (f"<p>Against {esc(drift.get('store'))}: a figure more than {percent(float(drift.get('fraction', 0)))} "
            f"below its own first accepted figure there (drift_severity {esc(drift.get('severity'))}).</p>")
    rows = [[cell(str(d.get("metric"))), cell(str(d.get("where", ""))),
             cell(number(d.get("first"), str(d.get("unit", ""))), "num"),
             cell(number(d.get("now"), str(d.get("unit", ""))), "num"),
             cell(f"-{percent(float(d.get('fraction', 0)))}", "num " + ("cg-fail" if d.get("severity") == "fail"
                                                                  else "cg-warn")),
             cell(criteria.get((d.get("test"), d.get("metric")), "")),
             cell(f"run #{d.get('first_run')}, {d.get('first_time') or '?'}"
                 + (f", on {d['first_host']}" if d.get("first_host") and d.get("first_host") != d.get("host")
                    else ""))] for d in drift.get("findings") or []]
    if not rows:
        return head + '<p class="cg-muted">No figure drifted.</p>'
    return head + table(["metric", "part", "first accepted", "now", "change", "criterion", "first accepted in"],
                         rows)


def _cell_td(shown: tables.Cell) -> str:
    cls = {"fail": "cg-fail", "warn": "cg-warn", "outlier": "cg-outlier"}.get(shown.state, "")
    return cell(shown.text, cls, shown.title)


def grid_table(grid: tables.Table) -> str:
    return table(grid.columns, [[_cell_td(c) for c in row] for row in grid.rows])


PARTS = {"gpu": "all GPUs", "node": "all nodes", "world": "whole job"}
"""What a metric-level comparison covers (per-GPU entries name their GPU)."""


def baseline_section(results: dict[str, Any]) -> str:
    base = results.get("baseline")
    if not isinstance(base, dict):
        return ""
    tol = float(base.get("tolerance", 0))
    head = (f"Compared with {base.get('source', '?')} (started {base.get('started', '?')}, profile "
            f"{base.get('profile', '?')}, {base.get('world_size', '?')} ranks); tolerance {percent(tol)}.")
    rows = []
    flagged = [c for c in base.get("metrics", []) if c.get("flagged")] + \
        [c for c in base.get("per_gpu", []) if c.get("flagged")]
    flagged.sort(key=lambda c: -abs(c["change"]) if c.get("change") is not None else -1e9)
    for c in flagged:
        change = "new or zero" if c.get("change") is None else percent(c["change"], signed=True)
        state = "cg-fail" if c.get("direction") == "worse" else "cg-outlier"
        unit, part = c.get("unit", ""), c.get("gpu") or PARTS.get(c.get("scope", ""), "")
        rows.append([cell(c["name"]), cell(short_test_name(c.get("nodeid", "")), title=c.get("nodeid", "")),
                     cell(part), cell(number(c.get("baseline"), unit), "num"),
                     cell(number(c.get("current"), unit), "num"), cell(change, "num " + state),
                     cell(c.get("direction", ""))])
    n_metrics, n_gpu = len(base.get("metrics", [])), len(base.get("per_gpu", []))
    summary = (f"<p>{len(flagged)} change{'s' if len(flagged) != 1 else ''} beyond {percent(tol)} among {n_metrics} "
               f"metrics and {n_gpu} per-GPU figures.</p>")
    notes = "".join(f"<li>{esc(n)}</li>" for n in base.get("notes", []))
    missing = base.get("missing", [])
    if missing:
        notes += f"<li>in the baseline, not in this run: {esc(', '.join(missing[:20]))}</li>"
    changes = table(["metric", "test", "part", "baseline", "now", "change", "direction"], rows) if rows else ""
    return f"<p>{esc(head)}</p>{summary}{changes}" + (f"<ul>{notes}</ul>" if notes else "")


def figures_section(results: dict[str, Any]) -> str:
    specs: list[tuple[figures.Figure, str]] = []
    specs += [(f, f.title + ": one colour per collective, one line per node or group")
              for f in figures.busbw_overview(results)]
    for test in results.get("tests", []):
        details = test.get("details") or {}
        name = short_test_name(test["nodeid"])
        specs += [(f, f"{f.title} ({name})") for f in figures.matrix_figures(details) if isinstance(details, dict)]
        specs += [(f, f"{f.title} ({name})") for f in figures.loss_figures(details) if isinstance(details, dict)]
    specs += [(f, f.title) for f in figures.gpu_bars(results)]
    if not specs:
        return '<p class="cg-muted">No curve, matrix, loss history or per-GPU figure was recorded.</p>'
    return '<div class="cg-figures">' + "".join(figure(s, c) for s, c in specs) + "</div>"


def skipped_table(results: dict[str, Any]) -> str:
    """What was skipped and why, in place of pytest-html's box per skipped test: one row per reason, with the fact
    that allows it and the tests it skipped (their ids, relative to the suite)."""
    groups = model.skipped(results)
    if not groups:
        return '<p class="cg-muted">No test was skipped.</p>'
    rows = [[cell(g.reason), cell(g.fact or "none recorded", "" if g.fact else "cg-warn"),
             cell(str(len(g.tests)), "num"),
             cell(", ".join(short_test_name(t) for t in g.tests), title="\n".join(g.tests))] for g in groups]
    return table(["why", "recorded fact", "tests", "skipped"], rows, "cg-table cg-skipped")


def identity_facts(results: dict[str, Any]) -> str:
    """The run's identity block: what it was judged by (``model.run_identity``, as the sign-off page shows it)."""
    rows = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in model.run_identity(results))
    return f'<table class="cg-table cg-identity" id="cg-identity"><tbody>{rows}</tbody></table>'


LEGEND = ('<p class="cg-legend"><span class="cg-fail">failed its criterion</span>'
          '<span class="cg-warn">missed a warn criterion (the verdict stands)</span>'
          f'<span class="cg-outlier">more than {percent(tables.OUTLIER_DEVIATION)} worse than the median of its peers'
          "</span></p>")


def summary(results: dict[str, Any]) -> str:
    """The whole summary section: banner, criteria, failures, baseline, per-GPU/node tables, figures."""
    parts = [STYLE, '<div class="cg">', banner(results), "<h3>Judged by</h3>", identity_facts(results),
             "<h3>Criteria</h3>", criteria_table(results)]
    fails = failures_section(results)
    if fails:
        parts += ["<h3>Failures</h3>", fails]
    if results.get("actions"):
        parts += ["<h3>What to do</h3>", actions_table(results["actions"])]
    if isinstance(results.get("drift"), dict):
        parts += ["<h3>Drift since the first accepted figures</h3>", drift_section(results)]
    if results.get("warnings"):
        parts += ["<h3>Warnings</h3>", warnings_table(results["warnings"])]
    if results.get("baseline"):
        parts += ["<h3>Against the baseline</h3>", baseline_section(results)]
    gpu = tables.gpu_table(results)
    if len(gpu.columns) > 5 or any(c.state for row in gpu.rows for c in row):
        parts += ["<h3>Per GPU</h3>", LEGEND, grid_table(gpu)]
    parts += ["<h3>Per node</h3>", grid_table(tables.node_table(results))]
    parts += support.sections(results)
    parts += ["<h3>Figures</h3>", figures_section(results)]
    parts += [f"<h3>Skipped ({sum(len(g.tests) for g in model.skipped(results))})</h3>", skipped_table(results)]
    parts += ["<h3>Tests (skipped tests: the table above)</h3></div>"]
    return "".join(parts)


def test_extra(test: dict[str, Any], results: dict[str, Any]) -> str:
    """A test's own row: its metrics (with the per-GPU spread) and any tables its details hold."""
    one = {**results, "tests": [test]}
    rows = []
    for r in model.criteria_rows(one):
        metric = next(m for m in test.get("metrics", []) if m["name"] == r.metric)
        values = sorted(p["value"] for p in metric.get("per_rank") or [])
        spread = f"{number(values[0])} / {number(values[len(values) // 2])} / {number(values[-1])}" \
            if len(values) > 1 else ""
        rows.append([cell(r.metric, title=r.description), cell(r.scope), cell(number(r.value, r.unit), "num"),
                     cell(spread, "num"), cell(r.criterion), cell(r.source, "cg-source"),
                     cell(r.margin, "num"), cell(r.result, RESULT_CLASS[r.result]),
                     cell(r.where)])
    parts = ['<div class="cg-extra">']
    if rows:
        parts.append(table(["metric", "scope", "measured", "min / median / max", "criterion", "source", "margin",
                             "result", "where"], rows))
    details = test.get("details") or {}
    tables = details.get("tables") if isinstance(details, dict) else None
    if isinstance(tables, dict):
        for name, table_rows in tables.items():
            if isinstance(table_rows, list) and table_rows and all(isinstance(r, dict) for r in table_rows):
                cols = list(dict.fromkeys(k for r in table_rows for k in r))
                parts.append(f"<p><b>{esc(name)}</b></p>")
                parts.append(table(cols, [[cell(r.get(c, "")) for c in cols] for r in table_rows]))
    parts.append("</div>")
    return "".join(parts) if len(parts) > 2 else ""
