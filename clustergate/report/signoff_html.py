"""signoff.html: the accepted set, the excluded hosts with their evidence by phase, and the verdict."""

from __future__ import annotations

from html import escape
from typing import Any

from clustergate.criteria.against_shipped import Weakening
from clustergate.report.merge_html import banner, excluded_table, hosts_block, href, page, scrubbed
from clustergate.report.signoff_words import DRY_RUN, profile_named, shapes


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


def signoff_page(out: dict[str, Any], links: dict[str, str] | None = None) -> str:
    """The page; ``links``: host -> the report that holds its evidence, relative to signoff.html."""
    out, links = scrubbed(out), scrubbed(links)
    signed = out["verdict"] == "accept"
    why = [f"{len(out['accepted'])} hosts {'signed off' if signed else 'accepted so far, not signed off'}; "
           f"{len(out['excluded'])} excluded"] + [f"not signed off: {r}" for r in out["reasons"]]
    facts = [("run", out["run_dir"]), ("run id", out["run_id"]), ("created", out["created"]),
             ("profile", profile_named(out).removeprefix("profile ")), ("thresholds", out.get("thresholds", "")),
             *([("looser than shipped", "; ".join(Weakening(**w).text() for w in out["looser_than_shipped"]))]
               if out.get("looser_than_shipped") else []),
             ("level", out["level"]), ("suite", out.get("suite_digest") or ""),
             ("site key", "signed: every record read carried a valid HMAC, signoff.json carries its own"
              if out.get("signed") else "none: the records carry no HMAC")]
    dry = [f'<div class="cg-dry-run" id="cg-dry-run">{escape(DRY_RUN)}</div>'] if out.get("dry_run") else []
    body = [*dry, banner(out["verdict"], why, facts), "<h3>Hosts</h3>",
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
