"""One verdict rule for every command that reads a stored verdict, black-box.

Each forged or broken node file below still says "accept". The merge, the sign-off and the re-render
command must each refuse it or judge it again from its records by the run's own rule
(``clustergate.record.verdict.of_record``): never an accept, always one clear line, never a traceback. Host
names are identities: a file whose host is not its directory's, a directory whose name is not a node
name, or a host outside --expect-hosts never reaches an accepted list. Outputs never overwrite inputs.

Every forgery goes through the merge's and the re-render's own decision in this process (the functions their
commands call, short of writing and drawing the outputs); a few go through each command for real, a process
of its own, which reaches the same decision by the same functions.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_runs import fabric_results, node_results, write_fabric, write_node
from complete_runs import NODE_TESTS

from clustergate.cluster import binding, merge, signoff
from clustergate.render import decide as rerender_decision
from clustergate.render import parser as rerender_parser
from clustergate.trust.manifest import shipped

from torchrun_job import ROOT, clustergate_args, job_env

Forgery = Callable[[dict[str, Any]], Any]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # Hang guard only: each command reads a few files and draws one page (seconds on CI's 2 busy cores).
    return subprocess.run(clustergate_args(*args), cwd=ROOT, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)


def _metric(res: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for t in res["tests"] for m in t["metrics"] if m["name"] == name)


def _slow_gpu_marked_passed(res: dict[str, Any]) -> None:
    """GPU 3's bf16 figure far below 700 TFLOPS, every flag still saying passed."""
    m = _metric(res, "matmul_bf16_tflops")
    m["per_rank"][3]["value"] = 100.0


def _too_few_tests(res: dict[str, Any]) -> None:
    res["selection"] = {"k": None, "m": None, "level": "standard", "selected": len(res["tests"]) + 3,
                        "deselected": 0}


def _failed_metric_in_passed_test(res: dict[str, Any]) -> None:
    _metric(res, "hbm_bandwidth_tbps")["passed"] = False


def _error_kept_with_accept(res: dict[str, Any]) -> None:
    res["error"] = "SIGTERM on rank 3 (gpu7)"


def _no_tests(res: dict[str, Any]) -> None:
    res["tests"] = []


def _all_skipped(res: dict[str, Any]) -> None:
    for t in res["tests"]:
        t.update(outcome="skipped", metrics=[], message=t["message"] or "relabelled", phases=["setup", "teardown"])


def _no_outcome(res: dict[str, Any]) -> None:
    del res["tests"][0]["outcome"]


def _unknown_schema(res: dict[str, Any]) -> None:
    res["schema"] = 2


def _value_not_a_number(res: dict[str, Any]) -> None:
    _metric(res, "matmul_bf16_tflops")["per_rank"][0]["value"] = "fast"


def _criterion_lowered(res: dict[str, Any]) -> None:
    """GPU 3 at 100 TFLOPS, and the stored minimum lowered to 50 so that the records pass it."""
    m = _metric(res, "matmul_bf16_tflops")
    m["per_rank"][3]["value"] = 100.0
    m["value"] = 100.0
    m["criterion"]["min"] = 50.0


def _other_thresholds(res: dict[str, Any]) -> None:
    res["clustergate"]["thresholds_digest"] = "0123456789abcdef"


def _no_thresholds_digest(res: dict[str, Any]) -> None:
    del res["clustergate"]


def _profile_not_in_thresholds(res: dict[str, Any]) -> None:
    res["profile"] = "h100-site-calibrated"


def _test(res: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in res["tests"] if t["nodeid"].endswith(name))


def _duplicated(res: dict[str, Any]) -> None:
    res["tests"].append(copy.deepcopy(_test(res, "test_hbm_bandwidth")))


def _deleted(res: dict[str, Any]) -> None:
    res["tests"].remove(_test(res, "test_hbm_bandwidth"))
    res["selection"] = {**res.get("selection", {}), "selected": len(res["tests"])}


def _relabelled_skipped(res: dict[str, Any]) -> None:
    _test(res, "test_hbm_bandwidth").update(outcome="skipped", message="no HBM here")


