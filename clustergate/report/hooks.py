"""The sign-off report through pytest-html's hooks, and the terminal summary.

Enabled beside ``clustergate.run.plugin`` (``clustergate.pytest_plugins``). What it draws is a results dict it is
handed, never the run itself: a live run puts a ``Source`` under ``LIVE`` (its record as results.json says it),
a re-render puts the recorded dict under ``REPLAYED``. Only rank 0 writes a report (the plugin switches
pytest-html off elsewhere), so every hook here does its work where pytest-html is active and leaves other ranks
alone.

Ordering, which the report depends on:
- pytest-html's report object registers in its ``pytest_configure``, after this module and the
  plugin, and its trylast ``pytest_sessionfinish`` therefore runs after the plugin's: by the time
  it calls ``pytest_html_results_summary`` the verdict is final.
- Extras are added in a tryfirst makereport wrapper: outside the plugin's wrapper, so the call
  report already carries the merged verdict and the run record holds the test's metrics and details.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Generator, Mapping
from html import escape
from pathlib import Path
from typing import Any, Protocol

import pytest

from clustergate.common.parts import rank_index
from clustergate.record.verdict import INTERRUPTED
from clustergate.report import figures, html
from clustergate.report.places import Unplaced
from clustergate.report.summary import summary_lines
from clustergate.secrets.redact import Scrubber, redact, scrub_strings, shown_environment
from clustergate.trust import skip_facts

REPORT_PLUGINS = {"metadata": "pytest_metadata.plugin", "html": "pytest_html.plugin",
                  "html_fixtures": "pytest_html.fixtures"}
"""The plugins the report is drawn with (pytest-html's ``extras`` fixture among them), by the name of each one's
entry point."""


def pytest_addoption(pluginmanager: pytest.PytestPluginManager) -> None:
    """pytest-metadata and pytest-html, registered as their entry points would: where plugin autoload is off (a
    run from the checkout, ``clustergate run``, a re-render in such an environment) nothing else loads them, and
    where it is on they then load once. One disabled (``-p no:html``) stays out: a run refuses to go on without it
    (``clustergate.run.plugins.disabled``)."""
    for name, module_name in REPORT_PLUGINS.items():
        if pluginmanager.is_blocked(name) or pluginmanager.is_blocked(module_name) or pluginmanager.get_plugin(name):
            continue
        module = importlib.import_module(module_name)
        if not pluginmanager.is_registered(module):
            pluginmanager.register(module, name)


class Source(Protocol):
    """What a live run hands the report: its record as results.json says it, and the facts of the run."""

    @property
    def results_path(self) -> Path:
        """Where the run writes results.json."""

    def results(self, *, final: bool = False, only_test: str | None = None) -> dict[str, Any] | None:
        """The run as results.json says it (None where this rank writes no outputs). ``final``: as decided at
        the end of the session, once decided; ``only_test``: of the tests, that one alone (a decided record
        has them all)."""

    def facts(self) -> dict[str, Any]:
        """The run's profile, level, world size, report directory and versions, for the environment table."""


LIVE = pytest.StashKey[Source]()
"""The live run's ``Source`` (``clustergate.run.plugin`` puts it here); none in a re-render."""
REPLAYED = pytest.StashKey[dict[str, Any]]()
"""The results dict of a re-render session (``clustergate render``); none in a live run."""
SCRUB = pytest.StashKey[Scrubber]()
UNPLACED = pytest.StashKey[Unplaced]()
"""This machine's directories as the report shows them (``clustergate.report.places``): no absolute path in it."""
ESCAPED = pytest.StashKey[set[str]]()
"""The pytest-metadata keys already made safe for pytest-html (a key added during the run is made so at the end)."""


def _active(config: pytest.Config) -> bool:
    """pytest-html writes a report in this process (rank 0 only)."""
    return bool(config.getoption("htmlpath", None))


def results_of(config: pytest.Config, final: bool = False, only_test: str | None = None) -> dict[str, Any] | None:
    """The run as results.json says it: the replayed dict, or rank 0's live record.

    ``final``: at the end of the session, the record as decided (the one results.json gets once every
    output is written), so the report and the terminal summary say exactly what the file will say.
    ``only_test``: of the live record's tests, that one alone (a replayed or decided record has them all).
    """
    if REPLAYED in config.stash:
        return config.stash[REPLAYED]
    live = config.stash.get(LIVE, None)
    return None if live is None else live.results(final=final, only_test=only_test)


def _scrub(config: pytest.Config) -> Scrubber:
    if SCRUB not in config.stash:
        config.stash[SCRUB] = Scrubber.from_environment()
    return config.stash[SCRUB]


def _unplaced(config: pytest.Config) -> Unplaced:
    if UNPLACED not in config.stash:
        live = config.stash.get(LIVE, None)
        config.stash[UNPLACED] = Unplaced(live.results_path.parent if live is not None else None)
    return config.stash[UNPLACED]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before pytest-html reads pytest-metadata (its trylast sessionstart): add the run, redact."""
    config = session.config
    if not _active(config):
        return
    metadata = _metadata(config)
    if metadata is None:
        return
    live = config.stash.get(LIVE, None)
    if REPLAYED in config.stash:
        # This machine's Python and plugins say nothing about the recorded run: show what was recorded.
        metadata.clear()
        metadata["recorded environment"] = dict(config.stash[REPLAYED].get("environment", {}))
        metadata["re-rendered by"] = "clustergate render"
    else:
        if live is not None:
            metadata["clustergate"] = live.facts()
        shown = shown_environment()
        if shown:
            metadata["environment variables"] = shown
    config.stash[SCRUB] = Scrubber.from_environment(extra=metadata)
    config.stash[ESCAPED] = set()
    _clean_metadata(config, metadata)


def _clean_metadata(config: pytest.Config, metadata: dict[str, Any]) -> None:
    """Redact the metadata and escape it for pytest-html, whose script inserts every value (and the keys of
    a nested table) into the page as HTML, unescaped: a node name or an NCCL_* value carrying markup
    would run as script in the reviewer's browser. Top-level keys are inserted as text: they stay as they are."""
    done = config.stash.get(ESCAPED, set())
    fresh = {k: v for k, v in metadata.items() if k not in done}
    if not fresh:
        return
    unplaced = _unplaced(config)
    cleaned = {k: page_value(unplaced.of(v)) for k, v in redact(fresh, _scrub(config)).items()}
    for key in fresh:
        del metadata[key]
    metadata.update(cleaned)
    done.update(cleaned)
    config.stash[ESCAPED] = done


def page_value(value: Any) -> Any:
    """A pytest-metadata value as pytest-html may insert it as HTML: a mapping stays a mapping of escaped
    keys and texts (one line each), anything else becomes escaped text; numbers stay numbers."""
    if isinstance(value, Mapping):
        return {escape(str(k)): _page_text(v) for k, v in value.items()}
    return _page_text(value)


def _page_text(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple, set)):
        return escape(", ".join(map(str, value)))
    if isinstance(value, Mapping):
        return escape(json.dumps(value, default=str))
    return escape(str(value))


