"""``clustergate signoff``: the accepted set, the excluded hosts by phase, the verdict.

The node phase is merged from synthetic node results; the fabric phase's results.json is the shape
the plugin writes, with the figures each case needs. (tests/cluster/test_cluster_rehearsal.py and
tests/cluster/test_cluster_fabric.py sign off real runs.)
"""

from __future__ import annotations

import atexit
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import page_rows
import pytest
import yaml
from cluster_runs import fabric_results, node_results, write_node
from complete_runs import complete
from trust_runs import as_node, node_run, recorded  # noqa: F401  (node_run: the fixture)

import clustergate
from clustergate.cluster.merge import merge
from clustergate.cluster.signoff import signoff
from clustergate.common.numbers import number
from clustergate.criteria.criterion import Criterion
from clustergate.criteria.thresholds import Thresholds, load
from clustergate.record.reportdir import node_directory
from clustergate.record.results import short_test_name
from clustergate.report.signoff_html import signoff_page
from clustergate.report.signoff_words import DRY_RUN

from torchrun_job import ROOT, job_env

SCHEMA = json.loads((ROOT / "clustergate" / "cluster" / "signoff.schema.json").read_text())
HOSTS = ["h1", "h2", "h3", "h4"]


def schema_errors(data: dict[str, Any]) -> list[str]:
    return [e.message for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(data)]


FABRIC_CRITERIA = {"net_allreduce_busbw_gbps": {"min": 40},
                   "internode_pair_bw_gbps": {"min": 40, "outlier_fraction": 0.9},
                   "allreduce_busbw_gbps": {"min": 350}, "net_allgather_busbw_gbps": {"min": 40, "ceiling": 64}}
"""The fabric cases' criteria (a site's own: the shipped ones only warn for these metrics)."""


def write_site(path: Path) -> Path:
    """A site's thresholds: the shipped file with two fabric profiles, which fail (or warn) by FABRIC_CRITERIA."""
    data = yaml.safe_load((ROOT / "thresholds.yaml").read_text())
    for name, severity in (("fabric-fail", None), ("fabric-warn", "warn")):
        data["profiles"][name] = {"extends": "h100-sxm-80gb", "metrics": {
            m: {**c, **({"severity": severity} if severity and m == "internode_pair_bw_gbps" else {})}
            for m, c in FABRIC_CRITERIA.items()}}
    path.write_text(yaml.safe_dump(data))
    return path


SITE_DIR = Path(tempfile.mkdtemp(prefix="cg-signoff-site-"))
atexit.register(shutil.rmtree, SITE_DIR, True)
SITE = write_site(SITE_DIR / "site.yaml")
SITE_THRESHOLDS: Thresholds = load(SITE)


def signoff_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clustergate", "signoff", *args, "--thresholds", str(SITE)],
                          cwd=ROOT, env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=120)


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A merged node phase under each site profile (one profile judges a cluster run, its fabric phase too): h1-h4
    accepted, h5 excluded (its HBM fails its own test)."""
    out = {}
    for name in ("fabric-fail", "fabric-warn"):
        base = tmp_path_factory.mktemp(name)
        for i, host in enumerate([*HOSTS, "h5"]):
            write_node(base / "nodes", host, node_results(host, i, {("hbm_bandwidth_tbps", 1): 0.5} if host == "h5"
                                                          else None, profile=SITE_THRESHOLDS.profile(name)))
        merge(sorted((base / "nodes").iterdir()), base / "run", thresholds=SITE)
        out[name] = base / "run"
    return out


@pytest.fixture
def run(merged: dict[str, Path], tmp_path: Path) -> Path:
    """Each test's own copy of the merged run directory (judged by fabric-fail), to add a fabric phase to."""
    return Path(shutil.copytree(merged["fabric-fail"], tmp_path / "run"))


def metric(name: str, scope: str, per_rank: list[tuple[str, float, bool]], criterion: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "value": min(v for _, v, _ in per_rank), "unit": "GB/s", "scope": scope,
            "criterion": criterion, "passed": all(p for _, _, p in per_rank),
            "per_rank": [{"rank": i, "host": h, "node_rank": i, "value": v, "passed": p}
                         for i, (h, v, p) in enumerate(per_rank)]}


