"""One cluster run: one suite, one profile, keyed records. Merge and sign-off exclude a node run of another suite
digest, judged by another profile or a dry run beside GPU nodes, one whose GPUs name placeholders for serials, and,
given the site key, any file whose HMAC is missing or does not match; the merged record's node digests are keyed, so a
recomputed plain digest no longer passes. Crafted node runs (tests/helpers/cluster_runs.py) and copies of the one real
run (tests/helpers/trust_runs.py), through the commands themselves."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_runs import fabric_results, node_results, write_fabric, write_node
from complete_runs import attest, attested
from forked_pytest import pytest_forked
from trust_runs import as_node, node_run, recorded  # noqa: F401  (node_run: the fixture)

from clustergate.criteria.thresholds import load
from clustergate.trust import attestation, keyed

from torchrun_job import ROOT, clustergate_args, job_env

RUN = "run-0412"
HOSTS = ["gpu1", "gpu2", "gpu3"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # A hang guard only: each command reads a few files and draws one page.
    return subprocess.run(clustergate_args(*args), cwd=ROOT, env=job_env(env), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)


def nodes(tmp_path: Path, results: dict[str, dict[str, Any]] | None = None) -> Path:
    """REPORTS/run-0412/nodes/gpu1..gpu3, healthy complete node runs unless ``results`` gives a host's own."""
    run = tmp_path / RUN
    for i, host in enumerate(HOSTS):
        write_node(run / "nodes", host, (results or {}).get(host) or node_results(host, i + 1))
    return run


def merge(run: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                                             dict[str, Any]]:
    proc = cli("merge", *sorted(str(p) for p in (run / "nodes").iterdir()), "-o", str(run), *extra, env=env)
    assert "Traceback" not in proc.stdout, proc.stdout
    path = run / "results.json"
    return proc, json.loads(path.read_text()) if path.exists() else {}


def excluded(cluster: dict[str, Any]) -> dict[str, str]:
    return {e["host"]: "; ".join(e["reasons"]) for e in cluster["excluded"]}


def verdicts(cluster: dict[str, Any]) -> dict[str, str]:
    return {n["host"]: n["verdict"] for n in cluster["nodes"]}


# ---- one suite ---------------------------------------------------------------------------------------------------

def test_a_node_of_another_suite_digest_is_excluded(tmp_path: Path) -> None:
    other = node_results("gpu2", 2)
    other["attestation"]["suite_digest"] = "sha256:" + "ab" * 32
    unsaid = node_results("gpu3", 3)
    del unsaid["attestation"]
    proc, cluster = merge(nodes(tmp_path, {"gpu2": other, "gpu3": unsaid}))
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1"], proc.stdout
    assert f"it ran another version of the suite (sha256:{'ab' * 32}, this clustergate's is " \
           f"{attestation.suite_digest()}): one version across the cluster run" in excluded(cluster)["gpu2"]
    assert "does not say which suite ran it (no attestation.suite_digest" in excluded(cluster)["gpu3"]
    assert verdicts(cluster)["gpu2"] == verdicts(cluster)["gpu3"] == "unbound"
    assert cluster["suite_digest"] == attestation.suite_digest()


def test_a_fabric_run_of_another_suite_or_profile_is_not_signed_off(tmp_path: Path) -> None:
    run = nodes(tmp_path)
    assert merge(run)[0].returncode == 0
    for change, said in (({"attestation": {**attested(),
                                           "suite_digest": "sha256:" + "cd" * 32}},
                          "the fabric run: it ran another version of the suite"),
                         ({"profile": "h200"}, "the fabric run: it was judged by profile 'h200', not the fleet's "
                                               "'h100-sxm-80gb' (the merge's)")):
        write_fabric(run, {**fabric_results(HOSTS, RUN), **change})
        proc = cli("signoff", str(run))
        out = json.loads((run / "signoff.json").read_text())
        assert proc.returncode == 1 and any(said in r for r in out["reasons"]), out["reasons"]


# ---- one profile ---------------------------------------------------------------------------------------------------