@pytest.hookimpl(optionalhook=True)
def pytest_html_report_title(report: Any) -> None:
    results = results_of(report.config, only_test="")
    report.title = title(results)


def title(results: dict[str, Any] | None) -> str:
    """A run's report is a run's, not a sign-off (that is ``clustergate signoff``'s page); a CPU run says it is a
    dry run."""
    if not results:
        return "clustergate run"
    dry = " (dry run, no GPU)" if skip_facts.profile_kind(results) == "cpu" else ""
    return f"clustergate run: profile {results.get('profile')}{dry}"


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_table_header(cells: list[str]) -> None:
    cells.insert(2, '<th class="sortable" data-column-type="failedranks">Failed ranks</th>')
    cells.insert(3, '<th class="sortable" data-column-type="metrics">Metrics</th>')


TEST_ID_CELL = '<td class="col-testId">'


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_table_row(report: pytest.TestReport, cells: list[str]) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        # The summary's table of what was skipped and why says it once per reason (``html.skipped_table``);
        # pytest-html's row would add a box per test holding its skip as a Python tuple with the file's absolute
        # path. Emptied cells are pytest-html's own way of leaving a row out.
        del cells[:]
        return
    # pytest-html puts the test id in its cell unescaped: a parametrized id or a recorded node id (a
    # re-render reads them from a file) carrying markup would run as script. Its cell is rebuilt escaped.
    scrub = getattr(report, "clustergate_scrub", None) or Scrubber.from_environment()
    when = getattr(report, "when", "call")
    test_id = report.nodeid + (f"::{when}" if when and when != "call" else "")
    for i, cell in enumerate(cells):
        if isinstance(cell, str) and cell.startswith(TEST_ID_CELL):
            cells[i] = f"{TEST_ID_CELL}{escape(scrub(test_id))}</td>"
    failed, metrics = getattr(report, "clustergate_cells", ("", ""))
    cells.insert(2, f'<td class="col-failedranks">{escape(failed)}</td>')
    cells.insert(3, f'<td class="col-metrics">{escape(metrics)}</td>')


