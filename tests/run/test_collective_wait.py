"""The plugin's blocked-collective check sees a rank waiting for collectives it cannot see on the stack.

Collectives replayed from a CUDA graph (the latency test) run with no torch.distributed call on the host's
stack, and c10d's watchdog does not watch them; the host waits for them in ``wait_for_collectives``, which
``main_thread_collective`` counts as a collective, so a peer that is gone ends the run at once."""

from __future__ import annotations

import threading

from clustergate.run.ranks.peers import main_thread_collective
from workloads.common import wait_for_collectives


def _seen_from_another_thread() -> str | None:
    seen: list[str | None] = []
    watcher = threading.Thread(target=lambda: seen.append(main_thread_collective()))
    watcher.start()
    watcher.join()
    return seen[0]


def test_a_wait_for_replayed_collectives_counts_as_a_collective() -> None:
    box: list[str | None] = []
    wait_for_collectives(lambda: box.append(_seen_from_another_thread()))
    assert box[0] is not None and box[0].startswith("wait_for_collectives called at test_collective_wait.py:")


def test_an_ordinary_wait_does_not() -> None:
    assert _seen_from_another_thread() is None
