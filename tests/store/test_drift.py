"""Drift (clustergate.store.drift): a GPU's (by serial) or a node's figure that fell more than the profile's
drift_fraction below its own first accepted figure in a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_runs import node_results
from fleet_data import HOST, NODE_METRIC, SERIALS, figure, later, real_run

from clustergate.store import Store
from clustergate.store.drift import Drift, check_settings, drift, section

T1, T2, T3 = "2027-01-01T00:00:00+00:00", "2027-04-01T00:00:00+00:00", "2027-07-01T00:00:00+00:00"
MATMUL = "matmul_bf16_tflops"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """The node's handover run (T1) recorded."""
    s = Store(tmp_path / "fleet.db", timeout_s=5)
    s.record(later(real_run(), T1))
    return s


def test_a_planted_ten_percent_drop_on_one_gpu_is_flagged(store: Store) -> None:
    now = later(real_run(), T2, scale={(MATMUL, SERIALS[1]): 0.9})
    [d] = drift(now, store)
    first = figure(real_run(), MATMUL, SERIALS[1])
    assert (d.metric, d.scope, d.host, d.gpu_index, d.serial) == (MATMUL, "gpu", HOST, 1, SERIALS[1])
    assert (d.first, d.first_run, d.first_time, d.first_host) == (first, 1, T1, HOST)
    assert d.now == pytest.approx(0.9 * first) and d.fraction == pytest.approx(0.10)
    assert d.severity == "warn" and d.limit == 0.05  # the defaults: drift_fraction 0.05, drift_severity warn
    assert d.text() == (f"matmul_bf16_tflops={0.9 * first:.4g} TFLOPS, 10% below its first accepted {first:.4g} "
                        f"(run #1, {T1}), drift limit 5% [{HOST} gpu 1 serial {SERIALS[1]}]")
    assert drift(now, store, severity="fail")[0].severity == "fail"  # the cpu profile's criterion is severity fail
    assert drift(now, store, fraction=0.15) == []


def test_within_the_fraction_or_better_is_not_drift(store: Store) -> None:
    assert drift(later(real_run(), T2, scale={(MATMUL, SERIALS[0]): 0.96}), store) == []
    assert drift(later(real_run(), T2, scale={(MATMUL, SERIALS[0]): 1.5}), store) == []


def test_a_gpu_is_followed_by_its_serial(store: Store) -> None:
    # the cards swapped slots and the node was renamed; GPU 0's card, now index 1, reads 12% below slot 1's
    # old figure: it is held to its own first figure, not to the slot's
    now = later(real_run(), T2, host="gpu-node-31", swap_serials=True, scale={(MATMUL, SERIALS[0]): 0.88})
    [d] = drift(now, store)
    first = figure(real_run(), MATMUL, SERIALS[0])
    assert (d.serial, d.gpu_index, d.host, d.first_host) == (SERIALS[0], 1, "gpu-node-31", HOST)
    assert d.first == first and d.now == pytest.approx(0.88 * figure(real_run(), MATMUL, SERIALS[1]))
    assert d.fraction == pytest.approx(1 - d.now / first)
    assert f"(run #1, {T1}, on {HOST})" in d.text()


def test_a_node_figure_is_followed_by_its_host(store: Store) -> None:
    [d] = drift(later(real_run(), T2, scale={(NODE_METRIC, None): 0.8}), store)
    assert (d.metric, d.scope, d.host, d.gpu_index, d.serial) == (NODE_METRIC, "node", HOST, None, None)
    assert d.fraction == pytest.approx(0.2) and d.text().endswith(f"[node {HOST}]")


def test_the_first_accepted_figure_stands_not_the_last(store: Store) -> None:
    """Slow decline: each run 4% below the one before never drifts from its predecessor, but does from the
    handover figure. And a rejected run is never the figure others are held to."""
    store.record(later(real_run(), T2, scale={(MATMUL, SERIALS[0]): 0.96}))
    [d] = drift(later(real_run(), T3, scale={(MATMUL, SERIALS[0]): 0.96 * 0.96}), store)
    assert d.first_run == 1 and d.fraction == pytest.approx(1 - 0.96 * 0.96)


def test_a_rejected_run_is_no_baseline(tmp_path: Path) -> None:
    s = Store(tmp_path / "fleet.db")
    rejected = later(real_run(), T1, scale={("hbm_bandwidth_tbps", SERIALS[0]): 1e-4})  # below its minimum
    assert s.record(rejected).new and rejected["verdict"] == "reject"
    assert drift(later(real_run(), T2, scale={(MATMUL, SERIALS[1]): 0.5}), s) == []
    s.record(later(real_run(), T2))
    [d] = drift(later(real_run(), T3, scale={(MATMUL, SERIALS[1]): 0.5}), s)
    assert d.first_run == 2


def test_only_like_runs_and_earlier_runs_count(store: Store) -> None:
    assert drift(later(real_run(), T2, level="standard", scale={(MATMUL, SERIALS[0]): 0.5}), store) == []
    assert drift(later(real_run(), "2026-12-01T00:00:00+00:00", scale={(MATMUL, SERIALS[0]): 0.5}), store) == []


