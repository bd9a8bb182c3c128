"""workloads.common: this rank's device, and agreeing across ranks before raising."""

from __future__ import annotations

import socket

import pytest
import torch

from workloads import common
from workloads.result import WorkloadError


def test_device_is_local_rank_and_never_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    assert common.rank_device(3, want_cuda=False) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert common.rank_device(3) == torch.device("cuda", 3)
    with pytest.raises(common.PlacementError, match=r"LOCAL_RANK=5 but only 4 CUDA devices are visible: two ranks "
                                                    r"would share a GPU; start --nproc-per-node=4"):
        common.rank_device(5)
    monkeypatch.setenv("LOCAL_RANK", "4")  # place() applies the same rule (no modulo)
    with pytest.raises(common.PlacementError, match="LOCAL_RANK=4"):
        common.place()


def test_agree_passes_quietly_and_raises_one_error_naming_node_host_and_rank(gloo_world: None) -> None:
    common.agree(None, "nothing wrong")
    with pytest.raises(WorkloadError) as err:
        common.agree("disk full", "the write failed", "free some space")
    assert str(err.value) == (f"the write failed on 1/1 ranks (free some space):\n"
                              f"  node 0 ({socket.gethostname()}) rank 0: disk full")


def test_agree_on_returns_the_value_or_raises_the_caught_error(gloo_world: None) -> None:
    assert common.agree_on(lambda: 42, "step") == 42

    def broken() -> int:
        raise OSError("no such file")

    with pytest.raises(WorkloadError, match="step failed on 1/1 ranks:\n  node 0 .* rank 0: no such file"):
        common.agree_on(broken, "step failed", (OSError,))
    with pytest.raises(KeyError):  # not in ``catch``: an ordinary exception (a bug, not a bad input)
        common.agree_on(lambda: {}["x"], "step failed", (OSError,))


def test_votes_and_gathers(gloo_world: None) -> None:
    assert common.reduce_int(7, "max") == 7 and common.reduce_int(7, "sum") == 7
    assert common.gather_numbers([1.5, 2.0]) == [[1.5, 2.0]]
    assert common.gather_objects({"a": 1}) == [{"a": 1}]


def test_objects_cross_ranks_as_json_never_pickled(gloo_world: None) -> None:
    """A peer's bytes are parsed as JSON, never unpickled: what is not JSON cannot be sent at all."""
    assert common.gather_objects(("host", 3, [1.5, None], {"k": float("inf")})) == [
        ["host", 3, [1.5, None], {"k": float("inf")}]]  # a tuple comes back a list
    assert common.broadcast_object({"path": "/x", "token": "t"}) == {"path": "/x", "token": "t"}

    class Payload:  # what a pickle exploit sends: an object whose loading runs code
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("ran",))

    with pytest.raises(TypeError, match="not JSON serializable"):
        common.gather_objects(Payload())
    with pytest.raises(TypeError, match="mapping key 0 is not a string"):
        common.gather_objects({"per_node": {0: 1.0}})
