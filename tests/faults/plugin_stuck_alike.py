"""A planted fault, loaded into a run with ``-p tests.faults.plugin_stuck_alike``: every rank stuck alike in one test.

On every rank the body of ``STUCK`` (seconds when healthy) never returns: each rank sleeps in its own code, as every
GPU of a node hung alike would hold its ranks, and none waits for another, so no peer can name a culprit: only the
test's limit ends it. Each rank writes ``stuck-RANK`` (its pid and the wall clock) beside the report directory as it
goes astray. Set by the suite's own tests; nothing in the product reads or enables it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

STUCK = "acceptance/test_gpu_compute.py::test_hbm_bandwidth"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.nodeid != STUCK:
        return None
    report_dir = Path(pyfuncitem.config.getoption("report_dir"))
    (report_dir.parent / f"stuck-{os.environ.get('RANK', '0')}").write_text(f"{os.getpid()} {time.time()}")
    while True:
        time.sleep(1.0)
