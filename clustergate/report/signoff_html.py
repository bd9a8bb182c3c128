"""signoff.html, the one page to sign: the verdict and everything it was judged by (``model.identity``), every
criterion across the accepted hosts (signoff.json's ``criteria``), the accepted set, the excluded hosts with their
evidence by phase."""

from __future__ import annotations

from html import escape
from typing import Any

from clustergate.common.numbers import number
from clustergate.criteria.against_shipped import Weakening
from clustergate.record.results import short_test_name
from clustergate.report import model
from clustergate.report.markup import cell, table
from clustergate.report.merge_html import banner, dry_run_banner, excluded_table, hosts_block, href, page, scrubbed
from clustergate.report.signoff_words import profile_named, shapes

LOOSER = "looser_than_shipped"
"""The sign-off's field that says, per criterion, where the site's profile is looser than the shipped profile of its
GPU and shape, or drops or demotes a criterion (``Weakening.as_json``: ``{"metric", "kind": looser | dropped |
demoted, "profile", "shipped", "detail"}``); the page shows its column only where the list is not empty."""


def _phase_rows(out: dict[str, Any]) -> str:
    node, fabric = out["phases"]["node"], out["phases"]["fabric"]
    rounds = f", {fabric['rounds']} rounds of node pairs" if fabric.get("rounds") else ""
    tests = ", ".join(f"{n} {k}" for k, n in sorted(fabric.get("tests", {}).items()))
    rows = [("node phase", f"{node['accepted']} accepted, {node['excluded']} excluded ({node['missing']} without a "
                           f"result); levels {', '.join(node['levels'])}; merged verdict {node['verdict']}",
             "report.html"),
            ("fabric phase", (f"{len(fabric['hosts'])} hosts, verdict {fabric['verdict']}{rounds}; tests: {tests}"
                              if fabric["results"] else "not run"), "fabric/report.html" if fabric["results"] else "")]
    cells = "".join(f"<tr><td>{escape(a)}</td><td>{escape(b)}</td><td>"
                    + (f'<a href="{href(link)}">{escape(link)}</a>' if link else "") + "</td></tr>"
                    for a, b, link in rows)
    return (f'<table class="cg-table"><thead><tr><th>phase</th><th>outcome</th><th>report</th></tr></thead>'
            f"<tbody>{cells}</tbody></table>")


def _hardware(out: dict[str, Any]) -> str:
    """The accepted hosts by their hardware (GPU count and model, or CPU ranks), as their node runs recorded it."""
    rows = "".join(f'<tr><td>{escape(hosts)}</td><td>{escape(shape)}</td></tr>' for hosts, shape in shapes(out))
    if not rows:
        return ""
    return ('<table class="cg-table" id="cg-hardware"><thead><tr><th>accepted hosts</th><th>each node</th></tr>'
            f"</thead><tbody>{rows}</tbody></table>")


def _looser(out: dict[str, Any]) -> dict[str, list[str]] | None:
    """metric -> how the site's profile is looser than the shipped one (None where it is looser nowhere, or the
    sign-off does not say: no column then)."""
    entries = out.get(LOOSER)
    if not isinstance(entries, list) or not entries:
        return None
    said: dict[str, list[str]] = {}
    for e in entries:
        if isinstance(e, dict):
            w = Weakening(**e)
            said.setdefault(w.metric, []).append(f"{w.kind}: {w.detail}")
    return said


def _parts(row: dict[str, Any]) -> str:
    """What a row's figures are of: ``24 GPUs``, ``3 nodes`` (a node phase's whole-job figure is its node's), or the
    fabric run's ``whole job``."""
    if row["phase"] == "fabric" and row["scope"] == "world":
        return "whole job"
    word = "GPU" if row["scope"] == "gpu" else "node"
    return f"{row['parts']} {word}{'s' if row['parts'] != 1 else ''}"


