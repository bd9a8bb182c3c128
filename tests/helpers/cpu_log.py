"""Per test, the CPU it cost: where ``CLUSTERGATE_TEST_CPU_LOG`` names a folder, each test's wall time and the CPU
seconds of its process and of the processes it waited for (resource.getrusage's RUSAGE_SELF and RUSAGE_CHILDREN,
setup and teardown included, so a session fixture's run counts on the first test that uses it) go to
FOLDER/WORKER.jsonl, one line a test. docs/development.md ("Where their time goes") is measured with it."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path

import pytest

LOG = "CLUSTERGATE_TEST_CPU_LOG"


def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    folder = os.environ.get(LOG)
    if not folder:
        yield
        return
    wall, (me, kids) = time.monotonic(), _cpu()
    yield
    me2, kids2 = _cpu()
    line = {"nodeid": item.nodeid, "wall_s": round(time.monotonic() - wall, 3), "self_s": round(me2 - me, 3),
            "children_s": round(kids2 - kids, 3), "load1": round(os.getloadavg()[0], 2)}
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")
