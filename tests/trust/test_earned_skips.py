"""A skip must be earned: it records its fact as data, the manifest allows that fact for the test under the run's
profile kind and level, and the record (and, in a merge, the fleet) bears it out. A failed test relabelled skipped,
a fabric run whose measured tests are relabelled skipped, a run relabelled to a level it did not run at: partial,
never merged or signed off. On copies of the one real complete run (tests/helpers/trust_runs.py) and crafted runs made
by the same rule (tests/helpers/complete_runs.py)."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cluster_runs import fabric_results, node_results, write_fabric, write_node
from complete_runs import RAN, attest, measured
from trust_runs import as_node, node_run, recorded  # noqa: F401  (node_run: the fixture)

from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.record.verdict import of_record
from clustergate.trust import manifest, skip_facts
from clustergate.trust.completeness import fleet_problems, partial
from clustergate.trust.manifest import ManifestError, parse

from torchrun_job import ROOT, clustergate_args, job_env

RUN = "run-0412"


def _test(results: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in results["tests"] if t["nodeid"].endswith(name))


def relabel_skipped(test: dict[str, Any], fact: dict[str, Any] | None, message: str = "not supported here") -> None:
    """What an editor does to a test that ran (failed or passed): skipped, its figures and failures gone."""
    test.update(outcome="skipped", metrics=[], failed_ranks=[], problems=[], message=message,
                phases=["setup", "teardown"], details={}, skip_fact=fact)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # A hang guard only: each command reads a few files and draws one page.
    return subprocess.run(clustergate_args(*args), cwd=ROOT, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)


def merged(run: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = cli("merge", *sorted(str(p) for p in (run / "nodes").iterdir()), "-o", str(run), *extra)
    assert "Traceback" not in proc.stdout and proc.returncode in (0, 1), proc.stdout
    return proc, json.loads((run / "results.json").read_text())


def reasons(cluster: dict[str, Any], host: str) -> str:
    return "; ".join(next(n["reasons"] for n in cluster["nodes"] if n["host"] == host))


# ---- the rule in the record ------------------------------------------------------------------------------------

@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_every_skip_of_the_real_run_records_its_fact(node_run: Path) -> None:  # noqa: F811
    """README's command 1 on CPU: each skip names the fact it rests on, as data, and every one is earned."""
    results = recorded(node_run)
    skipped = {t["nodeid"].split("::")[1]: t.get("skip_fact") for t in results["tests"] if t["outcome"] == "skipped"}
    assert len(skipped) > 50 and all(skipped.values()), [n for n, f in skipped.items() if not f]
    assert skipped["test_gpu_count"] == {"fact": "no_gpu"}
    assert skipped["test_collective_bandwidth[net-all_reduce]"] == {"fact": "one_node"}
    assert skipped["test_gpu_memory_patterns"] == {"fact": "below_level", "level": "standard"}
    assert skipped["test_gpu_setting[driver]"] == {"fact": "not_required", "setting": "expect.driver"}
    assert skipped["test_infiniband_errors_during_run"] == {"fact": "no_infiniband"}
    assert skipped["test_dcgm_diagnostic[software]"]["fact"] == "dcgm_not_requested"
    if "deepspeed" not in results["environment"]:
        assert skipped["test_zero3_finetune"] == {"fact": "package_missing", "package": "deepspeed"}
    assert partial(results, manifest.shipped(), need="node") == []


@pytest.mark.parametrize(("fact", "why"), [
    (None, "test_hbm_bandwidth (no skip fact recorded)"),
    ({"fact": "unsupported"}, "test_hbm_bandwidth (the manifest does not let it skip on unsupported under a cpu "
                              "profile at level standard)"),
    ({"fact": "one_node"}, "test_hbm_bandwidth (the manifest does not let it skip on one_node"),
    ({"fact": "made_up"}, "test_hbm_bandwidth ({'fact': 'made_up'} is not a skip fact)"),
])
@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_a_test_that_ran_relabelled_skipped_is_partial(node_run: Path, fact: dict | None, why: str) -> None:  # noqa: F811
    results = recorded(node_run)
    relabel_skipped(_test(results, "test_hbm_bandwidth"), fact)
    decision = of_record(results, need="node")
    assert decision.verdict == "partial" and "1 skips are not earned by a recorded fact: " + why in decision.reason


@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_a_fact_the_record_contradicts_earns_nothing(node_run: Path) -> None:  # noqa: F811
    """The facts are checked against the rest of the record: its nodes, ranks, discovery and environment."""
    results = recorded(node_run)
    _test(results, "test_infiniband_errors_during_run")  # skipped: no_infiniband, and the discovery agrees
    results["discovery"][0]["infiniband"] = [{"device": "mlx5_0", "port": 1, "state": "ACTIVE"}]
    results["environment"]["deepspeed"] = "0.16.4"
    _test(results, "test_zero3_finetune")["skip_fact"] = {"fact": "package_missing", "package": "deepspeed"}
    reason = of_record(results, need="node").reason or ""
    assert "test_infiniband_errors_during_run (the record's discovery lists InfiniBand ports on cg-a)" in reason
    assert "test_zero3_finetune (the record's environment has deepspeed 0.16.4)" in reason
    # A net collective skipped "on one node" in a run of two nodes.
    two = recorded(node_run)
    two["nodes"].append({**two["nodes"][0], "host": "cg-b", "node_rank": 1})
    assert "test_collective_bandwidth[net-all_reduce] (the record lists 2 nodes)" in "; ".join(
        partial(two, manifest.shipped()))


