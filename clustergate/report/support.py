"""Two summary sections of the report: the expected configuration, and what a vendor's support asks for.

Both are drawn from the results.json dict alone (a live run and a re-render look the same):
- "Expected configuration": one row per ``expect:`` key a test judged (its ``details["expect"]``).
- "For vendor support": driver, CUDA, NCCL and kernel; every GPU's serial, UUID, PCI address,
  VBIOS, InfoROM and board part number (results.json ``hardware_inventory``, else ``nodes``); the error
  counters that grew during the run with both values and the next step (the error tests'
  ``details["evidence"]``); XIDs logged before the run; DCGM's failures.
"""

from __future__ import annotations

from typing import Any

from clustergate.common.numbers import number
from clustergate.record.results import short_test_name
from clustergate.report.markup import cell, esc, table

INVENTORY_COLUMNS = (("host", "host"), ("index", "GPU"), ("serial", "serial"), ("uuid", "UUID"),
                     ("pci_bus_id", "PCI"), ("name", "model"), ("vbios_version", "VBIOS"),
                     ("inforom_image", "InfoROM"), ("board_part_number", "board part number"))


def _tests_with(results: dict[str, Any], key: str) -> list[tuple[dict[str, Any], Any]]:
    return [(t, t["details"][key]) for t in results.get("tests", [])
            if isinstance(t.get("details"), dict) and key in t["details"]]


def expected_configuration(results: dict[str, Any]) -> str:
    rows = []
    for test, e in _tests_with(results, "expect"):
        seen = "; ".join(f"{r['where']}: {r['seen']}" for r in e.get("rows", [])[:8])
        more = len(e.get("rows", [])) - 8
        outcome = test.get("outcome", "")
        cls = {"failed": "cg-fail", "passed": "cg-pass"}.get(outcome, "cg-muted")
        rows.append([cell(e.get("setting", ""), title=e.get("what", "")), cell(e.get("expected", "")),
                     cell(outcome.upper() if outcome != "skipped" else "not readable", cls),
                     cell(seen + (f"; ... {more} more" if more > 0 else ""))])
    return table(["setting", "expected", "result", "seen"], rows) if rows else ""


def _inventory(results: dict[str, Any]) -> list[dict[str, Any]]:
    section = results.get("hardware_inventory")
    if isinstance(section, dict) and section.get("gpus"):
        return section["gpus"]
    return [{"host": n.get("host"), **g} for n in results.get("nodes", []) for g in n.get("gpus", [])]


def _grown(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for test, evidence in _tests_with(results, "evidence"):
        for r in evidence:
            if r.get("value", 0) > 0 or r.get("status") == "fail":
                cls = "cg-fail" if r.get("status") == "fail" else "cg-outlier"
                rows.append([cell(r.get("where", "")), cell(r.get("label", "")),
                             cell(r.get("metric", ""), title=short_test_name(test["nodeid"])),
                             cell(number(r.get("value"), r.get("unit", "")), "num " + cls),
                             cell("; ".join(r.get("evidence", []))), cell(r.get("next_step", ""))])
    return rows


def vendor_support(results: dict[str, Any]) -> str:
    env = results.get("environment", {})
    facts = [f"{k} {env[k]}" for k in ("driver", "cuda", "nccl", "torch", "platform") if env.get(k)]
    parts = [f"<p>{esc('; '.join(facts))}</p>"] if facts else []
    gpus = _inventory(results)
    if gpus:
        cells = [[cell("" if g.get(k) is None else str(g[k])) for k, _ in INVENTORY_COLUMNS] for g in gpus]
        parts.append(table([label for _, label in INVENTORY_COLUMNS], cells))
    grown = _grown(results)
    checked = sum(len(e) for _, e in _tests_with(results, "evidence"))
    if grown:
        parts.append("<p><b>Error counters that grew during the run</b> (both values, and what to do)</p>")
        parts.append(table(["where", "part", "metric", "growth", "counters", "next step"], grown))
    elif checked:
        parts.append(f'<p class="cg-muted">No error counter grew during the run ({checked} figures checked).</p>')
    nodes = (results.get("hardware_inventory") or {}).get("nodes", [])
    history = [[cell(n.get("host", "")), cell(x.get("bus_id", "")), cell(str(x.get("code", ""))),
                cell(x.get("text", ""))] for n in nodes for x in n.get("xids_before_run", [])]
    if history:
        parts.append("<p><b>XIDs in the kernel log from before the run</b> (not judged)</p>")
        parts.append(table(["host", "PCI", "XID", "text"], history))
    dcgm = [[cell(r.get("where", "")), cell(r.get("test", "")), cell(r.get("status", ""), "cg-fail"),
             cell(r.get("message", ""))]
            for _, rows in _tests_with(results, "dcgm") for r in rows if r.get("status") in ("fail", "warn")]
    if dcgm:
        parts.append("<p><b>DCGM diagnostics that failed</b></p>")
        parts.append(table(["where", "DCGM test", "status", "DCGM's message"], dcgm))
    return "".join(parts)


def sections(results: dict[str, Any]) -> list[str]:
    """The HTML parts for html.summary: headings and tables, nothing where there is nothing to show."""
    out = []
    config = expected_configuration(results)
    if config:
        out += ["<h3>Expected configuration</h3>", config]
    support = vendor_support(results)
    if support:
        out += ["<h3>For vendor support</h3>", support]
    return out
