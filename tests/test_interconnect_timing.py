"""The timed calls of a sweep: NCCL's INFO log off, no capture open, the same bare call in every scope.

One process on gloo (HashStore) stands in for a 2-rank group; ``is_nccl`` is forced on so the sweep
takes its NCCL path (a capture around each size's checked call), with a fake NCCL debug init that
re-reads NCCL_DEBUG at its first log call after a reset, as libnccl does (src/debug.cc).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist

from workloads.interconnect import collectives, comm_groups, nccl_log


class FakeNccl:
    """Debug settings read at the first log call after a reset; lines counted only at INFO."""

    def __init__(self) -> None:
        self.level: str | None = None
        self.written = 0

    def reset(self) -> None:
        self.level = None

    def log(self) -> None:
        if self.level is None:
            self.level = os.environ.get("NCCL_DEBUG", "NONE").upper()
        self.written += self.level == "INFO"


class CountingCapture(nccl_log.Capture):
    open = 0

    def __enter__(self) -> CountingCapture:
        CountingCapture.open += 1
        return super().__enter__()  # type: ignore[return-value]

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        CountingCapture.open -= 1


def test_timed_calls_run_with_the_log_off_and_alike_in_both_scopes(gloo_world: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    nccl = FakeNccl()
    monkeypatch.setattr(nccl_log, "reset_function", lambda: (nccl.reset, "fake libnccl"))
    for var in nccl_log.DEBUG_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(comm_groups, "is_nccl", lambda: True)
    monkeypatch.setattr(comm_groups, "Capture", CountingCapture)
    monkeypatch.setattr(collectives, "mismatch", lambda *a: None)  # one process stands for two ranks
    real = collectives.time_batches  # latency sweeps time rounds of back-to-back calls
    seen: list[dict[str, Any]] = []

    def spy(fn: Any, device: torch.device, warmup: int, calls: int, rounds: int) -> list[float]:
        nccl.log()  # NCCL logs a TUNING line on every call: it must find INFO off
        seen.append({"scope": scope, "code": fn.__code__, "names": fn.__code__.co_names, "warmup": warmup,
                     "repeats": (calls, rounds), "open": CountingCapture.open,
                     "debug": os.environ.get("NCCL_DEBUG"), "level": nccl.level, "written": nccl.written})
        return real(fn, device, warmup, calls, rounds)

    monkeypatch.setattr(collectives, "time_batches", spy)
    for scope in ("node", "world"):
        comm = comm_groups.ScopeComm(scope=scope, nccl_algo="", group=dist.group.WORLD, members=(0, 1),
                                     label="test", all_members=[[0, 1]])
        cfg = collectives.Config.for_latency("quick", torch.device("cpu"), scope=scope)
        assert len(collectives._sweep(cfg, comm, torch.device("cpu"))) == len(collectives.LATENCY_SIZES)
    assert all(s["open"] == 0 and s["debug"] is None and s["level"] == "NONE" and s["written"] == 0 for s in seen)
    assert len(seen) == 2 * len(collectives.LATENCY_SIZES)
    # One bare call, nothing else per call (no allocation, no group lookup), the same in both scopes.
    assert {s["names"] for s in seen} == {("dist", "all_reduce")}
    assert len({(s["code"], s["warmup"], s["repeats"]) for s in seen}) == 1