def _skipped_without_reason(res: dict[str, Any]) -> None:
    _test(res, "test_hbm_bandwidth").update(outcome="skipped", message="", metrics=[])


def _declared_metric_removed(res: dict[str, Any]) -> None:
    test = _test(res, "test_gpt_throughput")
    test["metrics"] = [m for m in test["metrics"] if m["name"] != "train_mfu"]


def _gpu_figure_removed(res: dict[str, Any]) -> None:
    _metric(res, "matmul_bf16_tflops")["per_rank"].pop(3)


def _scope_forged(res: dict[str, Any]) -> None:
    """A per-GPU figure restated as the job's, so that one figure stands for all eight."""
    metric = _metric(res, "hbm_bandwidth_tbps")
    metric.update(scope="world", per_rank=metric["per_rank"][:1])


def _problems_in_a_passed_test(res: dict[str, Any]) -> None:
    _test(res, "test_hbm_bandwidth")["problems"] = ["[call] failed on 1/8 ranks: 3"]


def _failed_ranks_in_a_passed_test(res: dict[str, Any]) -> None:
    _test(res, "test_hbm_bandwidth")["failed_ranks"] = [3]


def _hollow(res: dict[str, Any]) -> None:
    """--setup-only: no test body ran, every test recorded as passed without a figure."""
    for t in res["tests"]:
        t.update(outcome="passed", metrics=[], message="", problems=[], failed_ranks=[], phases=["setup", "teardown"])


def _no_phases(res: dict[str, Any]) -> None:
    for t in res["tests"]:
        del t["phases"]