def test_figures_without_a_lasting_identity_or_a_floor_do_not_drift(tmp_path: Path) -> None:
    s = Store(tmp_path / "fleet.db")
    # an 8-GPU node under the h100 profile: latencies (lower is better) rise 50%, a GPU's pair bandwidth drops
    # 10%, its criterion made a warn one (a site's): its drift warns, whatever drift_severity says
    first = node_results("n1", 1)
    s.record(first)
    now = node_results("n1", 1, {("intranode_allreduce_latency_us", None): 1.5, ("intranode_pair_bw_gbps", 2): 0.9})
    now["started"] = T2
    for m in (m for t in now["tests"] for m in t["metrics"] if m["name"] == "intranode_pair_bw_gbps"):
        m["criterion"]["severity"] = "warn"
    found = drift(now, s, severity="fail")
    assert [(d.metric, d.gpu_index, d.severity) for d in found] == [("intranode_pair_bw_gbps", 2, "warn")]
    # a CPU rank's figures carry no serial: no GPU of its own to follow
    s.record(later(real_run(), T1))
    cpu = later(real_run(), T2, scale={(MATMUL, SERIALS[0]): 0.5})
    assert [d.serial for d in drift(cpu, s)] == [SERIALS[0]]
    for test in cpu["tests"]:
        for m in test["metrics"]:
            for p in m["per_rank"]:
                p["gpu_serial"] = None
    assert drift(cpu, s) == []


def test_settings_are_checked() -> None:
    for fraction, severity, said in ((0, "warn", "drift_fraction must lie in (0, 1), got 0"),
                                     (1.5, "warn", "drift_fraction must lie in (0, 1), got 1.5"),
                                     (True, "warn", "got True"),
                                     (0.05, "error", "drift_severity must be fail or warn")):
        with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
            check_settings(fraction, severity)


def test_the_results_section(store: Store) -> None:
    found = drift(later(real_run(), T2, scale={(MATMUL, SERIALS[1]): 0.9}), store)
    out = section(found, 0.05, "warn", str(store.path))
    assert out["store"] == str(store.path) and out["fraction"] == 0.05 and out["severity"] == "warn"
    assert out["findings"] == [d.as_json() for d in found]
    assert set(out["findings"][0]) == {*Drift.__slots__, "where", "criterion"} and out["problem"] is None


def test_a_run_with_a_store_judges_drift_into_the_verdict_every_rank_applies(store: Store, tmp_path: Path) -> None:
    """The run's side (clustergate.run.store_session, on rank 0): the first figures read once, then each call
    phase's verdict judged; drift_severity fail fails the test, naming the rank of the drifted GPU."""
    from clustergate.criteria.thresholds import load, shipped_thresholds
    from clustergate.record.judge import Judged
    from clustergate.record.outcomes import PhaseVerdict
    from clustergate.run.store_session import Memory
    from clustergate.store import store_problem as problem

    profile = load(shipped_thresholds()).profile("cpu")
    now = later(real_run(), T2, scale={(MATMUL, SERIALS[1]): 0.9})
    identities = [{"host": n["host"], "gpu": {"serial": g["serial"]}} for n in now["nodes"] for g in n["gpus"]]
    [test] = [t for t in now["tests"] if any(m["name"] == MATMUL for m in t["metrics"])]
    metrics = [Judged(**{k: v for k, v in m.items() if k != "warned"}) for m in test["metrics"]]
    passed = PhaseVerdict("passed", "", [], metrics)

    memory = Memory(store.path, severity="fail")
    assert memory.read(profile, identities, level="quick", started=T2, timeout_s=5) is None
    judged = memory.judge(test["nodeid"], passed, now["nodes"])
    assert judged.outcome == "failed" and judged.failed_ranks == [1]
    assert judged.problems == [f"drift: {d.text()}" for d in drift(now, store, severity="fail")]
    assert judged.message.startswith(judged.problems[0])
    assert [d["severity"] for d in memory.section()["findings"]] == ["fail"]
    assert Memory(store.path).judge(test["nodeid"], passed, now["nodes"]) is passed  # not read: nothing judged

    (tmp_path / "not-a-store").write_text("a text file\n")
    broken = Memory(tmp_path / "not-a-store")
    said = broken.read(profile, identities, level="quick", started=T2, timeout_s=5)
    assert said is not None and said.startswith("drift not judged: ") and "not-a-store" in said
    assert broken.judge(test["nodeid"], passed, now["nodes"]) is passed and broken.section()["problem"] == said
    # only a path that can never be a store stops the run at its start (a usage error, exit 2)
    assert problem(None) is None and problem(store.path) is None and problem(tmp_path / "new.db") is None
    assert str(problem(tmp_path / "no-such-dir" / "fleet.db")).startswith("--store (or CLUSTERGATE_STORE): ")
