"""The merged cluster report (report.html of ``merge``) and the page both cluster reports share.

A plain self-contained page (no pytest session to replay: the nodes' own reports hold their tests),
styled and tabulated with the run report's own CSS and table helpers, figures as data: URIs, every
text escaped (host names and reasons come from the nodes' files: markup in them stays text), every
link relative or to a file, secrets of this environment scrubbed: it opens offline, at 1,000 nodes too.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from clustergate.common.numbers import number, percent
from clustergate.record.reportdir import node_directory
from clustergate.record.results import short_test_name
from clustergate.report import html
from clustergate.report.fleet_plots import histogram_svg
from clustergate.report.signoff_words import DRY_RUN
from clustergate.report.tables import Cell, Table
from clustergate.secrets.redact import Scrubber, scrub_strings

EXTRA_STYLE = """
<style>
body { font-family: Helvetica, Arial, sans-serif; font-size: 13px; margin: 16px; }
.cg-hosts code { display: block; background: #f6f6f6; padding: 6px; margin: 2px 0 8px; word-break: break-all; }
.cg-reasons li { margin: 1px 0; }
.cg-dry-run { background: #fff1c2; color: #6b4e00; border: 2px dashed #b38600; border-radius: 6px; padding: 8px 14px;
  margin: 8px 0 0; font-size: 16px; font-weight: bold; }
</style>
"""


NODES_LEGEND = ('<p class="cg-legend"><span class="cg-fail">failed: the node\'s own criterion, or a fleet '
                'outlier</span> each figure is the node\'s worst GPU (or its one figure), with the GPU index</p>')


def page(title: str, body: list[str]) -> str:
    """A whole self-contained HTML document (scrubbed of this environment's secret values).

    What the page shows was scrubbed as data before it was drawn (``scrubbed``); the page itself gets what
    is safe on markup (``Scrubber.in_markup``: its numbers, attributes and base64 figures stay whole)."""
    doc = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"/>"
           f"<title>{escape(title)}</title>{html.STYLE}{EXTRA_STYLE}</head>"
           f'<body><div class="cg"><h1>{escape(title)}</h1>' + "".join(body) + "</div></body></html>")
    return Scrubber.from_environment().in_markup(doc)


def scrubbed(data: Any) -> Any:
    """Every text of ``data`` scrubbed of this environment's secrets, before it is drawn."""
    return scrub_strings(data, Scrubber.from_environment())


def href(path: str) -> str:
    """A link to a file beside the page, escaped; always a path ("./javascript:x" is a file, "javascript:x" not)."""
    return escape(path if path.startswith(("./", "../", "/")) else f"./{path}")


def banner(verdict: str, why: list[str], facts: list[tuple[str, str]], unjudged: bool = False) -> str:
    cls = "cg-unjudged" if unjudged else "cg-accept" if verdict == "accept" else "cg-reject"
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in facts if v)
    return (f'<div class="cg-banner {cls}" id="cg-verdict"><div class="cg-verdict">{escape(verdict.upper())}</div>'
            + "".join(f'<div class="cg-why">{escape(w)}</div>' for w in why)
            + f'<table class="cg-facts">{rows}</table></div>')


def dry_run_banner(dry_run: bool) -> list[str]:
    """The DRY RUN mark a cluster page shows first where its fleet ran the cpu profile (the merge's ``dry_run``): the
    merge's report and the sign-off page alike."""
    return [f'<div class="cg-dry-run" id="cg-dry-run">{escape(DRY_RUN)}</div>'] if dry_run else []


def hosts_block(accepted: str, excluded: str, files: tuple[str, ...] = ()) -> str:
    links = " ".join(f'<a href="{href(f)}">{escape(f)}</a>' for f in files)
    return (f'<div class="cg-hosts"><p>accepted (Slurm hostlist):</p><code id="cg-accepted">{escape(accepted)}'
            f'</code><p>excluded:</p><code id="cg-excluded">{escape(excluded)}</code>'
            + (f"<p>files: {links}</p>" if links else "") + "</div>")


def excluded_table(excluded: list[dict[str, Any]], columns: tuple[str, ...] = ("host", "phase", "why"),
                   links: dict[str, str] | None = None) -> str:
    """Excluded hosts with every reason; ``links``: host -> its own report, relative to this page."""
    if not excluded:
        return '<p class="cg-muted">No host excluded.</p>'
    rows = []
    for e in excluded:
        items = "".join(f"<li>{escape(str(line))}</li>" for line in e.get("reasons") or [])
        items += "".join(f'<li class="cg-action">do: {escape(str(a.get("text", "")))}</li>'
                         for a in e.get("steps") or [])
        link = (links or {}).get(e["host"])
        host = escape(e["host"]) + (f' (<a href="{href(link)}">its report</a>)' if link else "")
        if e.get("evidence"):
            host += f' (<a href="{href(e["evidence"])}">evidence bundle</a>)'
        if e.get("action"):
            host += f"<br/>{escape(e['action'])}"
        rows.append(f'<tr><td class="cg-fail">{host}</td><td>{escape(e.get("phase", ""))}</td>'
                    f'<td><ul class="cg-reasons">{items}</ul></td></tr>')
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    return (f'<div class="cg-scroll"><table class="cg-table" id="cg-excluded-table"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def node_reports(cluster: dict[str, Any]) -> dict[str, str]:
    """host -> the node's own report.html, relative to the merged report (where there is one)."""
    out = {}
    for n in cluster["nodes"]:
        if not n["directory"]:
            continue
        report = node_directory(n["directory"], Path(cluster["output"])) / "report.html"
        if report.is_file():
            out[n["host"]] = os.path.relpath(report, cluster["output"])
    return out


NODES_SHOWN = 2000
"""The most rows of the page's nodes table (excluded nodes first): at 100,000 nodes a row each would be a page no
browser opens; every node is in the host lists, and its own figures in its own report."""

Worst = Callable[[str], dict[str, dict[str, Any]]]
"""host -> its worst figure of each fleet metric (``clustergate.cluster.fleet.worst_figures``): the nodes table's
columns, asked for the rows it shows only."""


def nodes_table(cluster: dict[str, Any], worst: Worst | None = None) -> Table:
    """One row per node, excluded first (at most ``NODES_SHOWN``): verdict, failed tests, the worst figure of each
    metric (``worst``; none without it)."""
    shown = sorted(cluster["nodes"], key=lambda n: (n["status"] == "accepted", n["host"]))[:NODES_SHOWN]
    figures = {n["host"]: scrubbed(worst(n["host"])) if worst is not None and n["host"] else {} for n in shown}
    titles = list(dict.fromkeys(t for w in figures.values() for t in w))
    table = Table(["host", "status", "own verdict", "failed tests", "drift", *titles])
    for n in shown:
        failed = ", ".join(t["nodeid"].rsplit("::", 1)[-1] for t in n["failed_tests"])
        drift = n.get("drift") or []
        drifted = "; ".join(f"{d['metric']} {d['where']}: {number(d['now'], d['unit'])}, "
                            f"-{percent(d['fraction'])} from {number(d['first'])} (criterion {d['criterion']})"
                            for d in drift)
        row = [Cell(n["host"], "fail" if n["status"] != "accepted" else ""), Cell(n["status"]),
               Cell(n["verdict"], "fail" if n["verdict"] != "accept" else ""),
               Cell(failed, "fail" if failed else "", title="; ".join(t["summary"] for t in n["failed_tests"])),
               Cell(drifted, "fail" if any(d["severity"] == "fail" for d in drift) else "warn" if drift else "")]
        for t in titles:
            w = figures[n["host"]].get(t)
            gpu = f" gpu {w['gpu_index']}" if w and w.get("gpu_index") is not None else ""
            row.append(Cell(number(w["value"], w["unit"]) + gpu, w["state"]) if w else Cell(""))
        table.rows.append(row)
    return table


def nodes_left_out(cluster: dict[str, Any]) -> str:
    """What the nodes table leaves out past ``NODES_SHOWN`` rows, and where they are (empty when none is)."""
    more = len(cluster["nodes"]) - NODES_SHOWN
    if more <= 0:
        return ""
    return (f'<p class="cg-muted">{more} more nodes (accepted ones last) are not listed here: every host is in '
            "accepted-hosts.txt or excluded-hosts.txt, and its figures in its own report.</p>")


def _figure(svg: str, caption: str) -> str:
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return (f'<figure><img alt="{escape(caption)}" src="data:image/svg+xml;base64,{data}"/>'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def fleet_title(fm: dict[str, Any]) -> str:
    """A fleet metric's name in the page: the metric and the test that recorded it."""
    return f"{fm['metric']} ({short_test_name(fm['test'])})"


def outlier_bound(fm: dict[str, Any]) -> str:
    """Where a part becomes a fleet outlier: ``< 684 TFLOPS`` (the floor), ``> 13.5 us`` (the limit), or empty."""
    return " ".join(f"{sign} {number(fm[key], fm['unit'])}" for sign, key in (("<", "floor"), (">", "limit"))
                    if fm.get(key) is not None)


def fleet_section(fleet: list[dict[str, Any]]) -> str:
    """The cluster results' ``fleet`` section: a table of each metric's distribution, and its histogram."""
    if not fleet:
        return '<p class="cg-muted">No node recorded a per-GPU or per-node figure.</p>'
    figs, rows = [], []
    for fm in fleet:
        unit = fm["unit"]
        figs.append(_figure(histogram_svg(fm), f"{fleet_title(fm)} [{fm['profile']}], {fm['scope']} scope"))
        rows.append([Cell(fm["metric"]), Cell(short_test_name(fm["test"])), Cell(fm["profile"]), Cell(fm["scope"]),
                     Cell(str(fm["count"])),
                     *(Cell(number(fm[key], unit)) for key in ("min", "p05", "median", "p95", "max")),
                     Cell(outlier_bound(fm)), Cell(str(len(fm["outliers"])), "fail" if fm["outliers"] else "")])
    stats = Table(["metric", "test", "profile", "scope", "count", "min", "p05", "median", "p95", "max",
                   "outlier below / above", "outliers"], rows)
    return html.grid_table(stats) + '<div class="cg-figures">' + "".join(figs) + "</div>"


def outliers_table(fleet: list[dict[str, Any]]) -> str:
    """Every fleet outlier: the part (host, GPU index and serial, or the node), its figure, the bound it is outside
    of and the fleet median of its profile."""
    rows = [[Cell(o["host"], "fail" if o["severity"] != "warn" else "outlier"), Cell(fleet_title(fm)),
             Cell(fm["profile"]), Cell("the node" if o["gpu_index"] is None else f"gpu {o['gpu_index']}"),
             Cell(o.get("gpu_serial") or ""), Cell(number(o["value"], fm["unit"])), Cell(outlier_bound(fm)),
             Cell(number(fm["median"], fm["unit"])), Cell(o["severity"])] for fm in fleet for o in fm["outliers"]]
    if not rows:
        return '<p class="cg-muted">No GPU or node outside its criterion\'s bounds at the fleet median.</p>'
    return html.grid_table(Table(["host", "metric", "profile", "part", "serial", "value", "outlier below / above",
                                  "fleet median", "severity"], rows))


def cluster_page(cluster: dict[str, Any], worst: Worst | None = None) -> str:
    """The merged report of the cluster results ``merge`` decided (its ``fleet`` section drawn as it says; ``worst``:
    each node's worst figures, for the nodes table)."""
    cluster = scrubbed(cluster)
    fleet = cluster["fleet"]
    c = cluster["counts"]
    total = c["accepted"] + c["excluded"]
    why = [f"{c['accepted']} of {total} nodes accepted; {c['excluded']} excluded "
           f"({c['missing']} without a result, {c['fleet_outliers']} fleet outliers)"]
    if not cluster["sign_off"]:
        why.insert(0, "NOT A SIGN-OFF: a profile without sign-off criteria; figures are measured, not judged")
    gpus = sum(n["gpus"] for n in cluster["nodes"])
    facts = [("output", cluster["output"]), ("merged", cluster["created"]),
             ("expected", f"{c['expected']} hosts from {cluster['expected']['source']}" if cluster["expected"] else
              "the directories given"),
             ("profiles", ", ".join(cluster["profiles"])), ("levels", ", ".join(cluster["levels"])),
             ("GPUs", str(gpus)), ("next", "fabric phase on accepted-hosts.txt (torchrun -m multinode)")]
    body = [*dry_run_banner(bool(cluster.get("dry_run"))),
            banner(cluster["verdict"], why, facts, unjudged=not cluster["sign_off"] and cluster["verdict"] == "accept"),
            "<h3>Hosts</h3>", hosts_block(cluster["accepted_hostlist"], cluster["excluded_hostlist"],
                                          ("accepted-hosts.txt", "excluded-hosts.txt", "accepted-hostlist.txt",
                                           "excluded-hostlist.txt", "metrics.prom")),
            "<h3>Excluded nodes</h3>", excluded_table(cluster["excluded"], links=node_reports(cluster)),
            "<h3>Fleet outliers</h3>", outliers_table(fleet)]
    if cluster["warnings"]:
        body += ["<h3>Warnings</h3><ul>", *(f"<li>{escape(w)}</li>" for w in cluster["warnings"]), "</ul>"]
    body += ["<h3>Nodes</h3>", NODES_LEGEND, html.grid_table(nodes_table(cluster, worst)), nodes_left_out(cluster),
             "<h3>Fleet distributions</h3>", fleet_section(fleet)]
    return page(f"clustergate cluster: {len(cluster['nodes'])} nodes, node phase", body)
