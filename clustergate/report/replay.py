"""Replay a results dict as a pytest session, so pytest-html draws the recorded run (``draw``).

Each recorded test becomes an item under its original node id whose report reproduces the recorded
outcome, message, duration and user properties; ``clustergate.report.hooks`` then draws the report
from the results dict exactly as in a live run (after pytest-xdist's controller, which replays
workers' reports through pytest's own hooks). The dict is drawn as it is given: its verdict was decided
before (``clustergate render``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from clustergate.common.files import refuse_not_a_file
from clustergate.report import hooks
from clustergate.report.hooks import REPLAYED


class DrawingFailed(Exception):
    """pytest-html could not draw the report; the message says with which status."""


def draw(path: Path, results: dict[str, Any], output: Path) -> None:
    """pytest-html draws ``results`` (recorded at ``path``) into ``output``: in a private directory beside it,
    then renamed over it (pytest-html writes the file itself, and a link planted at ``output`` must be replaced,
    never written through; a device, a FIFO or a directory there is never replaced: NotAFile). OSError where it
    cannot be written; DrawingFailed where the session failed."""
    scratch = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}."))
    try:
        status = _session(path, results, scratch / "report.html")
        if (scratch / "report.html").is_file():
            refuse_not_a_file(output)  # a device or a FIFO made there meanwhile is not replaced either
            os.replace(scratch / "report.html", output)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # A record without tests replays no test (pytest's 5): its page is drawn all the same.
    if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        raise DrawingFailed(f"rendering failed (pytest exit status {status})")


def _session(path: Path, results: dict[str, Any], output: Path) -> int:
    """The replay session; pytest-html writes ``output``. Returns pytest's exit status."""
    # No conftest and no installed clustergate plugin (its torch session): only the report's hooks. No terminal
    # either: the session is the drawing's means, not the command's output (its progress, pytest's warnings about
    # modules imported before it and the path of the private directory the page is drawn in would all be noise).
    args = [str(path), "--rootdir", str(path.parent), "-c", os.devnull, "--noconftest",
            "-p", "no:clustergate", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:terminal",
            "-p", "no:warnings", "--assert=plain", "--html", str(output), "--self-contained-html"]
    return int(pytest.main(args, plugins=[hooks, ReplayPlugin(path, results)]))


class Replayed(Exception):
    """A recorded failure, raised again so pytest reports it."""


class ReplayItem(pytest.Item):
    def __init__(self, *, test: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.test = test

    def setup(self) -> None:
        if self.test.get("outcome") == "error":
            raise Replayed(self.test.get("message", ""))

    def runtest(self) -> None:
        outcome = self.test.get("outcome")
        if outcome == "skipped":
            pytest.skip(self.test.get("message", "") or "skipped")
        if outcome == "failed":
            raise Replayed(self.test.get("message", ""))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, Replayed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.test["nodeid"]


class ResultsFile(pytest.File):
    def collect(self) -> Iterator[ReplayItem]:
        for test in self.config.stash[REPLAYED].get("tests", []):
            yield ReplayItem.from_parent(self, name=test["nodeid"].rsplit("::", 1)[-1], nodeid=test["nodeid"],
                                         test=test)


class ReplayPlugin:
    """Collects ``path`` as the recorded tests of ``results``."""

    def __init__(self, path: Path, results: dict[str, Any]) -> None:
        self.path = path.resolve()
        self.results = results

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[REPLAYED] = self.results

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> ResultsFile | None:
        if file_path.resolve() == self.path:
            return ResultsFile.from_parent(parent, path=file_path)
        return None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report: pytest.TestReport = yield
        if isinstance(item, ReplayItem):
            report.user_properties.append(("failed_ranks", item.test.get("failed_ranks", [])))
            if call.when == "call":
                report.user_properties.append(("metrics", item.test.get("metrics", [])))
                report.duration = float(item.test.get("duration_s", 0.0))
        return report
