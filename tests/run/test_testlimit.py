"""A test's time limit (clustergate.run.testlimit): a multiple of its healthy time with a floor, the explicit limits
over it, the level's where nothing was measured, the site's store refining the reference; the healthy readings
(clustergate.run.durations) from finished runs, the shipped reference file and a real store."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from fleet_data import later, real_run

from clustergate.run import durations
from clustergate.run.durations import DurationsError, Healthy, Key, Shape, readings, reference, site
from clustergate.run.limits import LIMIT_FLOOR_S, LIMIT_MULTIPLE, SITE_READINGS_TO_SET, SITE_RUNS, TEST_LIMIT_S
from clustergate.run.store_session import Memory
from clustergate.run.testlimit import SOURCES, choose, measured_limit, refine
from clustergate.store import Store
from clustergate.trust.manifest import shipped

KEY = Key("cpu", "quick", Shape(1, 2))
REF = Healthy(5.0, 2, "reference: 2 runs on vm")


def store_readings(seconds: float, n: int) -> Healthy:
    return Healthy(seconds, n, f"store: {n} accepted runs")


def limit(**given: Any):  # noqa: ANN201
    args = {"key": KEY, "marker_s": None, "option_s": None, "profile_s": None, "reference": None, "site": None}
    return choose(**{**args, **given})


# ---- the rule ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("healthy", "expected"), [
    (0.01, LIMIT_FLOOR_S), (5.0, LIMIT_FLOOR_S), (LIMIT_FLOOR_S / LIMIT_MULTIPLE, LIMIT_FLOOR_S),
    (30.0, 30.0 * LIMIT_MULTIPLE), (400.0, 400.0 * LIMIT_MULTIPLE)])
def test_a_measured_limit_is_a_multiple_of_the_healthy_time_with_a_floor(healthy: float, expected: float) -> None:
    assert measured_limit(healthy) == pytest.approx(expected)
    said = limit(reference=Healthy(healthy, 2, "reference: 2 runs on vm"))
    assert (said.seconds, said.source, said.healthy_s) == (pytest.approx(expected), "reference", healthy)
    assert said.describe().startswith(f"{said.seconds:g} s: {LIMIT_MULTIPLE:g} x its healthy {healthy:g} s, at least")


def test_the_floor_and_multiple_never_cut_a_healthy_reading_nor_a_cost_the_readings_miss() -> None:
    """Every healthy time gets at least LIMIT_MULTIPLE x itself, and room for a one-off cost of 40 s the readings did
    not include (a compile from an empty cache: 32 s for the whole GPT model on 2 H200s)."""
    for tenths in range(1, 3000):
        t = tenths / 10
        assert measured_limit(t) >= LIMIT_MULTIPLE * t - 0.05 and measured_limit(t) >= t + 40.0
    assert LIMIT_FLOOR_S < TEST_LIMIT_S["quick"] < TEST_LIMIT_S["standard"] < TEST_LIMIT_S["extended"]


@pytest.mark.parametrize(("given", "source", "seconds"), [
    ({"marker_s": 3600.0, "option_s": 30.0, "profile_s": 300.0, "reference": REF, "site": REF}, "marker", 3600.0),
    ({"option_s": 30.0, "profile_s": 300.0, "reference": REF, "site": REF}, "option", 30.0),
    ({"profile_s": 300, "reference": REF, "site": store_readings(9.0, 5)}, "profile", 300.0),
    ({"reference": REF, "site": store_readings(30.0, 5)}, "store", 90.0),
    ({"reference": REF}, "reference", LIMIT_FLOOR_S),
    ({}, "level", TEST_LIMIT_S["quick"]),
])
def test_which_source_wins(given: dict[str, Any], source: str, seconds: float) -> None:
    """The test's own marker, then --test-timeout, then the profile's test_timeout_s stand (today's order); else its
    measured time (the store's over the reference's); else the level's limit."""
    said = limit(**given)
    assert (said.source, said.seconds) == (source, seconds) and said.source in SOURCES
    assert said.as_json()["source"] == source and said.as_json()["seconds"] == seconds
    if source in ("marker", "option", "profile"):
        assert said.healthy_s is None
        assert said.describe() == {"marker": f"{seconds:g} s: @pytest.mark.time_limit",
                                   "option": f"{seconds:g} s: --test-timeout",
                                   "profile": f"{seconds:g} s: the profile's test_timeout_s"}[source]


@pytest.mark.parametrize("level", ["quick", "standard", "extended"])
def test_a_test_without_a_measured_time_gets_the_level_s_limit_saying_so(level: str) -> None:
    key = Key("h200", level, Shape(1, 8))
    said = limit(key=key)
    assert (said.seconds, said.source, said.healthy_s) == (TEST_LIMIT_S[level], "level", None)
    assert said.measured == f"no measured time for profile h200, level {level}, 1 node x 8 ranks"
    assert said.describe() == f"{TEST_LIMIT_S[level]:g} s: the level's limit ({said.measured})"
    # too few of the site's readings measure nothing alone, and say how many it holds
    few = limit(key=key, site=store_readings(3.0, SITE_READINGS_TO_SET - 1))
    assert few.source == "level" and f"the store holds {SITE_READINGS_TO_SET - 1} of {SITE_READINGS_TO_SET}" in \
        few.measured


def test_the_store_refines_the_reference() -> None:
    # enough of the site's readings set the healthy time, lower (a faster site tightens, never below the floor) ...
    faster, source = refine(REF, store_readings(2.0, SITE_READINGS_TO_SET))
    assert (faster.seconds, source) == (2.0, "store")
    tight = limit(reference=Healthy(40.0, 2, "reference"), site=store_readings(25.0, SITE_READINGS_TO_SET))
    assert (tight.seconds, tight.source) == (75.0, "store")
    assert limit(reference=Healthy(40.0, 2, "reference"), site=store_readings(1.0, 10)).seconds == LIMIT_FLOOR_S
    # ... or higher
    assert refine(REF, store_readings(9.0, SITE_READINGS_TO_SET)) == (store_readings(9.0, SITE_READINGS_TO_SET),
                                                                      "store")
    # fewer only raise it: one fast run may have been a lucky one, one slow healthy run must not be cut next time
    assert refine(REF, store_readings(2.0, 1)) == (REF, "reference")
    slower, source = refine(REF, store_readings(40.0, 1))
    assert (slower.seconds, slower.readings, source) == (40.0, 1, "store")
    assert slower.where == "store: 1 accepted runs; above the reference: 2 runs on vm"
    # with no reference, too few set nothing; enough set it
    assert refine(None, store_readings(2.0, SITE_READINGS_TO_SET - 1)) == (None, "level")
    assert refine(None, store_readings(2.0, SITE_READINGS_TO_SET))[1] == "store"
    assert refine(None, None) == (None, "level")


# ---- the readings -------------------------------------------------------------------------------------------------

def with_durations(run: dict[str, Any], seconds: dict[str, float], outcomes: dict[str, str] | None = None
                   ) -> dict[str, Any]:
    out = copy.deepcopy(run)
    for test in out["tests"]:
        test["duration_s"] = seconds.get(test["nodeid"], test["duration_s"])
        test["outcome"] = (outcomes or {}).get(test["nodeid"], test["outcome"])
    return out


HBM = "acceptance/test_gpu_compute.py::test_hbm_bandwidth"
MATMUL = "acceptance/test_gpu_compute.py::test_matmul_tflops[bf16]"


def test_a_reading_is_a_passed_test_s_duration_in_a_finished_run() -> None:
    run = real_run()
    seen = readings(run)
    passed = [t for t in run["tests"] if t["outcome"] == "passed"]
    assert seen == {t["nodeid"]: t["duration_s"] for t in passed} and len(seen) > 10
    assert not any(t["nodeid"] in seen for t in run["tests"] if t["outcome"] == "skipped")
    assert HBM not in readings(with_durations(run, {}, {HBM: "failed"}))  # cut short or held up: not healthy
    setup_only = copy.deepcopy(run)
    next(t for t in setup_only["tests"] if t["nodeid"] == HBM)["phases"] = ["setup", "teardown"]
    assert HBM not in readings(setup_only)  # its body never ran
    assert readings({**run, "verdict": "running"}) == {}  # under way, or killed


def test_the_site_s_healthy_time_is_the_slowest_of_its_newest_accepted_runs_of_the_same_key(tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db", timeout_s=5)
    base = real_run()
    assert (base["profile"], base["level"], Shape.of_results(base)) == ("cpu", "quick", Shape(1, 2))
    for day, hbm in ((1, 1.5), (2, 4.0), (3, 2.5)):
        store.record(with_durations(later(base, f"2027-01-0{day}T00:00:00+00:00"), {HBM: hbm}))
    # none of these count: not accepted, another level, another shape
    rejected = with_durations(later(base, "2027-01-04T00:00:00+00:00"), {HBM: 99.0})
    rejected["verdict"], rejected["error"] = "reject", "planted"
    store.record(rejected)
    store.record(with_durations(later(base, "2027-01-05T00:00:00+00:00", level="standard"), {HBM: 98.0}))
    three = with_durations(later(base, "2027-01-06T00:00:00+00:00"), {HBM: 97.0})
    three["world_size"] = 3
    store.record(three)
    found = site(store, KEY, SITE_RUNS)
    assert found[HBM] == Healthy(4.0, 3, "store: 3 accepted runs to 2027-01-03")
    assert found[MATMUL].readings == 3
    # the newest runs only
    newest = site(store, KEY, 2)
    assert (newest[HBM].seconds, newest[HBM].readings) == (4.0, 2)
    assert site(store, KEY, 1)[HBM].seconds == 2.5
    assert site(store, Key("cpu", "quick", Shape(2, 1)), SITE_RUNS) == {}
    assert site(store, Key("h200", "quick", Shape(1, 2)), SITE_RUNS) == {}
    # and the rule on top: three readings set the test's limit from the store
    said = limit(reference=Healthy(0.9, 2, "reference"), site=found[HBM])
    assert (said.source, said.healthy_s, said.seconds) == ("store", 4.0, LIMIT_FLOOR_S)


def test_a_store_that_cannot_be_read_leaves_the_reference_alone_and_says_so(tmp_path: Path) -> None:
    memory = Memory(tmp_path / "absent" / "fleet.db")
    said = memory.read_durations(KEY, timeout_s=1.0)
    assert said is not None and said.startswith("test limits from the reference alone: the store's durations could "
                                                "not be read: ") and "does not exist" in said
    assert memory.durations == {}


# ---- the reference file -------------------------------------------------------------------------------------------

def test_the_shipped_reference_measures_the_cpu_profile_s_suite_at_quick_and_standard() -> None:
    for level in ("quick", "standard"):
        for shape in (Shape(1, 1), Shape(1, 2)):
            known = reference(Key("cpu", level, shape))
            ran = [t.nodeid for t in shipped().tests if t.run == "node" and level not in t.skipped_by_design
                   and not t.nodeid.startswith(("acceptance/test_gpu_inventory", "acceptance/test_dcgm"))]
            assert known, (level, shape)
            assert set(known) <= {t.nodeid for t in shipped().tests}
            assert "acceptance/test_training.py::test_gpt_throughput" in known and set(known) <= set(ran)
            assert all(h.where.startswith("reference: ") for h in known.values()), (level, shape)
            assert sum(h.readings >= 2 for h in known.values()) >= len(known) - 1, (level, shape)
    assert reference(Key("cpu", "quick", Shape(1, 3))) == {}
    assert reference(Key("nvidia-generic", "quick", Shape(1, 2))) == {}


def test_the_reference_file_is_written_from_finished_runs(tmp_path: Path) -> None:
    file = tmp_path / "durations.json"
    a = with_durations(later(real_run(), "2027-01-01T00:00:00+00:00"), {HBM: 1.0})
    b = with_durations(later(real_run(), "2027-01-02T00:00:00+00:00"), {HBM: 3.0, MATMUL: 0.5})
    paths = []
    for name, run in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(run))
        paths.append(str(tmp_path / name))
    assert durations.main([*paths, "--machine", "a test", "--file", str(file)]) == 0
    durations._load.cache_clear()
    known = reference(KEY, file)
    assert known[HBM] == Healthy(3.0, 2, "reference: 2 runs on " + a["nodes"][0]["host"] +
                                 " (a test), 2027-01-01 to 2027-01-02")
    group = json.loads(file.read_text())["profiles"]["cpu"]["quick"]["1x2"]
    assert set(group["runs"]) == {"r1", "r2"} and group["runs"]["r1"]["started"] == a["started"]
    assert group["tests"][HBM] == {"r1": 1.0, "r2": 3.0}
    # a new measurement of a group replaces it; --keep adds to it
    c = with_durations(later(real_run(), "2027-01-03T00:00:00+00:00"), {HBM: 2.0})
    (tmp_path / "c.json").write_text(json.dumps(c))
    assert durations.main([str(tmp_path / "c.json"), "--file", str(file)]) == 0
    durations._load.cache_clear()
    assert reference(KEY, file)[HBM] == Healthy(2.0, 1, "reference: 1 run on " + c["nodes"][0]["host"] +
                                                ", 2027-01-03")
    assert durations.main([*paths, "--keep", "--file", str(file)]) == 0
    durations._load.cache_clear()
    assert reference(KEY, file)[HBM].readings == 3
    assert file.read_text() == durations.dumps(json.loads(file.read_text()))


def test_a_run_with_no_healthy_reading_or_a_bad_reference_file_is_one_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    running = {**real_run(), "verdict": "running"}
    (tmp_path / "running.json").write_text(json.dumps(running))
    assert durations.main([str(tmp_path / "running.json"), "--file", str(tmp_path / "d.json")]) == 2
    assert "running.json: no test passed in this run (verdict 'running')" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    for content, said in (("{", "not JSON"), ('{"schema": 2, "profiles": {}}', "top level"),
                          ('{"schema": 1, "profiles": {"cpu": {"quick": {"1y2": {}}}}}', "profiles.cpu.quick.1y2"),
                          ('{"schema": 1, "profiles": {"cpu": {"quick": {"1x2": {"runs": {}, "tests": '
                           '{"t::x": {"r9": 1.0}}}}}}}', "tests.t::x: must map runs of the group")):
        bad.write_text(content)
        durations._load.cache_clear()
        with pytest.raises(DurationsError, match=f"{bad}: .*{said}"):
            reference(KEY, bad)
    durations._load.cache_clear()
