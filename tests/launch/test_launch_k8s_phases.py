"""The phases on Kubernetes: render.sh with CG_PHASE=node|merge|fabric|signoff, parsed, checked, and run.

The containers' commands are taken from the rendered manifests and run here with /reports pointed at
a temporary directory: the node phase's torchrun line (on CPU, a cheap test), the merge's two
containers on synthetic node results (the log of the second is exactly accepted-hosts.txt), and the
sign-off; so the quoting Kubernetes hands to bash is the quoting tested.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_runs import node_results, write_node
from k8s_api import FakeApi, k8s_node

from torchrun_job import ROOT, job_env

RENDER = ROOT / "launch" / "k8s" / "render.sh"
BASE = {"CG_RUN_ID": "r0412", "CG_IMAGE": "registry.example/cg:1"}

pytestmark = pytest.mark.skipif(shutil.which("envsubst") is None,
                                reason="envsubst not installed (Debian: apt-get install gettext-base)")


def render(**params: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CG_")} | params
    return subprocess.run(["bash", str(RENDER)], env=env, capture_output=True, text=True, timeout=30)


def docs(**params: str) -> dict[str, dict[str, Any]]:
    proc = render(**{**BASE, **params})
    assert proc.returncode == 0, proc.stderr
    out = {d["kind"]: d for d in yaml.safe_load_all(proc.stdout) if d}
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    for doc in out.values():
        kv.validate(doc, "1.30", strict=True)
    return out


def pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def run_here(command: list[str], reports: Path, extra_env: dict[str, str] | None = None,
             timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """A container's command, run from the checkout with /reports at ``reports``."""
    argv = [part.replace("/reports", str(reports)) for part in command]
    return subprocess.run(argv, cwd=ROOT, env=job_env(extra_env), text=True, capture_output=True, timeout=timeout)


