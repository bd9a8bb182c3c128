"""End to end under torchrun on CPU ranks, under a GPU profile's collective timeout (300 s) and no test limit given:
every rank stuck alike in a test that takes seconds when healthy is ended by that test's limit from its measured time,
not by the level's (600 s at standard, 120 s at quick): within 90 s of the point where the test overran it, naming
the test and the ranks, never accepted, and no process of the job is left. The measured time is the shipped
reference's (clustergate/durations.json), or the site's store's where it holds enough accepted runs: rank 0 reads
it, and every rank ends at the same limit. The jobs wait out their limits beside the suite's other such jobs
(tests/helpers/waited_out_runs.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from report_runs import schema_errors
from waited_out_runs import MEASURED_CASES, SITE_HEALTHY_S, ended, measured_case, waited_out  # noqa: F401

from clustergate.run.limits import LIMIT_FLOOR_S, SITE_READINGS_TO_SET, TEST_LIMIT_S
from tests.faults.plugin_stuck_alike import STUCK

ENDS_WITHIN_S = 90.0
"""From the point the test overran its limit to the end of the job: the watchdog fires at the limit, the run records
its ending and every rank leaves (torchrun stops the rest)."""
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("source", "level"), MEASURED_CASES)
def test_every_rank_stuck_alike_ends_at_the_test_s_measured_limit(waited_out: dict[str, Any],  # noqa: F811
                                                                  request: pytest.FixtureRequest, source: str,
                                                                  level: str) -> None:
    healthy, limit = measured_case(source, level)
    assert limit < TEST_LIMIT_S[level] and (source == "reference" or limit > LIMIT_FLOOR_S)
    assert source == "reference" or len(SITE_HEALTHY_S) == SITE_READINGS_TO_SET
    r, seen = ended(waited_out, request)
    took = seen["took"]
    print(f"\nmeasured: every rank stuck alike in {STUCK}: ended {took:.1f} s after the test started "
          f"(its limit {limit:g} s: {took - limit:.1f} s past it)")
    assert seen["left"] == [], f"processes of the job left after its end: {seen['left']}\n{r.output}"
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