FORGERIES: dict[str, tuple[Forgery, str]] = {
    # name: (forgery, what the merge's reason says)
    "metric-passed-below-min": (_slow_gpu_marked_passed, "records contradict the stored verdict accept: "),
    "failed-metric-passed-test": (_failed_metric_in_passed_test, "stored as failed, but its test is stored as passed"),
    "fewer-tests-than-selected": (_too_few_tests, "selected tests"),
    "error-with-accept": (_error_kept_with_accept, "SIGTERM on rank 3"),
    "zero-tests": (_no_tests, "no test ran"),
    "all-skipped": (_all_skipped, "skipped: nothing was measured"),
    "test-without-outcome": (_no_outcome, "not a valid results.json"),
    "unknown-schema-version": (_unknown_schema, "not a valid results.json"),
    "value-not-a-number": (_value_not_a_number, "not a valid results.json"),
    "criterion-lowered": (_criterion_lowered, "the file was edited after the run: "),
    "other-thresholds": (_other_thresholds, "it was judged by other thresholds than profile 'h100-sxm-80gb'"),
    "no-thresholds-digest": (_no_thresholds_digest, "does not say which thresholds judged it"),
    "profile-not-in-thresholds": (_profile_not_in_thresholds, "which "),
    # Every manifest test once, each in full (a record is checked in full, not only what is present):
    "test-duplicated": (_duplicated, "test_hbm_bandwidth is recorded 2 times"),
    "test-deleted": (_deleted, f"1 of the {NODE_TESTS} tests of a complete node run did not run"),
    "relabelled-skipped": (_relabelled_skipped, "is stored as skipped, but carries 1 metrics"),
    "skipped-without-reason": (_skipped_without_reason, "is stored as skipped without a reason"),
    "declared-metric-removed": (_declared_metric_removed, "stored as passed without its declared metrics train_mfu"),
    "gpu-figure-removed": (_gpu_figure_removed, "has figures of ranks 0, 1, 2, 4, 5, 6, 7, not one of each"),
    "scope-forged": (_scope_forged, "hbm_bandwidth_tbps is stored with scope 'world'; the suite records it per gpu"),
    "problems-in-passed-test": (_problems_in_a_passed_test, "stored as passed, but records problems"),
    "failed-ranks-in-passed-test": (_failed_ranks_in_a_passed_test, "stored as passed, but records failed ranks"),
    "hollow-setup-only": (_hollow, "tests never ran their body"),
    "no-phases": (_no_phases, "do not say which phases ran"),
}
RAW_FILES: dict[str, tuple[bytes, str]] = {
    "nan": (b'{"schema": 1, "verdict": "accept", "duration_s": NaN}', "NaN is not a number JSON allows"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not text"),
    "deep-nesting": (b'{"schema": 1, "verdict": "accept", "details": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                     "nested deeper"),
    "not-an-object": (b"[1, 2, 3]", "not a valid results.json"),
    "duplicate-key": (b'{"schema": 1, "verdict": "reject", "verdict": "accept"}', "'verdict' is given twice"),
    "huge-number": (b'{"schema": 1, "verdict": "accept", "duration_s": 1e999}', "1e999 is beyond what a float"),
}


@pytest.fixture(scope="module")
def good() -> dict[str, Any]:
    return node_results("gpu2", 2)


def _forged_run(tmp_path: Path, good: dict[str, Any], forge: Forgery | None = None,
                raw: bytes | None = None) -> Path:
    """nodes/gpu1 healthy; nodes/gpu2 forged (or raw bytes); returns the nodes directory."""
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    forged = copy.deepcopy(good)
    if forge is not None:
        forge(forged)
    directory = write_node(nodes, "gpu2", forged)
    if raw is not None:
        (directory / "results.json").write_bytes(raw)
    return nodes


def _forgery(tmp_path: Path, good: dict[str, Any], name: str) -> Path:
    """The nodes directory with gpu2's file forged as FORGERIES[name], or the raw bytes of RAW_FILES[name]."""
    if name in FORGERIES:
        return _forged_run(tmp_path, good, FORGERIES[name][0])
    return _forged_run(tmp_path, good, raw=RAW_FILES[name][0])


def _says(name: str) -> str:
    return (FORGERIES.get(name) or RAW_FILES[name])[1]


def _assert_gpu2_excluded(tmp_path: Path, proc: subprocess.CompletedProcess[str], says: str) -> None:
    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stdout
    assert (tmp_path / "run" / "accepted-hosts.txt").read_text() == "gpu1\n"
    [line] = (tmp_path / "run" / "excluded-hosts.txt").read_text().splitlines()
    assert line.startswith("gpu2\t") and says in line, line
    cluster = json.loads((tmp_path / "run" / "results.json").read_text())
    assert cluster["verdict"] == "reject" and cluster["accepted"] == ["gpu1"]


def merge_decision(nodes: Path) -> dict[str, Any]:
    """The cluster results the merge decides for NODES/gpu1 and NODES/gpu2: the functions ``merge`` runs, in this
    process, short of writing the outputs and drawing the report (the command's run id, thresholds and level)."""
    paths = [nodes / "gpu1", nodes / "gpu2"]
    judged = merge.judge_nodes(paths, None, merge.load_thresholds(None), run_id=binding.default_run_id(paths))
    return merge.cluster_results(judged, None, nodes.parent / "run", 0.0)


@pytest.mark.parametrize("name", [*FORGERIES, *RAW_FILES])
def test_merge_recomputes_every_node_verdict_from_its_records(tmp_path: Path, good: dict[str, Any], name: str) -> None:
    cluster = merge_decision(_forgery(tmp_path, good, name))
    assert cluster["verdict"] == "reject" and cluster["accepted"] == ["gpu1"], cluster["excluded"]
    [excluded] = cluster["excluded"]
    assert excluded["host"] == "gpu2" and _says(name) in "; ".join(excluded["reasons"]), excluded


@pytest.mark.parametrize("name", ["metric-passed-below-min", "other-thresholds", "deep-nesting"])
def test_the_merge_command_excludes_a_forged_node(tmp_path: Path, good: dict[str, Any], name: str) -> None:
    """The command itself, on a forgery of each kind: records that contradict the stored verdict, a file judged by
    other thresholds, a file that is not strict JSON."""
    nodes = _forgery(tmp_path, good, name)
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run"))
    _assert_gpu2_excluded(tmp_path, proc, _says(name))


@pytest.mark.parametrize(("kind", "says"), [("fifo", "a FIFO, not a regular file"),
                                           ("link-to-device", "a device, not a regular file")])
def test_a_file_that_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path: Path, good: dict[str, Any],
                                                                        kind: str, says: str) -> None:
    """A FIFO would block the reader forever, a device never end: both are refused without reading a byte."""
    nodes = _forged_run(tmp_path, good)
    path = nodes / "gpu2" / "results.json"
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run"))
    _assert_gpu2_excluded(tmp_path, proc, says)
    proc = cli(str(path), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 2 and len(proc.stdout.strip().splitlines()) == 1 and says in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", [*FORGERIES, *RAW_FILES])
def test_the_rerender_never_accepts_a_forged_file(tmp_path: Path, good: dict[str, Any], name: str) -> None:
    """The re-render's decision in this process (``clustergate.render.decide``, what its command calls before it
    draws): the file is refused with one line (the command's exit 2), or judged again and not accepted (its exit 1)."""
    path = _forgery(tmp_path, good, name) / "gpu2" / "results.json"
    try:
        results = rerender_decision(rerender_parser().parse_args([str(path)]))
    except ValueError as refused:
        assert len(str(refused).strip().splitlines()) == 1, refused
    else:
        assert results["verdict"] != "accept", results["reason"]


@pytest.mark.parametrize("name", ["metric-passed-below-min", "duplicate-key"])
def test_the_rerender_command_never_accepts_a_forged_file(tmp_path: Path, good: dict[str, Any], name: str) -> None:
    """The command itself, on a forgery of each kind: records that contradict the stored verdict (judged again,
    drawn, exit 1), a file that is not strict JSON (refused, exit 2). Each command draws its report, seconds of
    matplotlib: the other forgeries are each judged above by the function it calls."""
    path = _forgery(tmp_path, good, name) / "gpu2" / "results.json"
    proc = cli(str(path), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == (2 if name in RAW_FILES else 1), proc.stdout  # 2: refused as unusable
    assert "Traceback" not in proc.stdout
    if proc.returncode == 2:
        assert len(proc.stdout.strip().splitlines()) == 1, proc.stdout


def test_a_host_that_is_not_its_directory_is_excluded(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    write_node(nodes, "gpu2", node_results("gpu7", 2))  # gpu7's accepting file copied into gpu2's directory
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run"))
    _assert_gpu2_excluded(tmp_path, proc, "names host 'gpu7', not 'gpu2' (its directory)")


def test_a_host_name_with_a_newline_never_forges_a_line(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    write_node(nodes, "gpu2\ngpu9", node_results("gpu2\ngpu9", 2))
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2\ngpu9"), "-o", str(tmp_path / "run"))
    assert proc.returncode == 1 and "Traceback" not in proc.stdout, proc.stdout
    assert (tmp_path / "run" / "accepted-hosts.txt").read_text() == "gpu1\n"
    [line] = (tmp_path / "run" / "excluded-hosts.txt").read_text().splitlines()
    assert line.startswith("gpu2\\ngpu9\t") and "is not a node name" in line


def test_a_host_outside_the_expected_list_is_excluded(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    for i, host in enumerate(["gpu1", "gpu2"]):
        write_node(nodes, host, node_results(host, i))
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run"), "--expect-hosts", "gpu1")
    _assert_gpu2_excluded(tmp_path, proc, "not an expected host")


def test_signoff_does_not_take_the_merged_lists_on_trust(tmp_path: Path) -> None:
    """The merged results.json edited to accept a node its own directory rejects: not signed off."""
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    write_node(nodes, "gpu2", node_results("gpu2", 2, {("hbm_bandwidth_tbps", 1): 0.5}))
    assert cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run")).returncode == 1
    path = tmp_path / "run" / "results.json"
    cluster = json.loads(path.read_text())
    cluster.update(verdict="accept", accepted=["gpu1", "gpu2"], excluded=[], excluded_hostlist="")
    for node in cluster["nodes"]:
        node.update(status="accepted", verdict="accept", reasons=[])
    path.write_text(json.dumps(cluster))
    proc = cli("signoff", str(tmp_path / "run"))
    assert proc.returncode == 1 and "Traceback" not in proc.stdout, proc.stdout
    out = json.loads((tmp_path / "run" / "signoff.json").read_text())
    assert "gpu2" not in out["accepted"] and out["verdict"] == "reject"
    assert any("its node directories do not support" in r for r in out["reasons"])
    assert not (tmp_path / "run" / "signoff-accepted-hosts.txt").exists()  # a sign-off that rejects lists none


def _per_rank_removed(res: dict[str, Any]) -> None:
    """The failing GPU's figure taken out of a metric (its test and metric relabelled passed)."""
    metric = res["tests"][0]["metrics"][0]
    metric["per_rank"].pop(3)


def _test_duplicated(res: dict[str, Any]) -> None:
    res["tests"].append(copy.deepcopy(res["tests"][0]))


FABRIC_FORGERIES: dict[str, Forgery] = {
    "fewer-tests-than-selected": _too_few_tests, "error-with-accept": _error_kept_with_accept,
    "other-thresholds": _other_thresholds, "no-thresholds-digest": _no_thresholds_digest,
    "per-rank-figure-removed": _per_rank_removed, "test-duplicated": _test_duplicated,
}


def _merged(tmp_path: Path) -> Path:
    """gpu1 and gpu2 merged and accepted into tmp_path/run (run id: tmp_path's name), by the merge's own function
    in this process (its command is run above)."""
    nodes = tmp_path / "nodes"
    for i, host in enumerate(["gpu1", "gpu2"]):
        write_node(nodes, host, node_results(host, i))
    assert merge.merge([nodes / "gpu1", nodes / "gpu2"], tmp_path / "run")["verdict"] == "accept"
    return tmp_path / "run"


def _not_signed_off(run: Path) -> dict[str, Any]:
    """The sign-off of RUN by the function its command calls, in this process (the command exits 1 on it): a
    reject, written, and no list of signed-off hosts."""
    out = signoff.signoff(run)
    assert out["verdict"] == "reject", out
    assert json.loads((run / "signoff.json").read_text())["verdict"] == "reject"
    assert not (run / "signoff-accepted-hosts.txt").exists()
    return out


def test_signoff_signs_a_complete_fabric_run_of_its_run(tmp_path: Path) -> None:
    """The unforged case of the two tests below, by the command: it is their forgeries that keep the sign-off back."""
    run = _merged(tmp_path)
    write_fabric(run, fabric_results(["gpu1", "gpu2"], tmp_path.name))
    proc = cli("signoff", str(run))
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("name", list(FABRIC_FORGERIES))
def test_signoff_recomputes_the_fabric_verdict(tmp_path: Path, name: str) -> None:
    run = _merged(tmp_path)
    fabric = fabric_results(["gpu1", "gpu2"], tmp_path.name)
    FABRIC_FORGERIES[name](fabric)
    write_fabric(run, fabric)
    _not_signed_off(run)


def _only(*kept: str) -> Forgery:
    def narrow(res: dict[str, Any]) -> None:
        res["tests"] = [t for t in res["tests"] if any(k in t["nodeid"] for k in kept)]
    return narrow


def _hollow(res: dict[str, Any]) -> None:
    """--setup-only: every test recorded as passed, no call phase ran, no figure measured."""
    for t in res["tests"]:
        t.update(outcome="passed", metrics=[], message="", phases=["setup", "teardown"])


FABRIC = len(shipped().of_run("fabric"))


@pytest.mark.parametrize(("narrow", "selection", "says"), [
    (_only("net-all_reduce"), {"k": "net-all_reduce"}, f"{FABRIC - 1} of the {FABRIC} tests of a complete fabric run "
                                                       "did not run "
                                                       "(-k 'net-all_reduce', -m 'multinode')"),
    (_only("test_node.py"), {"args": ["acceptance/test_node.py"]}, f"{FABRIC - 1} of the {FABRIC} tests of a "
                                                                   "complete fabric run "
                                                                   "did not run (-m 'multinode', paths "
                                                                   "acceptance/test_node.py)"),
    (_only("net-"), {"deselect": ["acceptance/test_interconnect.py::test_gpu_pairs[internode]"]},
     f"{FABRIC - 6} of the {FABRIC} tests of a complete fabric run did not run (-m 'multinode', --deselect (1)): "
     "test_gpu_pairs[internode]"),
    (_hollow, {"modes": ["setup-only"]}, f"{FABRIC} tests never ran their body"),
])
def test_signoff_signs_only_a_complete_fabric_run(tmp_path: Path, narrow: Forgery, selection: dict[str, Any],
                                                  says: str) -> None:
    """However the fabric run was narrowed or hollowed, the sign-off counts what it ran against the manifest."""
    run = _merged(tmp_path)
    fabric = fabric_results(["gpu1", "gpu2"], tmp_path.name)
    narrow(fabric)
    fabric["selection"].update(selection, selected=len(fabric["tests"]))
    write_fabric(run, fabric)
    out = _not_signed_off(run)
    assert any(says in r for r in out["reasons"]), out["reasons"]


def test_merge_never_writes_over_its_inputs(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    before = (nodes / "gpu1" / "results.json").read_bytes()
    proc = cli("merge", str(nodes / "gpu1"), "-o", str(nodes / "gpu1"))
    assert proc.returncode == 2 and "is one of the node directories given" in proc.stdout
    shutil.copytree(nodes / "gpu1", tmp_path / "other")
    proc = cli("merge", str(nodes / "gpu1"), "-o", str(tmp_path / "other"))
    assert proc.returncode == 2 and "holds a results.json that is not a merge's" in proc.stdout
    assert (nodes / "gpu1" / "results.json").read_bytes() == before
    assert (tmp_path / "other" / "results.json").read_bytes() == before


def test_calibrate_never_writes_over_its_thresholds_or_an_existing_file(tmp_path: Path) -> None:
    thresholds = tmp_path / "thresholds.yaml"
    shutil.copy(ROOT / "thresholds.yaml", thresholds)
    before = thresholds.read_bytes()
    write_node(tmp_path / "nodes", "gpu1", node_results("gpu1", 1))
    run = str(tmp_path / "nodes" / "gpu1" / "results.json")

    def calibrate(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "clustergate", "calibrate", run, "--extends", "h100-sxm-80gb",
                               "--min-samples", "1", "--thresholds", str(thresholds), *extra], cwd=ROOT,
                              env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)

    proc = calibrate("-o", str(thresholds))
    assert proc.returncode == 2 and "is the --thresholds file it extends" in proc.stdout
    assert thresholds.read_bytes() == before
    (tmp_path / "site.yaml").write_text("# mine\n")
    proc = calibrate("-o", str(tmp_path / "site.yaml"))
    assert proc.returncode == 2 and "exists: pass --force" in proc.stdout
    assert (tmp_path / "site.yaml").read_text() == "# mine\n"
    proc = calibrate("-o", str(tmp_path / "site.yaml"), "--force")
    assert proc.returncode == 0, proc.stdout
    assert "h100-sxm-80gb-site" in (tmp_path / "site.yaml").read_text()


def test_merge_and_signoff_hold_every_run_to_the_thresholds_they_are_given(tmp_path: Path) -> None:
    """A thresholds file that cannot be read is one usage error; a sign-off given other thresholds than its
    merge was given is not signed off; runs under a site file are accepted only when merged with it."""
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    missing = cli("merge", str(nodes / "gpu1"), "-o", str(tmp_path / "run"), "--thresholds", str(tmp_path / "no.yaml"))
    assert missing.returncode == 2 and "Traceback" not in missing.stdout, missing.stdout
    assert len(missing.stdout.strip().splitlines()) == 1 and "--thresholds" in missing.stdout
    site = tmp_path / "site.yaml"  # the shipped file under another name: the same h100 profile and digest
    shutil.copy(ROOT / "thresholds.yaml", site)
    assert cli("merge", str(nodes / "gpu1"), "-o", str(tmp_path / "run"), "--thresholds", str(site)).returncode == 0
    merged = json.loads((tmp_path / "run" / "results.json").read_text())
    assert merged["thresholds"] == str(site) and merged["accepted"] == ["gpu1"]
    proc = cli("signoff", str(tmp_path / "run"))  # the shipped thresholds, not the merge's
    assert proc.returncode == 1 and f"the merge held the nodes to {site}" in proc.stdout, proc.stdout
    assert cli("signoff", str(tmp_path / "run"), "--thresholds", str(site)).returncode == 0