def fabric(run: Path, hosts: list[str], tests: list[dict[str, Any]], net: str = "passed", **top: Any) -> None:
    """The fabric phase's results.json: a net all_reduce test (``net``: its outcome) and ``tests``, the rest of a
    complete fabric run measured and passed (``cluster_runs.fabric_results``, one rank a host); of the merged run
    (its run id), started now (after the merge)."""
    tests = [{"nodeid": "acceptance/test_interconnect.py::test_collective_bandwidth[net-all_reduce]",
              "outcome": net, "duration_s": 1.0, "failed_ranks": [],
              "message": "no network to measure" if net == "skipped" else "", "problems": [],
              "metrics": [metric("net_allreduce_busbw_gbps", "gpu", [(h, 48.0, True) for h in hosts],
                                 {"min": 40})] if net == "passed" else [], "details": {}}, *tests]
    warned = any((m.get("criterion") or {}).get("severity") == "warn" for t in tests for m in t["metrics"])
    profile = SITE_THRESHOLDS.profile("fabric-warn" if warned else "fabric-fail")
    for m in (m for t in tests for m in t["metrics"]):  # what the run's judge stores: the profile's criterion
        given, site = Criterion.parse(m["criterion"], m["name"]), profile.metrics[m["name"]]
        assert (given.bounds, given.severity) == (site.bounds, site.severity)  # the site's source: its file
        m["criterion"] = profile.metrics[m["name"]].as_json()
    res = fabric_results(hosts, json.loads((run / "results.json").read_text())["run_id"], gpus=1)
    given = {t["nodeid"] for t in tests}
    for m in (m for t in res["tests"] for m in t["metrics"]):  # figures that pass the site's criteria too
        m["criterion"] = profile.metrics[m["name"]].as_json()
    tests += [t for t in res["tests"] if t["nodeid"] not in given]
    res.update({"verdict": "accept" if all(t["outcome"] == "passed" for t in tests) else "reject",
                "profile": profile.name,
                "clustergate": {"version": "0.1.0", "code_digest": "0" * 16, "thresholds_digest": profile.run_digest},
                "tests": tests, **top})
    res["selection"]["selected"] = len(tests)
    complete(res, run="fabric", profile=profile)
    (run / "fabric").mkdir(exist_ok=True)
    (run / "fabric" / "results.json").write_text(json.dumps(res))


def pair_test(hosts: list[str], slow: str, severity: str = "fail") -> dict[str, Any]:
    evidence = [f"round 1: 3.1 GB/s with {hosts[0]}, floor 36 GB/s: below the floor: suspect",
                f"round 2: 3 GB/s with {hosts[1]} (known good), floor 36 GB/s: below the floor with a known-good "
                "partner: excluded"]
    crit = {"min": 40, "outlier_fraction": 0.9, **({"severity": severity} if severity != "fail" else {})}
    # A missed warn criterion leaves the part passed (and warned), as the run's judge records it.
    m = metric("internode_pair_bw_gbps", "gpu", [(h, 3.0 if h == slow else 48.0, h != slow or severity == "warn")
                                                for h in hosts], crit)
    return {"nodeid": "acceptance/test_interconnect.py::test_gpu_pairs[internode]",
            "outcome": "passed" if severity == "warn" else "failed", "duration_s": 3.0,
            # A warned part fails nothing: its test passed, as the run records it.
            "failed_ranks": [] if severity == "warn" else [hosts.index(slow)],
            "message": "" if severity == "warn" else
            f"[call] 1 metric check failed:\n  internode_pair_bw_gbps=3 GB/s, expected >= 40 [{slow}]",
            "problems": [],
            "metrics": [m], "details": {"node_rounds": {"rounds": 3, "excluded": [{"host": slow, "evidence": evidence}],
                                                        "nodes": []}}}


def test_fabric_exclusion_leaves_the_rest_signed_off(run: Path) -> None:
    fabric(run, HOSTS, [pair_test(HOSTS, "h3")])
    proc = signoff_cli(str(run))
    assert proc.returncode == 0, proc.stdout
    out = json.loads((run / "signoff.json").read_text())
    assert schema_errors(out) == []
    assert out["verdict"] == "accept" and out["accepted"] == ["h1", "h2", "h4"]
    assert out["accepted_hostlist"] == "h[1-2,4]"
    assert [(e["host"], e["phase"]) for e in out["excluded"]] == [("h3", "fabric"), ("h5", "node")]
    h3 = out["excluded"][0]["reasons"]
    assert h3[0].startswith("test_gpu_pairs[internode]: round 1:") and "known good" in h3[1]
    assert out["phases"]["fabric"]["rounds"] == 3
    # test_nccl_uses_each_gpus_own_nic skips: NCCL sent nothing over a NIC in this crafted fabric (no port listed);
    # test_rdma_write_per_rail too: no node of it lists an HCA
    assert out["phases"]["fabric"]["tests"] == {"passed": 8, "failed": 1, "skipped": 2}
    assert (run / "signoff-accepted-hostlist.txt").read_text() == "h[1-2,4]\n"
    lines = (run / "signoff-excluded-hosts.txt").read_text().splitlines()
    assert lines[0].startswith("h3\tfabric: test_gpu_pairs[internode]: round 1") and lines[1].startswith("h5\tnode: ")
    assert "SIGNED OFF: 3 hosts accepted, 2 excluded" in proc.stdout
    assert 'class="cg-verdict">ACCEPT<' in (run / "signoff.html").read_text()