def _prop(report: pytest.TestReport, name: str, default: Any) -> Any:
    for key, value in getattr(report, "user_properties", []):
        if key == name:
            return value
    return default


def _row_cells(report: pytest.TestReport, results: dict[str, Any]) -> tuple[str, str]:
    """The extra columns of a test's row: failed ranks with their hosts, and metrics failing."""
    ranks = rank_index(results)
    failed = _prop(report, "failed_ranks", [])
    hosts = sorted({ranks.get(r, {}).get("host", "?") for r in failed})
    text = f"{', '.join(map(str, failed[:12]))}{' ...' if len(failed) > 12 else ''} ({', '.join(hosts[:4])})" \
        if failed else ""
    metrics = _prop(report, "metrics", [])
    bad = sum(not m.get("passed") for m in metrics)
    return text, "" if not metrics else f"{bad} of {len(metrics)} fail" if bad else f"{len(metrics)} ok"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    if not _active(item.config):
        return report
    # The record is read where the row needs it: the call phase's extras, or the hosts of failed ranks. Reading it
    # costs a redaction of the run's record, three times a test otherwise.
    needed = call.when == "call" or bool(_prop(report, "failed_ranks", []))
    results = (results_of(item.config, only_test=item.nodeid) or {}) if needed else {}
    # pytest-html's row and log hooks get the report but not the config: what they need rides on it.
    report.clustergate_cells = _row_cells(report, results)  # type: ignore[attr-defined]
    report.clustergate_scrub = _scrub(item.config)  # type: ignore[attr-defined]
    report.clustergate_unplaced = _unplaced(item.config)  # type: ignore[attr-defined]
    if call.when == "call":
        test = next((t for t in results.get("tests", []) if t["nodeid"] == item.nodeid), None)
        if test is not None:
            own = row_extras(test, results, _scrub(item.config), _unplaced(item.config))
            report.clustergate_own_extras = {id(e) for e in own}  # type: ignore[attr-defined]
            report.extras = [*getattr(report, "extras", []), *own]
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Before pytest-html takes a report's extras (its trylast logreport): make every extra not drawn here
    safe. Not earlier: pytest-html adds the ``extras`` fixture's own after the makereport hooks."""
    if not getattr(report, "extras", None) or not hasattr(report, "clustergate_scrub"):
        return
    own = getattr(report, "clustergate_own_extras", set())
    report.extras = [e if id(e) in own else safe_extra(e, report.clustergate_scrub) for e in report.extras]


SAFE_URL = re.compile(r"^(https?:|file:|data:image/|[^:]*$)", re.IGNORECASE)
"""Links an extra may carry: web pages, files, images, and relative paths (no ``javascript:``)."""


