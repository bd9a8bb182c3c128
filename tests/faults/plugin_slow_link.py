"""A planted fault, loaded only into one node's run (``-p tests.faults.plugin_slow_link``): its links are slow.

Every GPU-pair exchange on this node's ranks waits ``DELAY_S`` before it starts, as a NIC that trained
at a fraction of its rate would: the partner's receive waits too, so both ends time the slow pair. Set
by the suite's own tests; nothing in the product reads or enables it.
"""

from __future__ import annotations

import time
from typing import Any

from workloads.interconnect import pairs

DELAY_S = 0.05
"""About 50x the time a 1 MiB exchange takes over loopback gloo."""

_real = pairs._exchange


def _slow_exchange(send: Any, recv: Any, peer: int, group: Any) -> None:
    time.sleep(DELAY_S)
    _real(send, recv, peer, group)


pairs._exchange = _slow_exchange