def criteria_section(out: dict[str, Any]) -> str:
    """Every criterion across the accepted hosts: min, median and max of their parts against the bound, the worst
    part's margin, its severity and source, and where the site's profile is looser than the shipped one."""
    rows = out.get("criteria") or []
    looser = _looser(out)
    if not rows and not looser:
        return '<p class="cg-muted">No accepted host recorded a figure.</p>'
    columns = ["phase", "metric", "test", "parts", "min", "median", "max", "bound", "worst margin", "severity",
               "source"] + (["looser than shipped"] if looser is not None else [])
    cells, classes = [], []
    for r in rows:
        unit, margin = r["unit"], r.get("margin_pct")
        low = margin is not None and margin < 0  # an accepted part under a warn criterion's bound
        mark = "; ".join((looser or {}).get(r["metric"], []))
        cells.append([cell(r["phase"]), cell(r["metric"]), cell(short_test_name(r["test"]), title=r["test"]),
                      cell(_parts(r), "num"),
                      *(cell(number(r[k], unit), "num") for k in ("min", "median", "max")),
                      cell(r["criterion"] if r.get("judged") else "not judged", "" if r.get("judged") else "cg-muted"),
                      cell("" if margin is None else f"{margin:+.1f}%", "num " + ("cg-warn" if low else "")),
                      # The kind of source in the row (one screen for the table), all of it on hover.
                      cell(r["severity"]), cell(r["source"].split(" (")[0], "cg-source", title=r["source"]),
                      *([cell(mark, "cg-warn" if mark else "")] if looser is not None else [])])
        classes.append("cg-row-looser" if mark else "")
    shown = {r["metric"] for r in rows}
    rest = [f"{m}: {'; '.join(said)}" for m, said in sorted((looser or {}).items()) if m not in shown]
    extra = ('<ul class="cg-looser">' + "".join(f'<li class="cg-warn">{escape(line)}</li>' for line in rest) + "</ul>"
             if rest else "")
    return f'<div id="cg-criteria">{table(columns, cells, "cg-table cg-criteria", classes)}{extra}</div>'


def signoff_page(out: dict[str, Any], links: dict[str, str] | None = None) -> str:
    """The page; ``links``: host -> the report that holds its evidence, relative to signoff.html."""
    out, links = scrubbed(out), scrubbed(links)
    signed = out["verdict"] == "accept"
    why = [f"{len(out['accepted'])} hosts {'signed off' if signed else 'accepted so far, not signed off'}; "
           f"{len(out['excluded'])} excluded"] + [f"not signed off: {r}" for r in out["reasons"]]
    # The profile as the line names it: a site profile as the site's, with the shipped one it holds to.
    facts = [("run", out["run_dir"]), ("created", out["created"]),
             *model.identity({**out, "version": (out.get("clustergate") or {}).get("version"),
                              "profile": profile_named(out).removeprefix("profile "), "profile_digest": None}),
             *([("looser than shipped", "; ".join(Weakening(**w).text() for w in out[LOOSER]))]
               if out.get(LOOSER) else [])]
    body = [*dry_run_banner(bool(out.get("dry_run"))), banner(out["verdict"], why, facts),
            "<h3>Criteria across the accepted hosts</h3>", criteria_section(out), "<h3>Hosts</h3>",
            hosts_block(out["accepted_hostlist"], out["excluded_hostlist"],
                        ("signoff-accepted-hosts.txt", "signoff-excluded-hosts.txt", "signoff-accepted-hostlist.txt",
                         "signoff-excluded-hostlist.txt")),
            _hardware(out),
            "<h3>Excluded hosts and the evidence</h3>",
            excluded_table(out["excluded"], ("host", "phase", "evidence"), links),
            "<h3>Phases</h3>", _phase_rows(out)]
    if out["warnings"]:
        body += ["<h3>Warnings</h3><ul>", *(f"<li>{escape(w)}</li>" for w in out["warnings"]), "</ul>"]
    return page(f"clustergate sign-off: {out['run_dir']}", body)
