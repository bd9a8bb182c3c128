"""torch.compile's compile-worker pools are told to stop when the tests are over, without the run waiting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustergate.run import outside

from torchrun_job import ROOT


def test_the_pools_stop_in_a_thread_of_their_own() -> None:
    from torch._inductor import async_compile

    async_compile.AsyncCompile.warm_pool()  # what torch.compile does first: a pool of worker processes
    pools = list(async_compile._pool_set)
    assert pools and all(pool.running for pool in pools)
    began = time.monotonic()
    thread = outside.release_compile_workers()
    returned_s = time.monotonic() - began
    assert thread is not None
    stopping_at_return = thread.is_alive()
    thread.join(60)
    assert not thread.is_alive()
    assert returned_s < 0.2 and stopping_at_return  # the caller did not wait for the workers to exit
    assert not any(pool.running for pool in pools)
    assert all(pool.process.poll() is not None for pool in pools)
    async_compile.shutdown_compile_workers()  # inductor's own exit handler now finds nothing to wait for


def test_nothing_to_do_where_nothing_was_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch._inductor.async_compile", raising=False)
    assert outside.release_compile_workers() is None
    assert "torch._inductor.async_compile" not in sys.modules  # and inductor was not imported for it


ENDS_THEM = """
import json, subprocess, sys, time
from clustergate.run import children
worker = subprocess.Popen([sys.executable, sys.argv[1]])
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(1.0)  # both have started their interpreters: their command lines are theirs
named = children.end_left(grace_s=5)
print(json.dumps({"named": named, "worker": worker.pid, "other": other.pid,
                  "codes": [worker.wait(5), other.wait(5)]}))  # both ended (by a signal: negative codes)
"""


def test_compile_workers_left_at_the_end_are_ended_without_a_word(tmp_path: Path) -> None:
    """A compile-worker pool still there when the run ends (the run told it to stop and did not wait) is ended with
    the rest, and not named among what the tests left running: a healthy GPU run said "ended 1 process the tests
    left running: pid N (python3)" every time."""
    entry = tmp_path / "torch" / "_inductor" / "compile_worker" / "__main__.py"
    entry.parent.mkdir(parents=True)
    entry.write_text("import time\ntime.sleep(600)\n")
    done = subprocess.run([sys.executable, "-c", ENDS_THEM, str(entry)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["named"] == [f"pid {seen['other']} ({Path(sys.executable).name[:15]})"], seen
    assert all(code < 0 for code in seen["codes"]), seen