def safe_extra(extra: dict[str, Any], scrub: Scrubber) -> dict[str, Any]:
    """Another plugin's (or a test's) extra as pytest-html may insert it: its name is put in a link as HTML,
    an html extra's content into the page, a url extra's into an href. All escaped or refused here."""
    out = dict(extra)
    kind, content = out.get("format_type"), out.get("content")
    if isinstance(out.get("name"), str):  # an image's or video's name is inserted as text
        out["name"] = scrub(out["name"]) if kind in ("image", "video") else escape(scrub(out["name"]))
    if kind == "html" and isinstance(content, str):
        out["content"] = f"<pre>{escape(scrub(content))}</pre>"
    elif kind == "url" and isinstance(content, str):
        out["content"] = escape(scrub(content)) if SAFE_URL.match(content.strip()) else "#"
    elif kind in ("text", "json") and isinstance(content, str):
        out["content"] = scrub(content)
    elif kind == "json" and isinstance(content, (Mapping, list)):
        out["content"] = redact(content, scrub)
    return out


def row_extras(test: dict[str, Any], results: dict[str, Any], scrub: Scrubber,
               unplaced: Unplaced | None = None) -> list[dict[str, Any]]:
    """A test's row extras: its metric table (html, every text escaped), its figures (png), its details (json);
    ``unplaced``: this machine's directories rewritten out of every text."""
    from pytest_html import extras

    # The run's other tests are not drawn here: scrubbing them for every row would cost tests x tests.
    test, results = scrub_strings((test, {k: v for k, v in results.items() if k != "tests"}), scrub)
    if unplaced is not None:
        test, results = unplaced.of(test), unplaced.of(results)
    out = []
    table = html.test_extra(test, results)
    if table:
        out.append(extras.html(table))
    details = test.get("details") or {}
    if isinstance(details, dict):
        out += [extras.png(html.png_of(f), name=f.title) for f in figures.test_figures(details)]
        if details:
            out.append(extras.json(redact(details, scrub), name="details"))
    return out


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_table_html(report: pytest.TestReport, data: list[str]) -> None:
    """Scrub secrets from the test's log (captured output, tracebacks) before it is embedded, and this machine's
    directories (a traceback's file paths read relative to the suite)."""
    scrub = getattr(report, "clustergate_scrub", None) or Scrubber.from_environment()
    unplaced = getattr(report, "clustergate_unplaced", None) or Unplaced()
    data[:] = [unplaced(scrub(line)) for line in data]


@pytest.hookimpl(optionalhook=True)
def pytest_html_results_summary(prefix: list[str], summary: list[str], postfix: list[str],
                                session: pytest.Session) -> None:
    config = session.config
    metadata = _metadata(config)
    if metadata is not None and ESCAPED in config.stash:
        _clean_metadata(config, metadata)  # keys a test or plugin added during the run
    results = results_of(config, final=True)
    if results is not None:
        # Every text of the summary is escaped as it is placed (clustergate.report.html): scrubbed before.
        prefix.append(html.summary(_unplaced(config).of(scrub_strings(results, _scrub(config)))))


def _metadata(config: pytest.Config) -> dict[str, Any] | None:
    try:
        from pytest_metadata.plugin import metadata_key
    except ImportError:  # pragma: no cover - pytest-html 4 requires pytest-metadata 2+
        return None
    return config.stash.get(metadata_key, None)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    results = results_of(config, final=True)
    if results is None:
        return
    tr = terminalreporter
    tr.section("clustergate summary", sep="=", bold=True)
    lines = summary_lines(results)
    accept = results.get("verdict") == "accept"
    interrupted = lines[0].startswith(INTERRUPTED)  # says nothing of the node: never in the reject's red
    tr.write_line(lines[0], green=accept, red=not (accept or interrupted), yellow=interrupted, bold=True)
    for line in lines[1:]:
        warn = " WARN" in line or line.startswith("warnings:")
        tr.write_line(line, red=" FAIL" in line or line.startswith("run error"), yellow=warn and " FAIL" not in line)
    live = config.stash.get(LIVE, None)
    if live is not None:
        tr.write_line(f"results: {live.results_path}")