@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_the_level_is_proven_by_what_ran(node_run: Path) -> None:  # noqa: F811
    """The real standard run relabelled extended: its memory test was left out at standard, whatever the level field
    says; the crafted quick run relabelled standard: its fine-tunes were left out at quick."""
    extended = recorded(node_run)
    extended["level"] = extended["selection"]["level"] = "extended"
    assert "test_gpu_memory_patterns (it was left out at level standard, but the record says level extended)" in \
        (of_record(extended, need="node").reason or "")

    quick = node_results("gpu2", 2, level="quick")
    assert of_record(quick, need="node", level="quick").verdict == "accept"
    relabelled = json.loads(json.dumps(quick).replace('"level": "quick"', '"level": "standard"'))
    assert of_record(relabelled, need="node").verdict == "partial"  # its facts now say standard: the manifest refuses
    assert "test_lora_finetune_learns (the manifest does not let it skip on below_level under a gpu profile at level " \
           "standard)" in (of_record(relabelled, need="node").reason or "")
    only_level = {**quick, "level": "standard"}  # the level field alone changed
    assert "test_lora_finetune_learns (it was left out at level quick, but the record says level standard)" in \
        (of_record(only_level, need="node").reason or "")


def test_dcgm_skips_must_agree_with_what_ran() -> None:
    run = node_results("gpu1", 1)
    dcgm = [t for t in run["tests"] if "test_dcgm_diagnostic" in t["nodeid"]]
    dcgm[0]["skip_fact"] = {"fact": "dcgm_not_requested", "requested": 1, "needs": 3}
    assert "its DCGM skips disagree on the --dcgm-diag level asked for" in (of_record(run, need="node").reason or "")
    dcgm[0]["skip_fact"] = {"fact": "dcgm_not_requested", "requested": 3, "needs": 3}
    assert "DCGM was asked for at level 3, which includes it (it needs 3)" in (of_record(run, need="node").reason or "")


# ---- merge and sign-off re-check it ----------------------------------------------------------------------------

def test_a_failed_test_relabelled_skipped_is_never_merged(tmp_path: Path) -> None:
    run = tmp_path / RUN
    for i, host in enumerate(["gpu1", "gpu2", "gpu3"]):
        results = node_results(host, i + 1, {("matmul_bf16_tflops", 3): 0.5} if host == "gpu2" else None)
        if host == "gpu2":
            failed = _test(results, "test_matmul_tflops[bf16]")
            assert failed["outcome"] == "failed"
            relabel_skipped(failed, {"fact": "unsupported"})
            results["verdict"] = "accept"
        write_node(run / "nodes", host, results)
    proc, cluster = merged(run)
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1", "gpu3"], proc.stdout
    assert "test_matmul_tflops[bf16] (the manifest does not let it skip on unsupported under a gpu profile" in \
        reasons(cluster, "gpu2")
    assert {n["host"]: n["verdict"] for n in cluster["nodes"]}["gpu2"] in ("partial", "reject")


def test_a_fabric_run_whose_measured_tests_are_relabelled_skipped_is_not_signed_off(tmp_path: Path) -> None:
    run = tmp_path / RUN
    for i, host in enumerate(["gpu1", "gpu2"]):
        write_node(run / "nodes", host, node_results(host, i + 1))
    proc, _ = merged(run)
    assert proc.returncode == 0, proc.stdout
    fabric = fabric_results(["gpu1", "gpu2"], RUN)
    for test in fabric["tests"]:
        if "[net-" in test["nodeid"] or "internode" in test["nodeid"]:
            relabel_skipped(test, {"fact": "one_node"}, "needs 2+ nodes; this job has 1")
    assert of_record(fabric, need="fabric").verdict == "partial"
    write_fabric(run, fabric)
    proc = cli("signoff", str(run))
    out = json.loads((run / "signoff.json").read_text())
    assert proc.returncode == 1 and out["verdict"] == "reject", proc.stdout
    assert any("7 skips are not earned by a recorded fact: test_collective_bandwidth[net-all_reduce] (the record lists "
               "2 nodes)" in r for r in out["reasons"]), out["reasons"]