@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_mixed_profiles_need_the_fleets_profile_and_the_odd_node_is_excluded_naming_its_own(
        tmp_path: Path, node_run: Path) -> None:  # noqa: F811
    """A cpu dry run (the real run) among H100 nodes: without --profile the merge says the runs disagree (exit 2);
    with the fleet's profile the odd node is excluded, naming the profile it was judged by, and as a dry run."""
    run = nodes(tmp_path)
    cpu = write_node(run / "nodes", "cg-a", attest(as_node(recorded(node_run), "cg-a", RUN)))
    proc, _ = merge(run)
    assert proc.returncode == 2 and "the node runs were judged by different profiles: h100-sxm-80gb (3 nodes), cpu " \
                                    "(1 node); one profile judges a cluster run: give the fleet's with --profile NAME" \
        in proc.stdout, proc.stdout
    proc, cluster = merge(run, "--profile", "h100-sxm-80gb")
    assert proc.returncode == 1 and cluster["accepted"] == HOSTS, proc.stdout
    assert cluster["profile"] == "h100-sxm-80gb" and cluster["profile_source"] == "--profile"
    assert "it was judged by profile 'cpu', not the fleet's 'h100-sxm-80gb' (--profile): one profile judges a " \
           "cluster run" in excluded(cluster)["cg-a"]
    assert verdicts(cluster)["cg-a"] == "unbound"
    # Its figures are not the fleet's: no metric of its profile, and each of the others counts the 3 H100 nodes'.
    assert cluster["fleet"] and all(fm["profile"] == "h100-sxm-80gb" and fm["count"] == (24 if fm["scope"] == "gpu"
                                                                                           else 3)
                                    for fm in cluster["fleet"])
    assert cpu.name == "cg-a"


def test_a_dry_run_is_never_signed_off_beside_gpu_nodes(tmp_path: Path) -> None:
    """A record that says it is a dry run, whatever profile it names, is not one of a GPU fleet's nodes."""
    dry = node_results("gpu2", 2)
    dry["attestation"]["dry_run"] = True
    proc, cluster = merge(nodes(tmp_path, {"gpu2": dry}))
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1", "gpu3"], proc.stdout
    assert "it is a dry run (--dry-run, the cpu profile): a dry run is never signed off beside GPU nodes" in \
        excluded(cluster)["gpu2"]
    assert cluster["dry_run"] is False


@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_a_fleet_of_dry_runs_merges_as_a_dry_run(tmp_path: Path, node_run: Path) -> None:  # noqa: F811
    run = tmp_path / "run-trust"
    for host in ("cg-b", "cg-c"):
        write_node(run / "nodes", host, attest(as_node(recorded(node_run), host, run.name)))
    proc, cluster = merge(run)
    assert proc.returncode == 0 and cluster["profile"] == "cpu" and cluster["dry_run"] is True, proc.stdout


def test_an_unknown_fleet_profile_is_an_input_error(tmp_path: Path) -> None:
    proc, _ = merge(nodes(tmp_path), "--profile", "b200")
    assert proc.returncode == 2 and "--profile b200:" in proc.stdout and "has no such profile" in proc.stdout


# ---- GPU identities --------------------------------------------------------------------------------------------

def _placeholders(host: str, seed: int, key: str, value: str, profile: Any = None) -> dict[str, Any]:
    res = node_results(host, seed, **({"profile": profile} if profile else {}))
    for gpu in res["nodes"][0]["gpus"]:
        gpu[key] = value
    return res


@pytest.mark.parametrize(("key", "value"), [("serial", "[N/A]"), ("serial", "0000000000000"), ("uuid", "")])
def test_a_placeholder_serial_or_uuid_is_no_identity(tmp_path: Path, key: str, value: str) -> None:
    proc, cluster = merge(nodes(tmp_path, {h: _placeholders(h, i + 1, key, value) for i, h in enumerate(HOSTS)}))
    assert proc.returncode == 1 and cluster["accepted"] == [], proc.stdout
    assert f"GPU 0 has no {key} ({value!r}): a placeholder is not an identity" in excluded(cluster)["gpu1"]
    assert set(verdicts(cluster).values()) == {"unbound"}


def test_a_model_without_a_readable_serial_is_known_by_its_uuids(tmp_path: Path) -> None:
    """The site's profile says the model has no readable serial (settings.gpu_serial_readable: false): the UUIDs
    are the identities, and a placeholder UUID still is none."""
    data = yaml.safe_load((ROOT / "thresholds.yaml").read_text())
    data["profiles"]["h100-noserial"] = {"extends": "h100-sxm-80gb", "settings": {"gpu_serial_readable": False}}
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(data))
    profile = load(site).profile("h100-noserial")
    runs = {h: _placeholders(h, i + 1, "serial", "[N/A]", profile) for i, h in enumerate(HOSTS)}
    runs["gpu3"]["nodes"][0]["gpus"][5]["uuid"] = "[N/A]"
    proc, cluster = merge(nodes(tmp_path, runs), "--thresholds", str(site))
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1", "gpu2"], proc.stdout
    assert "GPU 5 has no uuid ('[N/A]')" in excluded(cluster)["gpu3"]


