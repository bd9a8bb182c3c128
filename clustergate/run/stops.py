"""What stops a session early on this rank, told to the session (``ClusterGate.leave``/``run.fail``):
pytest.exit, KeyboardInterrupt, an internal error, a test file that cannot be collected, a crash in any
plugin's end of the session (a report that cannot be written). Registered by the plugin per run.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from clustergate.redact import Scrubber
from clustergate.run.session import ClusterGate

STATUS = pytest.StashKey[int]()
"""The exit status every rank agreed at the end of the session."""


class SessionEvents:
    """What ends a session early on this rank, told to the session: pytest.exit, KeyboardInterrupt, an
    internal error, a test file that cannot be collected, a crash in any plugin's end of the session."""

    def __init__(self, gate: ClusterGate) -> None:
        self.gate = gate

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        value = excinfo.value
        if isinstance(value, pytest.exit.Exception):
            self.gate.leave(f"pytest.exit({value.msg!r}) on {self.gate.who} during {self.gate.where_now()}",
                            interrupted=True)
        else:  # Ctrl-C: the signal watcher has said so already, unless it came some other way
            self.gate.leave(f"KeyboardInterrupt on {self.gate.who} during {self.gate.where_now()}", "signal", [],
                            interrupted=True)

    def pytest_internalerror(self, excrepr: Any, excinfo: Any) -> None:
        what = excinfo.exconly() if excinfo is not None else str(excrepr).splitlines()[-1]
        self.gate.leave(f"internal error on {self.gate.who} during {self.gate.where_now()}: {what}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            last = next((line for line in report.longreprtext.splitlines()[::-1] if line.strip()), "")
            self.gate.run.fail(f"collecting {report.nodeid or 'the tests'} failed on {self.gate.who}: {last}")

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Any:
        try:
            return (yield)
        except Exception as exc:  # e.g. a report that cannot be written: the run must not read as accepted
            sys.stderr.write(Scrubber.from_environment()(f"clustergate: the end of the session failed on "
                                                         f"{self.gate.who}: {type(exc).__name__}: {exc}\n"))
            self.gate.run.fail(f"the end of the session failed on {self.gate.who}: {type(exc).__name__}: {exc}")
            if self.gate.status is None:
                status = self.gate.conclude(pytest.ExitCode.INTERNAL_ERROR, collect_only=False)
                session.config.stash[STATUS] = status
            return None
