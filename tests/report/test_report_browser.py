"""The report as a person sees it: headless Chromium opens report.html offline.

The page renders (pytest-html's script fills the test table), the verdict and the criteria table
are in the DOM, the browser logs no console error, and the page asks the network for nothing: the
browser runs behind a proxy that refuses every connection, its network log has no request from the
page, and report.html refers to no http(s) resource. The screenshot is kept: printed, and copied
to $CLUSTERGATE_TEST_ARTIFACTS when set (CI can upload that folder). Markup planted in what a report
shows (an NCCL_* value, a recorded host name) runs no script there.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from browser import CHROMIUM, CSS_URL, RESOURCE_ATTR, chromium, console_errors, page_requests
from report_runs import demo_reject, marked_run, rerender, results  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed: apt-get install chromium (.ci/run installs it)")]


def test_report_opens_offline_and_shows_the_verdict(demo_reject: Path, tmp_path: Path) -> None:  # noqa: F811
    report = demo_reject / "report" / "report.html"
    text = report.read_text()
    # Links for a person to click (pytest-html's credit line) fetch nothing; anything else would.
    assert RESOURCE_ATTR.search(text) is None and CSS_URL.search(text) is None

    dom_run = chromium(report.as_uri(), tmp_path / "profile-dom", "--dump-dom")
    dom = dom_run.stdout
    assert dom_run.returncode == 0, dom_run.stderr[-3000:]
    assert page_requests(dom_run.stderr) == []
    assert console_errors(dom_run.stderr) == []

    verdict = re.search(r'id="cg-verdict"><div class="cg-verdict">(\w+)</div>', dom)
    assert verdict is not None and verdict.group(1) == "REJECT"
    criteria = dom[dom.index('class="cg-table cg-criteria"'):]
    criteria = criteria[:criteria.index("</table>")]
    assert criteria.count("<tr") == 1 + 5  # header and the demo's five metrics
    first = criteria[criteria.index("<tbody>"):]
    assert first.index("demo_hbm_tbps") < first.index("FAIL") < first.index("demo_pair_gbps")  # failures first
    for test in results(demo_reject)["tests"]:  # pytest-html's script rendered every row
        assert f'id="{test["nodeid"]}"' in dom
    assert dom.count('src="data:image/png;base64,') >= 5

    shot = tmp_path / "report.png"
    shot_run = chromium(report.as_uri(), tmp_path / "profile-shot", "--window-size=1400,3000",
                        "--hide-scrollbars", f"--screenshot={shot}")
    assert shot_run.returncode == 0 and shot.stat().st_size > 50_000, shot_run.stderr[-3000:]
    assert page_requests(shot_run.stderr) == []
    keep = os.environ.get("CLUSTERGATE_TEST_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for src in (shot, report):
            shutil.copy(src, Path(keep) / f"report-browser-{src.name}")
    print(f"screenshot of the report: {shot}" + (f" (copied to {keep})" if keep else ""))


def test_page_requests_are_detected() -> None:
    """The network check itself: a page's fetch is caught, Chromium's own services and data: are not."""
    log = ("x NotifyBeforeURLRequest: https://cdn.example.net/plotly.js\n"
           "x NotifyBeforeURLRequest: https://accounts.google.com/ListAccounts?x=1\n"
           "x NotifyBeforeURLRequest: http://update.googleapis.com/service/update2/json\n"
           "x NotifyBeforeURLRequest: file:///tmp/report.html\n")
    assert page_requests(log) == ["https://cdn.example.net/plotly.js"]
    assert RESOURCE_ATTR.search('<img alt="x" src="https://cdn.example.net/a.png">')
    assert RESOURCE_ATTR.search('<link rel="stylesheet" href="//fonts.example.com/x.css">')
    assert not RESOURCE_ATTR.search('<a href="https://pypi.python.org/pypi/pytest-html">')
    assert CSS_URL.search("background: url('https://example.com/x.png')")
    assert console_errors('[1:1:INFO:CONSOLE:3] "Uncaught ReferenceError: x", source: file:///r.html (3)')


def test_markup_in_a_report_runs_no_script(marked_run: Path, tmp_path: Path) -> None:  # noqa: F811
    """An NCCL_* value, --metadata and a test id carrying ``<img src=x onerror=...>`` (a live run),
    and a results.json whose host names, environment and test id carry it (re-rendered): the page's title
    is its own, no such element exists, and the text reads as it was given."""
    pages = {"live": marked_run / "report" / "report.html", "re-rendered": rerender(tmp_path)}
    for name, page in pages.items():
        run = chromium(page.as_uri(), tmp_path / f"profile-{name.replace('-', '')}", "--dump-dom")
        dom = run.stdout
        assert run.returncode == 0 and "</html>" in dom, run.stderr[-3000:]
        title = re.search(r"<title[^>]*>([^<]*)</title>", dom)
        assert title is not None and title.group(1).startswith("clustergate run: profile "), (name, title)
        assert "pwned" not in title.group(1)
        assert '<img src="x"' not in dom, name  # the browser made no element of it (as it would serialize one)
        assert "&lt;img src=x onerror=document.title='pwned'&gt;" in dom, name  # shown, as text
        assert console_errors(run.stderr) == [], name