def test_a_copied_run_directory_is_judged_by_the_node_files_it_holds(tmp_path: Path) -> None:
    """The merged record keeps each node directory relative to the run's directory: a copy of the run (an archive)
    signs off on its own, and an edit of the copy's node file is found there, not hidden by the original's."""
    import shutil

    run = nodes(tmp_path)
    assert merge(run)[0].returncode == 0
    write_fabric(run, fabric_results(HOSTS, RUN))
    cluster = json.loads((run / "results.json").read_text())
    assert {n["host"]: n["directory"] for n in cluster["nodes"]} == {h: f"nodes/{h}" for h in HOSTS}
    copy = tmp_path / "archive" / RUN
    shutil.copytree(run, copy)
    proc = cli("signoff", str(copy))
    assert proc.returncode == 0, proc.stdout
    node = copy / "nodes" / "gpu2" / "results.json"
    data = json.loads(node.read_text())
    data["tests"][0]["duration_s"] = 0.5
    node.write_text(json.dumps(data))
    proc = cli("signoff", str(copy))
    assert proc.returncode == 1 and f"{node} is not the file the merge read" in proc.stdout, proc.stdout
    assert cli("signoff", str(run)).returncode == 0  # the original is as it was


# ---- keyed records -------------------------------------------------------------------------------------------------

def signed_nodes(tmp_path: Path, key: bytes) -> Path:
    """Healthy node runs of run-0412, each signed by its node as a keyed run signs its results.json."""
    return nodes(tmp_path, {h: keyed.sign(json.loads(json.dumps(node_results(h, i + 1) | {"run_id": RUN})), key, h)
                            for i, h in enumerate(HOSTS)})


def test_a_keyed_merge_excludes_an_edited_node_file_and_keys_its_digests(tmp_path: Path, key_file: Path) -> None:
    key = key_file.read_bytes().strip()
    run = signed_nodes(tmp_path, key)
    edited = run / "nodes" / "gpu2" / "results.json"
    data = json.loads(edited.read_text())
    data["nodes"][0]["gpus"][0]["serial"] = "1654999990"  # a GPU swapped in the record, the HMAC left as it was
    edited.write_text(json.dumps(data))
    unsigned = run / "nodes" / "gpu3" / "results.json"
    unsigned.write_text(json.dumps({k: v for k, v in json.loads(unsigned.read_text()).items() if k != keyed.FIELD}))
    proc, cluster = merge(run, "--key-file", str(key_file))
    assert proc.returncode == 1 and cluster["accepted"] == ["gpu1"], proc.stdout
    assert excluded(cluster)["gpu2"] == (f"{edited}: its HMAC does not match its content: edited after it was "
                                         "written, or signed with another key")
    assert excluded(cluster)["gpu3"].startswith(f"{unsigned}: it carries no HMAC")
    assert cluster["signed"] is True and keyed.problem(cluster, key) is None  # the merged record is signed
    digests = {n["host"]: n["digest"] for n in cluster["nodes"]}
    plain = "sha256:" + hashlib.sha256((run / "nodes" / "gpu1" / "results.json").read_bytes()).hexdigest()
    assert digests["gpu1"] == keyed.digest(key, plain) and digests["gpu1"].startswith("hmac-sha256:")
    # Without the key the edited file is not found out: the merge says it checked no HMAC, and signs nothing.
    proc, blind = merge(run)
    assert blind["signed"] is False and ("clustergate merge: warning: the node files carry HMACs, but no site key "
                                         "was given (--key-file)") in proc.stdout, proc.stdout
    # The key from the environment is the same key, through a link as a Kubernetes secret mounts it.
    link = tmp_path / "mounted.key"
    link.symlink_to(key_file)
    proc, again = merge(run, env={keyed.KEY_ENV: str(link)})
    assert again["accepted"] == ["gpu1"] and again["signed"] is True


