"""The timed calls of a sweep: NCCL's INFO log off, no capture open, the same bare call in every scope.

One process on gloo (HashStore) stands in for a 2-rank group; ``is_nccl`` is forced on so the sweep
takes its NCCL path (a capture around each size's checked call), with a fake NCCL debug init that
re-reads NCCL_DEBUG at its first log call after a reset, as libnccl does (src/debug.cc).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from workloads.interconnect import collectives, comm_groups, latency, nccl_log


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
    real = latency.time_rounds  # latency sweeps time rounds of back-to-back calls
    seen: list[dict[str, Any]] = []

    def spy(fn: Any, device: torch.device, warmup: int, calls: int, rounds: int,
            agree: Any) -> dict[str, list[float]]:
        nccl.log()  # NCCL logs a TUNING line on every call: it must find INFO off
        seen.append({"scope": scope, "code": fn.__code__, "names": fn.__code__.co_names, "warmup": warmup,
                     "repeats": (calls, rounds), "open": CountingCapture.open,
                     "debug": os.environ.get("NCCL_DEBUG"), "level": nccl.level, "written": nccl.written})
        return real(fn, device, warmup, calls, rounds, warmup_s=0.0, agree=agree)

    monkeypatch.setattr(latency, "time_rounds", spy)
    for scope in ("node", "world"):
        comm = comm_groups.ScopeComm(scope=scope, nccl_algo="", group=dist.group.WORLD, members=(0, 1),
                                     label="test", all_members=[[0, 1]])
        cfg = collectives.Config.for_latency("quick", torch.device("cpu"), scope=scope)
        assert len(collectives._sweep(cfg, comm, torch.device("cpu"))) == len(collectives.LATENCY_SIZES)
    assert all(s["open"] == 0 and s["debug"] is None and s["level"] == "NONE" and s["written"] == 0 for s in seen)
    assert len(seen) == 2 * len(collectives.LATENCY_SIZES)
    # One bare launch, nothing else per call (no allocation, no group lookup, no wait), the same in both scopes.
    assert {s["names"] for s in seen} == {("dist", "all_reduce")}
    assert len({(s["code"], s["warmup"], s["repeats"]) for s in seen}) == 1


def test_latency_rounds_launch_back_to_back_wait_once_and_warm_up_for_a_time() -> None:
    """nccl-tests' timing: no wait between the launches of a round, one at its end; the warm-up lasts
    at least its seconds whatever its count (an idle GPU's clocks, NCCL's lazy connections)."""
    events: list[str] = []

    class Work:
        def wait(self) -> None:
            events.append("wait")

    def issue() -> Work:
        events.append("launch")
        time.sleep(0.02)
        return Work()

    asked: list[int] = []
    given: list[int] = []

    def agree(n: int) -> int:  # the largest count of any rank: a slower peer wants 7 calls at its first ask
        asked.append(n)
        given.append(max(n, 7) if len(asked) == 1 else n)
        return given[-1]

    t0 = time.monotonic()
    times = latency.time_rounds(issue, torch.device("cpu"), warmup=2, calls=5, rounds=3, warmup_s=0.1, agree=agree)
    assert time.monotonic() - t0 >= 0.1  # the seconds are kept whatever the pace (a busy host included)
    timed = events[-18:]  # 3 rounds of 5 launches and one wait
    assert timed == (["launch"] * 5 + ["wait"]) * 3
    warm = events[:-18]
    assert warm == ["launch", "wait"] * (len(warm) // 2)  # warm-up calls complete one by one
    # 2 first, then each agreed batch (the peer's 7 honoured); it stops when every rank agrees on none
    assert len(warm) // 2 == 2 + sum(given) and given[0] >= 7 and given[-1] == 0
    # Per call, not per round of 5 (>= 0.1 s): 80 ms a call of slack for a busy scheduler.
    assert len(times["host"]) == 3 and all(0.02 <= t < 0.1 for t in times["host"])
    assert latency.summary_us(times)["host_us"] >= 20_000
