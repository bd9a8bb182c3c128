"""End to end under torchrun on CPU ranks, under a GPU profile's collective timeout (300 s) and no test limit given:
every rank stuck alike in a test that takes seconds when healthy is ended by that test's limit from its measured time,
not by the level's (600 s at standard, 120 s at quick): within 90 s of the point where the test overran it, naming
the test and the ranks, never accepted, and no process of the job is left. The measured time is the shipped
reference's (clustergate/durations.json), or the site's store's where it holds enough accepted runs: rank 0 reads
it, and every rank ends at the same limit."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from fleet_data import later, real_run
from report_runs import schema_errors
from waited_out_runs import alive

from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.run.durations import Healthy, Key, Shape, reference
from clustergate.run.limits import LIMIT_FLOOR_S, SITE_READINGS_TO_SET, TEST_LIMIT_S
from clustergate.run.testlimit import measured_limit
from clustergate.store import Store
from tests.faults.plugin_stuck_alike import STUCK

from torchrun_job import ROOT, job_processes, start_job, wait_for

ENDS_WITHIN_S = 90.0
"""From the point the test overran its limit to the end of the job: the watchdog fires at the limit, the run records
its ending and every rank leaves (torchrun stops the rest)."""
pytestmark = pytest.mark.slow


SITE_HEALTHY_S = (22.0, 20.5, 21.0)
"""The stuck test's durations in the site's three accepted runs: its limit 66 s, above the reference's 60 s."""


def site_store(path: Path) -> Path:
    """A store holding SITE_READINGS_TO_SET accepted runs of the cpu profile at quick on 1 node x 2 ranks, the stuck
    test slower in each than in the reference runs."""
    store = Store(path, timeout_s=5)
    for day, seconds in enumerate(SITE_HEALTHY_S, start=1):
        run = later(real_run(), f"2027-01-0{day}T00:00:00+00:00")
        next(t for t in run["tests"] if t["nodeid"] == STUCK)["duration_s"] = seconds
        store.record(run)
    return path


@pytest.mark.parametrize(("source", "level"), [("reference", "standard"), ("store", "quick")])
def test_every_rank_stuck_alike_ends_at_the_test_s_measured_limit(tmp_path: Path, source: str, level: str) -> None:
    healthy = reference(Key("cpu", level, Shape(1, 2)))[STUCK]
    store: list[str] = []
    if source == "store":
        assert len(SITE_HEALTHY_S) == SITE_READINGS_TO_SET
        store = ["--store", str(site_store(tmp_path / "fleet.db"))]
        healthy = Healthy(max(SITE_HEALTHY_S), len(SITE_HEALTHY_S), "store: 3 accepted runs to 2027-01-03")
    limit = measured_limit(healthy.seconds)
    assert limit < TEST_LIMIT_S[level] and (source == "reference" or limit > LIMIT_FLOOR_S)
    collective = load(shipped_thresholds()).profile("h100-sxm-80gb").settings["collective_timeout_s"]
    assert collective == 300
    job = start_job(ROOT, [STUCK, "--level", level, "--collective-timeout", str(collective), *store,
                           "-p", "tests.faults.plugin_stuck_alike"], report_dir=tmp_path / "report",
                    timeout=limit + ENDS_WITHIN_S + 150)  # a hang guard: start-up on 2 busy cores, and the ending
    wait_for(tmp_path / "stuck-0")
    wait_for(tmp_path / "stuck-1")
    time.sleep(0.5)
    tree = job_processes(job)
    try:
        r = job.wait()
        ended = time.time()
    finally:
        time.sleep(1.0)  # a keeper goes with its rank (the parent-death signal); allow the kernel a beat
        left = [pid for pid in tree if alive(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    events = [json.loads(line) for line in (r.report_dir / "progress.jsonl").read_text().splitlines()]
    started = next(e["time"] for e in events if e["event"] == "test_start" and e["nodeid"] == STUCK)
    took = ended - started
    print(f"\nmeasured: every rank stuck alike in {STUCK}: ended {took:.1f} s after the test started "
          f"(its limit {limit:g} s: {took - limit:.1f} s past it)")
    assert left == [], f"processes of the job left after its end: {left}\n{r.output}"
    assert took <= limit + ENDS_WITHIN_S, r.output
    assert all(code not in (0, None) for code in r.codes), (r.codes, r.output)
    res = r.results
    assert schema_errors(res) == [], res
    assert res["verdict"] == "reject", res
    test = next(t for t in res["tests"] if t["nodeid"] == STUCK)
    assert test["limit"] == {"seconds": limit, "source": source, "healthy_s": healthy.seconds,
                             "measured": healthy.where}
    assert test["outcome"] == "failed" and test["failed_ranks"] == [0, 1], test
    assert res["error"].startswith(f"{STUCK} did not finish within {limit:.0f} s"), res["error"]
    assert res["error_ranks"] == [0, 1], res
    # every rank ended at the same limit (the store's reading reached them all from rank 0)
    assert set(re.findall(r"did not finish within (\d+) s", res["error"])) == {f"{limit:.0f}"}, res["error"]