def test_a_node_without_an_hca_in_a_fleet_that_has_them_is_partial(tmp_path: Path) -> None:
    """gpu3 skips the InfiniBand tests for having no port where gpu1 and gpu2 list theirs, and skips a test as
    unsupported that they ran: it lacks what its fleet has."""
    run = tmp_path / RUN
    port = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "rate_gbps": 400}
    for i, host in enumerate(["gpu1", "gpu2", "gpu3"]):
        results = node_results(host, i + 1)
        results["discovery"] = [{"host": host, "node_rank": 0, "cuda_devices": 8,
                                 "infiniband": [] if host == "gpu3" else [port]}]
        if host == "gpu3":
            relabel_skipped(_test(results, "test_no_clock_slowdown"), {"fact": "unsupported"})
        else:  # ports, whose counters and HCA firmware this crafted run did not read; its GPUs' own NICs it judged
            _test(results, "test_infiniband_errors_during_run")["skip_fact"] = {"fact": "unsupported"}
            _test(results, "test_hca_firmware_alike")["skip_fact"] = {"fact": "unsupported"}
            topo = _test(results, "test_gpu_nearest_nic_is_its_own")
            topo.update(message="", phases=RAN, skip_fact=None, **measured(
                manifest.shipped().get("acceptance/test_topology.py::test_gpu_nearest_nic_is_its_own"), results,
                load(shipped_thresholds()).profile(str(results["profile"]))))
        write_node(run / "nodes", host, results)
    records = {h: json.loads((run / "nodes" / h / "results.json").read_text()) for h in ("gpu1", "gpu2", "gpu3")}
    found = fleet_problems(records, manifest.shipped())
    assert list(found) == ["gpu3"]
    proc, cluster = merged(run)
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1", "gpu2"], proc.stdout
    said = reasons(cluster, "gpu3")
    assert "skips are not earned in this fleet (this node lacks what others have)" in said
    assert "test_infiniband_errors_during_run skipped on no_infiniband, yet InfiniBand ports are listed on gpu1, " \
           "gpu2" in said
    assert "test_no_clock_slowdown skipped on unsupported, yet it ran on gpu1, gpu2" in said


# ---- the facts themselves ----------------------------------------------------------------------------------------

def test_no_skip_in_the_suite_goes_without_its_fact() -> None:
    """Every skip in acceptance/ goes through cg.skip or skip_unless_everywhere, naming a fact (or None: a skip no
    complete run takes), and every fact named is one skip_facts knows."""
    named: set[str] = set()
    for path in sorted((ROOT / "acceptance").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            assert not (owner == "pytest" and name in ("skip", "importorskip")), \
                f"{path.name}:{node.lineno}: pytest.{name} records no fact: use cg.skip(reason, fact=...)"
            if name in ("skip", "skip_unless_everywhere") and owner != "pytest":
                fact = next((k.value for k in node.keywords if k.arg == "fact"), None)
                assert fact is not None, f"{path.name}:{node.lineno}: {name} without fact="
                if isinstance(fact, ast.Constant) and fact.value is not None:
                    named.add(fact.value)
    allowed = {r.fact for t in manifest.shipped().tests for r in t.skips} | {"below_level"}  # and skipped_by_design
    assert named <= allowed <= set(skip_facts.FACTS), (named - allowed, allowed - set(skip_facts.FACTS))


def test_a_manifest_rule_must_name_a_known_fact_profile_and_level(tmp_path: Path) -> None:
    data = json.loads(manifest.MANIFEST.read_text())
    for rule, problem in (({"fact": "no_gpus"}, "skips[0].fact: must be one of no_gpu"),
                          ({"fact": "no_gpu", "profiles": ["tpu"]}, "skips[0].profiles: must list some of cpu, gpu"),
                          ({"fact": "below_level", "levels": []}, "skips[0].levels: must list some of quick")):
        data["tests"][0]["skips"] = [rule]
        with pytest.raises(ManifestError, match=problem.replace("[", r"\[").replace("]", r"\]")):
            parse(json.dumps(data).encode(), tmp_path / "manifest.json")


def test_a_skip_fact_is_one_the_rule_knows() -> None:
    assert skip_facts.fact("below_level", level="quick") == {"fact": "below_level", "level": "quick"}
    with pytest.raises(skip_facts.FactError, match="records level"):
        skip_facts.fact("below_level")
    with pytest.raises(skip_facts.FactError, match="is not a skip fact"):
        skip_facts.fact("no_network")


@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_merge_reads_facts_of_real_runs_as_the_run_wrote_them(tmp_path: Path, node_run: Path) -> None:  # noqa: F811
    """Two copies of the real run as two nodes of one cluster run: both earned every skip, so both are accepted."""
    run = tmp_path / "run-trust"
    for host in ("cg-b", "cg-c"):
        (run / "nodes" / host).mkdir(parents=True)
        (run / "nodes" / host / "results.json").write_text(json.dumps(attest(as_node(recorded(node_run), host,
                                                                                       run.name))))
    proc, cluster = merged(run, "--expect-hosts", "cg-b,cg-c")
    # (A CPU run names no GPU: two copies of one are not a GPU named on two hosts.)
    assert cluster["nodes"][0]["verdict"] == "accept", proc.stdout
    assert proc.returncode == 0 and cluster["accepted"] == ["cg-b", "cg-c"], proc.stdout
