"""Once the tests are collected, what is alive is frozen (``gc.freeze``): a full collection, as the workloads
make before giving GPU memory back, then looks only at what the tests made, and still frees it."""

from __future__ import annotations

import gc
import weakref

from clustergate.run import outside


class _Node:
    """A reference cycle's member (weakref-able, tracked by the collector)."""

    partner: _Node | None = None


def test_what_was_alive_is_left_out_and_a_cycle_made_later_is_still_collected() -> None:
    before = _Node()
    try:
        outside.freeze_heap()
        assert gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())  # no longer scanned by any collection
        a, b = _Node(), _Node()
        a.partner, b.partner = b, a  # a cycle a test leaves (reference counting alone cannot free it)
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()  # this process goes on running other tests
    assert any(o is before for o in gc.get_objects())
