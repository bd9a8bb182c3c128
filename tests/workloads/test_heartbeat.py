"""Progress lines from long work (workloads.heartbeat): at most one per interval, on rank 0, saying what, how
far and how long is left; and the long workloads that use it (sustained matmul, the memory test).

The interval is a parameter: these tests use a fraction of a second. The one elapsed-time assertion checks
the helper's own timer (no two lines closer than the interval), with a generous upper bound for busy cores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from forked_pytest import runpytest_forked

from workloads import heartbeat
from workloads.gpu import burn_in, memtest

from torchrun_job import job_env


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[float, str]]]:
    monkeypatch.setenv("RANK", "0")
    seen: list[tuple[float, str]] = []
    heartbeat.set_sink(lambda line: seen.append((time.monotonic(), line)))
    yield seen
    heartbeat.set_sink(None)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_interval_with_what_how_far_and_time_left(lines: list[tuple[float, str]]) -> None:
    clock = Clock()
    beat = heartbeat.Heartbeat("memory test on cuda:3", total=35, unit="passes", interval_s=30, clock=clock)
    printed = []
    for second in range(1, 101):  # a call every second for 100 s
        clock.now += 1
        printed.append(beat(second * 35 / 100, note="0 bad words so far"))
    assert [i + 1 for i, p in enumerate(printed) if p] == [30, 60, 90]
    assert [line for _, line in lines] == [
        "heartbeat: memory test on cuda:3: 10.5/35 passes (30%), 30s elapsed, about 1m10s left; 0 bad words so far",
        "heartbeat: memory test on cuda:3: 21/35 passes (60%), 1m00s elapsed, about 40s left; 0 bad words so far",
        "heartbeat: memory test on cuda:3: 31.5/35 passes (90%), 1m30s elapsed, about 10s left; 0 bad words so far"]


def test_a_known_deadline_and_no_total() -> None:
    clock = Clock()
    beat = heartbeat.Heartbeat("dcgmi diag -r 3", interval_s=30, enabled=True, clock=clock)
    clock.now += 4000
    assert beat.line(0, left_s=600) == "heartbeat: dcgmi diag -r 3: 0, 1h06m40s elapsed, about 10m00s left"
    assert heartbeat.duration(59.6) == "1m00s" and heartbeat.duration(-3) == "0s"
    with pytest.raises(ValueError, match="interval_s"):
        heartbeat.Heartbeat("x", interval_s=0)


def test_other_ranks_stay_quiet(lines: list[tuple[float, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    clock = Clock()
    beat = heartbeat.Heartbeat("burn-in", total=10, interval_s=1, clock=clock)
    clock.now += 5
    assert not beat(5) and lines == []


def test_cadence_in_real_time(lines: list[tuple[float, str]]) -> None:
    interval = 0.2
    beat = heartbeat.Heartbeat("work", total=1.0, unit="s", interval_s=interval)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.1:
        beat(round(time.monotonic() - t0, 1))
        time.sleep(0.005)
    times = [beat.t0] + [t for t, _ in lines]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert 2 <= len(lines) <= 5, lines  # 5 when every beat came on time; fewer only on a stalled machine
    # Never more often than the interval. A line's time is read when the sink gets it, after the beat read its own
    # clock: a line that reached the sink late shortens the next gap by that delay (CI saw 0.19999 s), so a
    # millisecond of slack; a beat twice an interval would still show a gap of about half of it.
    assert all(g >= interval - 0.001 for g in gaps), gaps


def test_sustained_matmul_beats_while_it_holds(lines: list[tuple[float, str]]) -> None:
    t0 = time.monotonic()
    burn_in.run(burn_in.Config(duration_s=1.0, shape=(64, 64, 64), interval_s=0.1, outputs=2, heartbeat_s=0.2))
    seconds = time.monotonic() - t0
    said = [line for _, line in lines]
    # a check after each window (~0.1 s, longer on busy cores): the last one ends past 1 s, so at least one
    # line; never more than one per 0.2 s
    assert 1 <= len(said) <= seconds / 0.2, said
    assert all(line.startswith("heartbeat: sustained bf16 matmul on cpu: ") and "s left; " in line
               and " wrong elements" in line for line in said), said


def test_memory_test_beats_between_passes(lines: list[tuple[float, str]]) -> None:
    memtest.run(memtest.Config(total_bytes=4 << 20, chunk_bytes=1 << 20, heartbeat_s=1e-6))
    said = [line for _, line in lines]
    assert len(said) == 35 and said[1].startswith("heartbeat: memory test on cpu: 1/35 passes (3%)"), said[:2]


def test_under_the_acceptance_suite_lines_reach_the_terminal_past_capture(pytester: pytest.Pytester,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """acceptance/conftest.py hands pytest's terminal to the heartbeat: a passing test's output is captured
    and never shown, its heartbeat lines are shown as they come."""
    for key, value in job_env().items():
        monkeypatch.setenv(key, value)
    pytester.makeconftest("from acceptance.conftest import pytest_sessionstart, pytest_unconfigure  # noqa: F401\n")
    pytester.makepyfile(test_long="""
import os, time
from workloads import heartbeat

def test_long():
    os.environ["RANK"] = "0"
    print("captured, never shown")
    beat = heartbeat.Heartbeat("long work", total=3, unit="steps", interval_s=0.05)
    for k in range(3):
        time.sleep(0.06)
        beat(k + 1)
""")
    result = runpytest_forked(pytester, "-p", "no:clustergate", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["heartbeat: long work: 1/3 steps (33%), * elapsed, about * left",
                                 "heartbeat: long work: 3/3 steps (100%)*"])
    assert "captured, never shown" not in result.stdout.str()