def test_node_phase_is_an_indexed_job_where_each_node_fails_alone() -> None:
    job = docs(CG_PHASE="node", CG_NODES="16")["Job"]
    assert job["metadata"]["name"] == "cg-r0412-node"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 16
    assert spec["backoffLimitPerIndex"] == 0 and "backoffLimit" not in spec  # one failed node stops no other
    p = pod(job)
    [anti] = p["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    [c] = p["containers"]
    assert env_of(c)["CLUSTERGATE_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert c["command"][:2] == ["bash", "-c"] and c["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert c["command"][2] == ("exec torchrun --standalone --nproc-per-node=8 -m pytest acceptance -m 'not multinode' "
                               "--report-dir /reports/r0412/nodes/$CLUSTERGATE_NODE_NAME")


@pytest.mark.slow
def test_node_phase_command_runs_the_single_node_suite(tmp_path: Path) -> None:
    [c] = pod(docs(CG_PHASE="node", CG_GPUS_PER_NODE="1",
                   CG_PYTEST_ARGS="acceptance/test_world.py --level quick")["Job"])["containers"]
    env = {k: v for k, v in env_of(c).items() if isinstance(v, str)}
    assert env["CLUSTERGATE_RUN_ID"] == "r0412"  # every node's results.json names the run: merge takes only its own
    proc = run_here(c["command"], tmp_path, {**env, "CLUSTERGATE_NODE_NAME": "k8s-node-a"})
    results = tmp_path / "r0412" / "nodes" / "k8s-node-a" / "results.json"
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    recorded = json.loads(results.read_text())
    assert recorded["nodes"][0]["host"] == "k8s-node-a" and recorded["run_id"] == "r0412"
    # One file of the suite, as CG_PYTEST_ARGS asked: a partial node run, which merge never accepts.
    assert proc.returncode == 1 and recorded["verdict"] == "partial" and not recorded["error"]


def test_merge_job_prints_exactly_the_accepted_hosts(tmp_path: Path) -> None:
    job = docs(CG_PHASE="merge", CG_EXPECT_HOSTS="node-[1-3]")["Job"]
    p = pod(job)
    [merge], [hosts] = p["initContainers"], p["containers"]
    assert (merge["name"], hosts["name"]) == ("merge", "accepted-hosts") and job["spec"]["backoffLimit"] == 0
    for i, name in enumerate(["node-1", "node-2"]):  # node-3 never wrote anything: excluded as missing
        write_node(tmp_path / "r0412" / "nodes", name, node_results(name, i))
    merged = run_here(merge["command"], tmp_path)
    assert merged.returncode == 0, merged.stdout + merged.stderr  # merge's 1 (a node excluded) is a finding
    assert "excluded: node-3 (retest): expected, but no result" in merged.stdout
    printed = run_here(hosts["command"], tmp_path)
    assert printed.stdout == "node-1\nnode-2\n" == (tmp_path / "r0412" / "accepted-hosts.txt").read_text()
    # ... which is what the fabric phase is rendered from.
    fabric = docs(CG_PHASE="fabric", CG_HOSTS=printed.stdout)["Job"]
    assert fabric["spec"]["completions"] == 2


def test_merge_that_cannot_read_its_input_fails_the_job(tmp_path: Path) -> None:
    [merge] = pod(docs(CG_PHASE="merge")["Job"])["initContainers"]
    proc = run_here(merge["command"], tmp_path)  # no node phase ran: no directory under nodes/
    assert proc.returncode == 2 and "nodes/*: not a directory" in proc.stderr


def test_fabric_phase_runs_on_the_accepted_hosts_only() -> None:
    out = docs(CG_PHASE="fabric", CG_HOSTS="gpu-a01\ngpu-a03,gpu-a04")
    job, svc = out["Job"], out["Service"]
    assert job["metadata"]["name"] == svc["metadata"]["name"] == "cg-r0412-fabric"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    [term] = pod(job)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["gpu-a01", "gpu-a03",
                                                                                        "gpu-a04"]}]
    [c] = pod(job)["containers"]
    assert c["command"] == ["bash", "-c", "exec bash launch/node.sh acceptance -m multinode"]
    env = env_of(c)
    assert env["CLUSTERGATE_REPORT_DIR"] == "/reports/r0412/fabric" and env["CLUSTERGATE_NNODES"] == "3"
    assert env["CLUSTERGATE_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_one_job_over_every_node_is_unchanged_but_for_the_node_name() -> None:
    job = docs(CG_RUN_ID="")["Job"]
    assert "nodeAffinity" not in pod(job)["affinity"]
    env = env_of(pod(job)["containers"][0])
    assert env["CLUSTERGATE_REPORT_DIR"] == "/reports/clustergate-$(CLUSTERGATE_RDZV_ID)"


def test_signoff_job(tmp_path: Path) -> None:
    [c] = pod(docs(CG_PHASE="signoff")["Job"])["containers"]
    assert c["command"] == ["bash", "-c", "exec python3 -m clustergate signoff /reports/r0412  "]
    proc = run_here(c["command"], tmp_path)
    assert proc.returncode == 2 and "give the run directory that `clustergate merge" in proc.stderr


def test_merge_and_signoff_take_the_site_thresholds(tmp_path: Path) -> None:
    """CG_THRESHOLDS reaches merge and signoff as --thresholds; the file is read (a missing one: exit 2)."""
    [merge] = pod(docs(CG_PHASE="merge", CG_THRESHOLDS="site/thresholds.yaml")["Job"])["initContainers"]
    [signoff] = pod(docs(CG_PHASE="signoff", CG_THRESHOLDS="site/thresholds.yaml")["Job"])["containers"]
    assert "--thresholds 'site/thresholds.yaml'" in merge["command"][2]
    assert signoff["command"][2].endswith("signoff /reports/r0412 --thresholds 'site/thresholds.yaml' ")
    proc = run_here(signoff["command"], tmp_path)
    assert proc.returncode == 2 and "--thresholds" in proc.stderr and "site/thresholds.yaml" in proc.stderr


def test_every_phase_takes_the_results_store() -> None:
    store = "/reports/fleet.db"
    [node] = pod(docs(CG_PHASE="node", CG_STORE=store)["Job"])["containers"]
    assert env_of(node)["CLUSTERGATE_STORE"] == store
    assert "CLUSTERGATE_STORE" not in env_of(pod(docs(CG_PHASE="node")["Job"])["containers"][0])
    [merge] = pod(docs(CG_PHASE="merge", CG_STORE=store)["Job"])["initContainers"]
    [signoff] = pod(docs(CG_PHASE="signoff", CG_STORE=store)["Job"])["containers"]
    assert f"--store '{store}'" in merge["command"][2] and f"--store '{store}'" in signoff["command"][2]


@pytest.mark.parametrize(("params", "message"), [
    ({"CG_PHASE": "nodes"}, "CG_PHASE='nodes': choose node, merge, fabric or signoff"),
    ({"CG_PHASE": "node", "CG_RUN_ID": ""}, "CG_PHASE=node needs CG_RUN_ID"),
    ({"CG_PHASE": "node", "CG_RUN_ID": "Run_1"}, "lower-case letters, digits and '-'"),
    ({"CG_PHASE": "fabric"}, "CG_PHASE=fabric needs CG_HOSTS"),
    ({"CG_PHASE": "fabric", "CG_HOSTS": "gpu[1-4]"}, "'gpu[1-4]' is not a Kubernetes node name"),
    ({"CG_PHASE": "node", "CG_HOSTS": "a"}, "CG_HOSTS is for CG_PHASE=fabric"),
    ({"CG_PHASE": "merge", "CG_EXPECT_HOSTS": "a;rm -rf /"}, "give a hostlist"),
    ({"CG_PHASE": "signoff", "CG_IMAGE": ""}, "set CG_REGISTRY"),
    ({"CG_PHASE": "merge", "CG_LABEL_NODES": "1"}, "CG_LABEL_NODES=1 needs CG_NAMESPACE"),
    ({"CG_PHASE": "node", "CG_LABEL_NODES": "1", "CG_NAMESPACE": "gpu"}, "CG_LABEL_NODES=1 is for CG_PHASE=merge"),
    ({"CG_PHASE": "node", "CG_STORE": "/tmp/fleet.db"}, "a file on the reports volume"),
])
def test_render_refuses_bad_phase_parameters(params: dict[str, str], message: str) -> None:
    proc = render(**{**BASE, **params})
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_merge_with_label_nodes_renders_a_least_privilege_labeller() -> None:
    out = docs(CG_PHASE="merge", CG_LABEL_NODES="1", CG_NAMESPACE="gpu-burnin")
    assert set(out) == {"Job", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    role, binding, account = out["ClusterRole"], out["ClusterRoleBinding"], out["ServiceAccount"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "clustergate-labeller",
                                    "namespace": "gpu-burnin"}]
    assert account["metadata"] == {"name": "clustergate-labeller", "namespace": "gpu-burnin",
                                   "labels": {"app.kubernetes.io/name": "clustergate"}}
    job = out["Job"]
    p = pod(job)
    assert job["metadata"]["namespace"] == "gpu-burnin" and p["serviceAccountName"] == "clustergate-labeller"
    assert p["automountServiceAccountToken"] is False  # only the labeller mounts a token, below
    merge, hosts, label = p["initContainers"][0], p["containers"][0], p["containers"][1]
    assert label["name"] == "label-nodes"
    assert label["command"] == ["python3", "launch/k8s/label_nodes.py", "/reports/r0412", "--run", "r0412"]
    token_mounts = {c["name"]: [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "api-token"]
                    for c in (merge, hosts, label)}
    assert token_mounts == {"merge": [], "accepted-hosts": [],
                            "label-nodes": ["/var/run/secrets/kubernetes.io/serviceaccount"]}
    [token] = [v for v in p["volumes"] if v["name"] == "api-token"]
    assert [next(iter(s)) for s in token["projected"]["sources"]] == ["serviceAccountToken", "configMap"]
    # Without the flag: no RBAC, no labeller, no account.
    plain = docs(CG_PHASE="merge")
    assert set(plain) == {"Job"} and "serviceAccountName" not in pod(plain["Job"])
    assert [c["name"] for c in pod(plain["Job"])["containers"]] == ["accepted-hosts"]


def _label_command(tmp_path: Path) -> list[str]:
    [_, label] = pod(docs(CG_PHASE="merge", CG_LABEL_NODES="1", CG_NAMESPACE="gpu")["Job"])["containers"]
    (tmp_path / "token").write_text("t0ken\n")
    return label["command"]


def test_label_nodes_marks_each_node_from_the_merge_and_keeps_the_rest(tmp_path: Path) -> None:
    run = tmp_path / "r0412"
    run.mkdir()
    (run / "accepted-hosts.txt").write_text("gpu-a01\n")
    (run / "excluded-hosts.txt").write_text("gpu-a02\tmatmul_bf16_tflops=512 TFLOPS, expected >= 700\tretest\n"
                                            "gpu-a09\texpected, but no result\n")  # a list without actions too
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    old = {"key": "clustergate.io/excluded", "value": "r0301", "effect": "NoSchedule"}
    api = FakeApi({"gpu-a01": k8s_node("gpu-a01", [gpu_taint, old], **{"clustergate.io/reason": "old"}),
                   "gpu-a02": k8s_node("gpu-a02", [gpu_taint])}, conflicts=1)
    command = _label_command(tmp_path)
    proc = run_here([*command, "--api", api.url, "--token-file", str(tmp_path / "token")], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    a01, a02 = api.nodes["gpu-a01"], api.nodes["gpu-a02"]
    assert a01["metadata"]["labels"] == {"kubernetes.io/hostname": "gpu-a01", "clustergate.io/verdict": "accept",
                                         "clustergate.io/run": "r0412"}
    assert a01["spec"]["taints"] == [gpu_taint] and a01["metadata"]["annotations"] == {}  # re-accepted: untainted
    assert a02["metadata"]["labels"]["clustergate.io/verdict"] == "excluded"
    assert a02["metadata"]["annotations"] == {"clustergate.io/reason": "matmul_bf16_tflops=512 TFLOPS, expected >= 700",
                                              "clustergate.io/action": "retest"}
    assert a02["spec"]["taints"] == [gpu_taint, {"key": "clustergate.io/excluded", "value": "r0412",
                                                 "effect": "NoSchedule"}]
    assert len(api.patches) == 3  # one conflict, read again and patched
    assert "gpu-a09: not marked excluded, tainted NoSchedule: no such Kubernetes node" in proc.stderr
    assert "2 of 3 nodes marked (1 accepted, 2 excluded) for run r0412; 1 not Kubernetes nodes" in proc.stdout


def test_label_nodes_without_rights_fails_the_job_saying_why(tmp_path: Path) -> None:
    run = tmp_path / "r0412"
    run.mkdir()
    (run / "accepted-hosts.txt").write_text("gpu-a01\n")
    (run / "excluded-hosts.txt").write_text("")
    api = FakeApi({}, status=403)
    proc = run_here([*_label_command(tmp_path), "--api", api.url, "--token-file", str(tmp_path / "token")], tmp_path)
    assert proc.returncode == 1 and "forbidden" in proc.stderr and "label-nodes-rbac.yaml" in proc.stderr
    missing = run_here([*_label_command(tmp_path)], tmp_path / "elsewhere")
    assert missing.returncode == 2 and "did the merge run?" in missing.stderr
