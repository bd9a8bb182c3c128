"""A planted fault, loaded only into one node's run (``-p tests.faults.plugin_slow_memory``): its memory is slow.

Every timed memory copy of the HBM test on this node's ranks takes 1,000 times as long as measured,
which is what a GPU whose HBM runs degraded shows: the product measures and judges that figure like
any other (hbm_bandwidth_tbps falls far below the profile's minimum). Set by the suite's own tests;
nothing in the product reads or enables it.
"""

from __future__ import annotations

from typing import Any

from workloads.gpu import hbm

SLOWDOWN = 1000.0

_real = hbm._timed


def _degraded(fn: Any, device: Any, cfg: Any) -> list[float]:
    return [t * SLOWDOWN for t in _real(fn, device, cfg)]


hbm._timed = _degraded
