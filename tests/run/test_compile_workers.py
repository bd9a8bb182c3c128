"""torch.compile's compile-worker pools are told to stop when the tests are over, without the run waiting."""

from __future__ import annotations

import sys
import time

import pytest

from clustergate.run import outside


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