def test_a_failed_per_gpu_figure_names_its_host(run: Path) -> None:
    net = metric("net_allreduce_busbw_gbps", "gpu", [(h, 10.0 if h == "h2" else 48.0, h != "h2") for h in HOSTS],
                 {"min": 40})
    fabric(run, HOSTS, [{"nodeid": "acceptance/test_interconnect.py::test_collective_bandwidth[net-all_gather]",
                         "outcome": "failed", "duration_s": 1.0, "failed_ranks": [1],
                         "message": "[call] 1 metric check failed:\n  net_allreduce_busbw_gbps=10 GB/s, expected >= 40",
                         "problems": [],
                         "metrics": [net], "details": {}}])
    out = signoff(run, thresholds=SITE)
    assert out["verdict"] == "accept" and out["accepted"] == ["h1", "h3", "h4"]
    [h2] = [e for e in out["excluded"] if e["host"] == "h2"]
    assert h2["phase"] == "fabric" and h2["reasons"] == [
        "test_collective_bandwidth[net-all_gather]: net_allreduce_busbw_gbps=10 GB/s, >= 40"]


@pytest.mark.parametrize(("case", "reason"), [
    ("world", "allreduce_busbw_gbps (>= 350) missed by the whole job"),
    ("raised", "test_scaling_efficiency: RuntimeError: NCCL error"),
    ("running", "still says running"),
    ("outside", "the fabric phase ran on hosts the node phase did not accept (h5)"),
    ("none", "no fabric phase results at"),
    ("skipped", "fabric phase: ran less than a complete run: 1 skips are not earned by a recorded fact: "
                "test_collective_bandwidth[net-all_reduce] (no skip fact recorded)"),
    ("ceiling", "above the physical ceiling 64: a measurement error"),
])
def test_what_keeps_the_accepted_set_from_being_signed_off(run: Path, case: str, reason: str) -> None:
    if case == "world":
        fabric(run, HOSTS, [{"nodeid": "acceptance/test_interconnect.py::test_collective_bandwidth[world-all_reduce]",
                             "outcome": "failed", "duration_s": 1.0, "failed_ranks": [0],
                             "message": "[call] 1 metric check failed:\n  allreduce_busbw_gbps=300 GB/s",
                             "problems": [],
                             "metrics": [metric("allreduce_busbw_gbps", "world", [("h1", 300.0, False)], {"min": 350})],
                             "details": {}}])
    elif case == "raised":
        fabric(run, HOSTS, [{"nodeid": "acceptance/test_training.py::test_scaling_efficiency", "outcome": "failed",
                             "duration_s": 1.0, "failed_ranks": [2],
                             "message": "[call] failed on 1/4 ranks: 2\n--- rank 2 (h3) ---\n"
                                        "E   RuntimeError: NCCL error",
                             "problems": ["[call] failed on 1/4 ranks: 2\n--- rank 2 (h3) ---\n"
                                          "E   RuntimeError: NCCL error"],
                             "metrics": [], "details": {}}])
    elif case == "running":
        fabric(run, HOSTS, [], verdict="running")
    elif case == "outside":
        fabric(run, [*HOSTS, "h5"], [])
    elif case == "skipped":
        fabric(run, HOSTS, [], net="skipped")
    elif case == "ceiling":  # e.g. "nodes" on one host, where NVLink carries what the network should
        net = metric("net_allgather_busbw_gbps", "gpu", [(h, 300.0, False) for h in HOSTS], {"min": 40, "ceiling": 64})
        fabric(run, HOSTS, [{"nodeid": "acceptance/test_interconnect.py::test_collective_bandwidth[net-all_gather]",
                             "outcome": "failed", "duration_s": 1.0, "failed_ranks": [0, 1, 2, 3],
                             "message": "[call] 4 metric checks failed:\n  net_allgather_busbw_gbps=300 GB/s, ...",
                             "problems": [],
                             "metrics": [net], "details": {}}])
    proc = signoff_cli(str(run))
    assert proc.returncode == 1, proc.stdout
    out = json.loads((run / "signoff.json").read_text())
    assert out["verdict"] == "reject" and any(reason in r for r in out["reasons"]), out["reasons"]
    assert schema_errors(out) == [] and "NOT SIGNED OFF" in proc.stdout
    if case in ("world", "ceiling"):  # the whole job's figure, or an impossible one: no host to blame
        assert [e["host"] for e in out["excluded"]] == ["h5"] and out["accepted"] == HOSTS