def test_a_recomputed_plain_digest_no_longer_passes_the_sign_off(tmp_path: Path, key_file: Path) -> None:
    """After a keyed merge, gpu1's file is edited and its digest in the merged record set to the edited file's plain
    sha256 (what passed before keys): the sign-off, given the key, refuses it, and the merged record's own HMAC
    no longer matches either."""
    key = key_file.read_bytes().strip()
    run = signed_nodes(tmp_path, key)
    assert merge(run, "--key-file", str(key_file))[0].returncode == 0
    write_fabric(run, keyed.sign(json.loads(json.dumps(fabric_results(HOSTS, RUN))), key, "gpu1"))
    proc = cli("signoff", str(run), "--key-file", str(key_file))
    assert proc.returncode == 0, proc.stdout
    assert keyed.problem(json.loads((run / "signoff.json").read_text()), key) is None

    node = run / "nodes" / "gpu1" / "results.json"
    data = json.loads(node.read_text())
    data["tests"][0]["duration_s"] = 0.5
    node.write_text(json.dumps(data))
    cluster = json.loads((run / "results.json").read_text())
    next(n for n in cluster["nodes"] if n["host"] == "gpu1")["digest"] = \
        "sha256:" + hashlib.sha256(node.read_bytes()).hexdigest()
    (run / "results.json").write_text(json.dumps(cluster))
    proc = cli("signoff", str(run), "--key-file", str(key_file))
    out = json.loads((run / "signoff.json").read_text())
    assert proc.returncode == 1 and out["verdict"] == "reject", proc.stdout
    said = "\n".join(out["reasons"])
    assert f"{run / 'results.json'}: its HMAC does not match its content" in said
    assert "gpu1" in out["excluded_hostlist"] and f"{node}: its HMAC does not match its content" in \
        "; ".join(e for x in out["excluded"] if x["host"] == "gpu1" for e in x["reasons"])
    # Without the key, a keyed merge is not signed off at all.
    proc = cli("signoff", str(run))
    assert proc.returncode == 1
    assert "the merge was signed with a site key, so the sign-off needs the same key" in proc.stdout


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o622])
def test_a_key_file_others_can_read_is_refused(tmp_path: Path, key_file: Path, mode: int) -> None:
    key_file.chmod(mode)
    proc, _ = merge(nodes(tmp_path), "--key-file", str(key_file))
    assert proc.returncode == 2, proc.stdout
    assert f"--key-file {key_file}: group or others may read or write the site key (mode {mode:o}), so they could " \
           f"sign records: chmod 600 {key_file}" in proc.stdout
    proc = cli("signoff", str(tmp_path / RUN), env={keyed.KEY_ENV: str(key_file)})
    assert proc.returncode == 2 and f"chmod 600 {key_file}" in proc.stdout


def test_a_key_file_that_is_no_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo, 0o600)
    proc, _ = merge(nodes(tmp_path), "--key-file", str(fifo))
    assert proc.returncode == 2 and f"--key-file {fifo}: not a regular file" in proc.stdout, proc.stdout
    proc, _ = merge(nodes(tmp_path), "--key-file", str(tmp_path / "absent"))
    assert proc.returncode == 2 and "cannot open the site key" in proc.stdout


@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_a_keyed_run_signs_its_results_at_every_write(tmp_path: Path, key_file: Path) -> None:
    """A real run (acceptance/test_world.py, one rank) given the key through the environment: its results.json
    carries the HMAC of what it says, made on its host for its run id; one edit, and it no longer matches."""
    key = key_file.read_bytes().strip()
    env = job_env({keyed.KEY_ENV: str(key_file), "CLUSTERGATE_RUN_ID": RUN, "CLUSTERGATE_NODE_NAME": "gpu1"})
    run = pytest_forked(ROOT, env, ["acceptance/test_world.py", "--report-dir", str(tmp_path / "report")], tmp_path)
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["verdict"] == "partial" and results["run_id"] == RUN, (run.outlines, run.errlines)
    assert results[keyed.FIELD]["host"] == "gpu1" and results[keyed.FIELD]["run_id"] == RUN
    assert keyed.problem(results, key, keyed.writer(results)) is None
    results["verdict"] = "accept"
    assert "does not match its content" in (keyed.problem(results, key) or "")


@pytest.mark.slow  # the shared torchrun run, or a run of its own
def test_a_run_given_a_key_others_can_read_is_a_usage_error(tmp_path: Path, key_file: Path) -> None:
    key_file.chmod(0o644)
    run = pytest_forked(ROOT, job_env(), ["acceptance/test_world.py", "--key-file", str(key_file), "--report-dir",
                                          str(tmp_path / "report")], tmp_path)
    said = "\n".join(run.outlines + run.errlines)
    assert run.ret == 2 and f"chmod 600 {key_file}" in said, said


def test_hmac_covers_content_host_and_run_id() -> None:
    key = b"k" * 32
    record = {"run_id": "r1", "nodes": [{"host": "n1", "node_rank": 0}], "tests": [{"value": 1.5}]}
    signed = keyed.sign(record, key, "n1")
    assert keyed.problem(signed, key, "n1") is None
    assert keyed.problem({**signed, "tests": [{"value": 1.6}]}, key) is not None
    assert "its HMAC is for run 'r1'" in (keyed.problem({**signed, "run_id": "r2"}, key) or "")
    assert "was made on 'n1', not on 'n2'" in (keyed.problem(signed, key, "n2") or "")
    moved = {**signed, keyed.FIELD: {**signed[keyed.FIELD], "host": "n2"}}
    assert "does not match its content" in (keyed.problem(moved, key) or "")
    assert "does not match" in (keyed.problem(signed, b"x" * 32) or "")
