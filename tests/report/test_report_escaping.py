"""Markup in what a report shows stays text: pytest-html inserts its environment table and test-id
cells as HTML, so a node name, an NCCL_* value or a test id carrying ``<img src=x onerror=...>`` ran script
in a reviewer's browser, live and through ``clustergate render``. Checked here on the page's data
(the browser itself: tests/report/test_report_browser.py).
"""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from report_results import RESULTS
from report_runs import ESCAPED, MARKUP, marked_run, rerender  # noqa: F401  (marked_run: the fixture)

from clustergate.report.hooks import page_value, safe_extra
from clustergate.report.merge_html import excluded_table, hosts_block, href

from torchrun_job import plant, run_job


def page_data(page: str) -> dict[str, Any]:
    """pytest-html's data: what its script inserts into the page."""
    blob = re.search(r'<div id="data-container" data-jsonblob="([^"]*)"', page)
    assert blob is not None
    return json.loads(html.unescape(blob.group(1)))


def inserted_as_html(data: dict[str, Any]) -> list[str]:
    """Every string pytest-html's script hands to innerHTML: environment values (and nested keys), the
    row cells, the log, html extras and the link names."""
    out: list[str] = []
    for value in data["environment"].values():
        if isinstance(value, dict):
            out += [f"{k}: {v}" for k, v in value.items()]
        else:
            out.append(str(value))
    for rows in data["tests"].values():
        for row in rows:
            out += row["resultsTableRow"] + [row.get("log", "")]
            out += [e["content"] for e in row["extras"] if e["format_type"] == "html"]
            out += [e["name"] for e in row["extras"] if e["format_type"] in ("json", "text", "url")]
    return out


def test_a_rerendered_file_keeps_markup_as_text(tmp_path: Path) -> None:
    page = rerender(tmp_path).read_text()
    assert MARKUP not in page
    inserted = inserted_as_html(page_data(page))
    assert not [s for s in inserted if MARKUP in s]
    assert any(f"host: n{ESCAPED}" == s for s in inserted)  # the recorded environment, shown as text
    assert any(f'<td class="col-testId">acceptance/test_hbm.py::test_hbm[{ESCAPED}]</td>' == s for s in inserted)


def test_a_live_run_keeps_markup_as_text(marked_run: Path) -> None:  # noqa: F811
    page = (marked_run / "report" / "report.html").read_text()
    assert MARKUP not in page, (marked_run / "output.txt").read_text()[-3000:]
    data = page_data(page)
    inserted = inserted_as_html(data)
    assert not [s for s in inserted if MARKUP in s]
    assert data["environment"]["environment variables"]["NCCL_SOCKET_IFNAME"] == ESCAPED
    assert data["environment"]["site"] == ESCAPED
    assert any(s.endswith(f"test_named[x{ESCAPED}]</td>") for s in inserted)
    extras = [e for rows in data["tests"].values() for row in rows for e in row["extras"]]
    assert any(e["format_type"] == "html" and e["content"] == f"<pre>&lt;b&gt;bold&lt;/b&gt;{ESCAPED}</pre>"
               for e in extras)
    assert all(e["content"] == "#" and e["name"] == ESCAPED for e in extras if e["format_type"] == "url")


def test_metadata_values_become_text_for_pytest_html() -> None:
    assert page_value(MARKUP) == ESCAPED
    assert page_value({MARKUP: MARKUP, "n": 3}) == {ESCAPED: ESCAPED, "n": 3}
    assert page_value(["a", MARKUP]) == f"a, {ESCAPED}"
    assert page_value({"nested": {"k": MARKUP}}) == {"nested": html.escape(json.dumps({"k": MARKUP}))}
    assert page_value(7) == 7


def test_foreign_extras_are_made_safe() -> None:
    from clustergate.secrets.redact import Scrubber

    scrub = Scrubber([])
    assert safe_extra({"format_type": "html", "content": MARKUP, "name": None}, scrub)["content"] == \
        f"<pre>{ESCAPED}</pre>"
    assert safe_extra({"format_type": "url", "content": "JavaScript:alert(1)", "name": MARKUP}, scrub) == \
        {"format_type": "url", "content": "#", "name": ESCAPED}
    assert safe_extra({"format_type": "url", "content": "https://ci.example/run?a=1&b=2", "name": "ci"},
                      scrub)["content"] == "https://ci.example/run?a=1&amp;b=2"
    assert safe_extra({"format_type": "image", "content": "AAAA", "name": MARKUP}, scrub)["name"] == MARKUP  # text
    assert safe_extra({"format_type": "json", "content": {"api_token": "t", "url": "https://u:p@h"}, "name": "d"},
                      scrub)["content"] == {"api_token": "[redacted]", "url": "https://[redacted]@h"}


def test_cluster_pages_keep_markup_as_text_and_links_as_paths() -> None:
    assert href("javascript:document.title='x'") == "./javascript:document.title=&#x27;x&#x27;"
    assert href("../nodes/a/report.html") == "../nodes/a/report.html"
    block = hosts_block(MARKUP, "", ("accepted-hosts.txt",))
    assert MARKUP not in block and ESCAPED in block and 'href="./accepted-hosts.txt"' in block
    table = excluded_table([{"host": MARKUP, "phase": "node", "reasons": [MARKUP]}], links={MARKUP: "javascript:x"})
    assert MARKUP not in table and table.count(ESCAPED) == 2 and 'href="./javascript:x"' in table


def test_the_terminal_summary_shows_control_characters_as_escapes() -> None:
    from clustergate.report.summary import summary_lines

    r = copy.deepcopy(RESULTS)
    r["nodes"][1]["host"] = "node-1\x1b]0;pwned\x07\x1b[2J"
    lines = summary_lines(r)
    assert not [line for line in lines if any(not c.isprintable() for c in line)]
    assert "node-1\\x1b]0;pwned\\x07\\x1b[2J" in lines[0]


@pytest.mark.slow  # a torchrun job
def test_a_run_s_own_failure_lines_show_control_characters_as_escapes(tmp_path: Path) -> None:
    """A test whose failure message and captured output carry terminal escapes (a retitle, a clear screen, a
    colour), under torchrun: pytest's own failure lines, the captured output and the summary on the terminal show
    them as escapes; results.json keeps the message as the test said it (JSON escapes it)."""
    r = run_job(tmp_path, plant(tmp_path, "fails_with_escapes"), timeout=240)
    assert r.codes == [1], r.output
    assert "\x1b" not in r.output and "\x07" not in r.output, [line for line in r.output.splitlines()
                                                               if "\x1b" in line or "\x07" in line]
    shown = "\\x1b]0;owned\\x07\\x1b[2J\\x1b[31m"
    assert f"E   AssertionError: planted failure{shown} on rank 0" in r.output  # pytest's failure lines
    assert f"captured output{shown} of rank 0" in r.output and f"captured error{shown}" in r.output
    [test] = r.results["tests"]
    assert "planted failure\x1b]0;owned\x07\x1b[2J\x1b[31m on rank 0" in test["message"]