def test_an_accepted_host_missing_from_the_fabric_job_is_excluded_and_nothing_signed_off(run: Path) -> None:
    """A sign-off covers exactly the hosts the node phase accepted: one missing from the fabric job is never
    tested, so the set is not signed off (the rest is not signed off without it either)."""
    fabric(run, ["h1", "h2", "h4"], [])
    out = signoff(run, thresholds=SITE)
    assert out["verdict"] == "reject" and out["accepted"] == ["h1", "h2", "h4"]
    assert any("did not cover every host the node phase accepted (h3 never joined it)" in r for r in out["reasons"])
    assert [e["reasons"] for e in out["excluded"] if e["host"] == "h3"] == [
        ["accepted by the node phase but not in the fabric phase's job: its links were never tested"]]


def test_warn_severity_pair_criterion_warns(merged: dict[str, Path], tmp_path: Path) -> None:
    run = Path(shutil.copytree(merged["fabric-warn"], tmp_path / "run"))
    fabric(run, HOSTS, [pair_test(HOSTS, "h3", severity="warn")])
    out = signoff(run, thresholds=SITE)
    assert out["verdict"] == "accept" and out["accepted"] == HOSTS
    assert any(w.startswith("h3: test_gpu_pairs[internode]: round 1") for w in out["warnings"])


def test_one_accepted_node_needs_no_fabric(tmp_path: Path) -> None:
    write_node(tmp_path / "nodes", "solo", node_results("solo", 1))
    merge([tmp_path / "nodes" / "solo"], tmp_path / "run")
    out = signoff(tmp_path / "run")
    assert out["verdict"] == "accept" and out["accepted"] == ["solo"]
    assert out["warnings"] == ["one node accepted: there is no fabric between nodes to test"]


def test_bad_input_exits_2(tmp_path: Path) -> None:
    proc = signoff_cli(str(tmp_path))
    assert proc.returncode == 2 and "results.json: file not found; give the run directory that " \
        "`clustergate merge" in proc.stdout
    write_node(tmp_path, "n", node_results("n", 1))
    proc = signoff_cli(str(tmp_path / "n"))
    assert proc.returncode == 2 and "is not a merged cluster results.json" in proc.stdout


def test_the_line_and_the_page_say_what_was_signed(run: Path) -> None:
    """The profile and its digest (what every run recorded), the thresholds file, the level, the suite's digest, the
    site key or none, and each accepted host's GPU model and count: in signoff.json, on the line after the verdict,
    and on the page. No dry-run banner: the fleet ran a GPU profile."""
    fabric(run, HOSTS, [pair_test(HOSTS, "h3")])
    proc = signoff_cli(str(run))
    assert proc.returncode == 0, proc.stdout
    out = json.loads((run / "signoff.json").read_text())
    cluster = json.loads((run / "results.json").read_text())
    digest = SITE_THRESHOLDS.profile("fabric-fail").run_digest
    assert schema_errors(out) == []
    assert (out["profile"], out["profile_digest"], out["thresholds"]) == ("fabric-fail", digest, str(SITE))
    assert out["suite_digest"] == cluster["suite_digest"] and out["suite_digest"].startswith("sha256:")
    assert out["dry_run"] is False and out["signed"] is False
    assert out["nodes"] == [{"host": h, "gpus": 8, "gpu_models": ["NVIDIA H100 80GB HBM3"], "ranks": 8}
                            for h in ("h1", "h2", "h4")]
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("looser than shipped: ")]
    assert lines[0] == "SIGNED OFF: 3 hosts accepted, 2 excluded"
    assert lines[1] == (f"signed: profile fabric-fail (site profile of site.yaml, extends shipped h100-sxm-80gb, "
                        f"digest {digest}) of {SITE}, level standard, suite "
                        f"{out['suite_digest']}; no site key: the records carry no HMAC")
    assert lines[2:4] == ["accepted: h[1-2,4]", "  h[1-2,4]: 8 x NVIDIA H100 80GB HBM3"]
    page = (run / "signoff.html").read_text()
    for said in (f"fabric-fail (site profile of site.yaml, extends shipped h100-sxm-80gb, digest {digest})", str(SITE),
                 out["suite_digest"], "none: the records carry no HMAC",
                 '<td>h[1-2,4]</td><td>8 x NVIDIA H100 80GB HBM3</td>'):
        assert said in page, said
    assert 'id="cg-dry-run"' not in page and 'id="cg-dry-run"' not in (run / "report.html").read_text()


def test_a_cpu_sign_off_says_it_is_a_dry_run(tmp_path: Path, node_run: Path) -> None:  # noqa: F811
    """A real CPU node run (README's command 1) signed off alone: the line, the page and the merge's report say first
    that it is a dry run without a GPU, and the host's hardware is its CPU ranks."""
    run = tmp_path / "reports" / "dry"
    write_node(run / "nodes", "cg-1", as_node(recorded(node_run), "cg-1", "dry"))
    merge([run / "nodes" / "cg-1"], run, level="standard")
    proc = subprocess.run([sys.executable, "-m", "clustergate", "signoff", str(run)], cwd=ROOT, env=job_env(),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert proc.returncode == 0, proc.stdout
    out = json.loads((run / "signoff.json").read_text())
    assert out["dry_run"] is True and out["nodes"] == [{"host": "cg-1", "gpus": 0, "gpu_models": [], "ranks": 2}]
    lines = proc.stdout.splitlines()
    assert lines[0] == f"SIGNED OFF: 1 hosts accepted, 0 excluded ({DRY_RUN})"
    assert lines[1].startswith("signed: profile cpu (digest ") and "level standard" in lines[1]
    assert lines[3] == "  cg-1: 2 CPU ranks, no GPU"
    page = (run / "signoff.html").read_text()
    assert f'<div class="cg-dry-run" id="cg-dry-run">{DRY_RUN}</div>' in page
    assert "<td>cg-1</td><td>2 CPU ranks, no GPU</td>" in page
    merged = (run / "report.html").read_text()  # the merge's own report marks it the same way, first
    assert f'<div class="cg-dry-run" id="cg-dry-run">{DRY_RUN}</div>' in merged
    assert merged.index('id="cg-dry-run"') < merged.index('id="cg-verdict"')


def page_table(page: str, div: str) -> list[dict[str, str]]:
    head, *rows = page_rows.rows(page, "div", "id", div)
    return [dict(zip(head, row, strict=True)) for row in rows]


def test_the_page_holds_every_criterion_across_the_accepted_hosts(run: Path) -> None:
    """signoff.html's table: one row per criterion of each phase, its min and median over the accepted hosts' parts
    (as their node files and the fabric run record them) against the profile's bound and source; the clustergate
    version among what it was judged by; no looser-than-shipped column where the sign-off says nothing of it."""
    fabric(run, HOSTS, [pair_test(HOSTS, "h3")])
    out = signoff(run, thresholds=SITE)
    assert out["verdict"] == "accept" and out["accepted"] == ["h1", "h2", "h4"] and schema_errors(out) == []
    profile = SITE_THRESHOLDS.profile("fabric-fail")
    expected: dict[tuple[str, str, str], tuple[str, list[float]]] = {}
    directories = {n["host"]: n["directory"] for n in json.loads((run / "results.json").read_text())["nodes"]}
    for host in out["accepted"]:  # the figures as each accepted node's own file records them
        node = json.loads((node_directory(directories[host], run) / "results.json").read_text())
        for t in node["tests"]:
            for m in t["metrics"]:
                values = [p["value"] for p in m["per_rank"]] if m["scope"] == "gpu" else [m["value"]]
                expected.setdefault(("node", m["name"], t["nodeid"]), (m["unit"], []))[1].extend(values)
    for t in json.loads((run / "fabric" / "results.json").read_text())["tests"]:
        for m in t["metrics"]:
            values = [m["value"]] if m["scope"] == "world" else \
                [p["value"] for p in m["per_rank"] if p["host"] in out["accepted"]]
            expected[("fabric", m["name"], t["nodeid"])] = (m["unit"], values)
    page = (run / "signoff.html").read_text()
    rows = page_table(page, "cg-criteria")
    shown = {(r["phase"], r["metric"], r["test"]): r for r in rows}
    assert len(rows) == len(shown) == len(expected) and len(rows) > 30
    for (phase, name, nodeid), (unit, values) in expected.items():
        row = shown[(phase, name, short_test_name(nodeid))]
        assert row["min"] == number(min(values), unit) and row["median"] == number(statistics.median(values), unit)
        rule = profile.metrics.get(name)
        assert row["bound"] == (rule.text() if rule is not None and rule.judged else "not judged"), name
        assert row["source"] == (rule.describe()["source"].split(" (")[0] if rule is not None else ""), name
        whole_job = phase == "fabric" and len(values) == 1 and name == "scaling_efficiency"
        assert row["parts"] == "whole job" if whole_job else row["parts"].startswith(f"{len(values)} "), name
    # The column is there exactly where the site's profile asks less than the shipped one somewhere.
    assert ("looser than shipped" in rows[0]) == bool(out["looser_than_shipped"])
    assert out["clustergate"] == {"version": clustergate.__version__}
    assert f"<tr><td>clustergate</td><td>{clustergate.__version__}</td></tr>" in page
    assert f"<tr><td>run id</td><td>{out['run_id']}</td></tr>" in page


def test_a_looser_site_criterion_is_marked_in_its_row(run: Path) -> None:
    """Where the sign-off says a site profile is looser than the shipped one (``looser_than_shipped``), its criterion's
    row says how, and a dropped criterion with no row is listed under the table."""
    fabric(run, HOSTS, [])
    out = signoff(run, thresholds=SITE)
    looser = [{"metric": "hbm_bandwidth_tbps", "kind": "looser", "profile": "fabric-fail", "shipped": "h100-sxm-80gb",
               "detail": ">= 1.5 where h100-sxm-80gb has >= 2.7"},
              {"metric": "no_such_metric", "kind": "dropped", "profile": "fabric-fail", "shipped": "h100-sxm-80gb",
               "detail": "h100-sxm-80gb has >= 1"}]
    page = signoff_page({**out, "looser_than_shipped": looser})
    rows = {r["metric"]: r for r in page_table(page, "cg-criteria")}
    assert rows["hbm_bandwidth_tbps"]["looser than shipped"] == "looser: >= 1.5 where h100-sxm-80gb has >= 2.7"
    assert {r["looser than shipped"] for m, r in rows.items() if m != "hbm_bandwidth_tbps"} == {""}
    assert "no_such_metric: dropped: h100-sxm-80gb has &gt;= 1" in page


def test_a_looser_site_profile_is_named_as_the_sites_and_looser_per_criterion(tmp_path: Path) -> None:
    """A node judged by a hand-edited site profile that lowers a minimum to nothing, demotes a criterion and drops
    one, merged and signed off under that file: signoff.json, the line and the page name the profile as the site's
    (with the shipped one it extends), never by a shipped name alone, and each criterion where it asks less."""
    import looser_site

    from clustergate.criteria.against_shipped import Weakening

    site = looser_site.write(tmp_path / "site.yaml")
    profile = load(site).profile(looser_site.NAME)
    write_node(tmp_path / "nodes", "solo", node_results("solo", 1, profile=profile))
    merge([tmp_path / "nodes" / "solo"], tmp_path / "run", thresholds=site)
    proc = subprocess.run([sys.executable, "-m", "clustergate", "signoff", str(tmp_path / "run"), "--thresholds",
                           str(site)], cwd=ROOT, env=job_env(), text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=120)
    assert proc.returncode == 0, proc.stdout
    out = json.loads((tmp_path / "run" / "signoff.json").read_text())
    assert schema_errors(out) == []
    assert (out["profile"], out["shipped_profile"]) == (looser_site.NAME, looser_site.SHIPPED)
    assert sorted(Weakening(**w).text() for w in out["looser_than_shipped"]) == sorted(looser_site.SAID)
    lines = proc.stdout.splitlines()
    assert lines[1].startswith(f"signed: profile {looser_site.NAME} (site profile of site.yaml, extends shipped "
                               f"{looser_site.SHIPPED}, digest {profile.run_digest}) of {site}, level standard")
    assert sorted(lines[2:5]) == sorted(f"looser than shipped: {said}" for said in looser_site.SAID)
    page = (tmp_path / "run" / "signoff.html").read_text()
    assert f"{looser_site.NAME} (site profile of site.yaml, extends shipped {looser_site.SHIPPED}" in page
    assert "looser than shipped" in page and "min -5 where shipped has &gt;= 2.7" in page
