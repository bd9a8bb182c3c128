"""The health DaemonSet on Kubernetes: rendered by render.sh, validated, and its two containers' commands run here.

The health container's command runs on a made-up GPU node (tests/helpers/health_node.py) with /state at a temporary
directory; the label-node container's command (launch/k8s/health_taint.py) then patches a node of a fake API
server (tests/launch/test_launch_k8s_phases.py's FakeApi): tainted with the first failure while the node is not
healthy, untainted once it is, every other taint kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from health_node import GpuNode
from k8s_api import FakeApi, k8s_node

from torchrun_job import ROOT

RENDER = ROOT / "launch" / "k8s" / "render.sh"
PARAMS = {"CG_IMAGE": "registry.example/cg:1", "CG_NAMESPACE": "gpu-ops", "CG_NODE_SELECTOR":
          "nvidia.com/gpu.present=true", "CG_GPUS_PER_NODE": "8"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
EXCLUDED = {"key": "clustergate.io/excluded", "value": "r0412", "effect": "NoSchedule"}

pytestmark = pytest.mark.skipif(shutil.which("envsubst") is None,
                                reason="envsubst not installed (Debian: apt-get install gettext-base)")


def daemonset(**params: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CG_")} | PARAMS | params
    proc = subprocess.run(["bash", str(RENDER), "health-daemonset.yaml"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "${CG_" not in proc.stdout
    [doc] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    kv.validate(doc, "1.30", strict=True)
    return doc


def containers(ds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}


def test_the_daemonset_runs_health_on_every_selected_node_with_the_hosts_view() -> None:
    ds = daemonset()
    pod = ds["spec"]["template"]["spec"]
    assert ds["kind"] == "DaemonSet" and ds["metadata"]["namespace"] == "gpu-ops"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "clustergate-labeller"  # label-nodes-rbac.yaml's: get and patch nodes
    health, label = containers(ds)["health"], containers(ds)["label-node"]
    env = {e["name"]: e.get("value") for e in health["env"]}
    assert env["CLUSTERGATE_HOST_ROOT"] == "/host" and env["CLUSTERGATE_GPUS_PER_NODE"] == "8"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "resources" in health and "limits" in health["resources"]
    assert "nvidia.com/gpu" not in health["resources"]["limits"]  # it watches every GPU, takes none
    assert "python3 -m clustergate health --report-dir /state --skip foreign_processes" in health["command"][2]
    mounts = {c: {m["name"] for m in containers(ds)[c]["volumeMounts"]} for c in ("health", "label-node")}
    assert mounts == {"health": {"state", "host-proc", "host-sys", "host-dev"}, "label-node": {"state", "api-token"}}
    assert label["command"][:3] == ["python3", "launch/k8s/health_taint.py", "/state/health.json"]
    assert label["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert label["securityContext"]["runAsNonRoot"] is True  # the image's own user: it only reads and calls the API
    assert health["securityContext"]["runAsUser"] == 0  # the kernel log is root's to read


def _run_health(node: GpuNode, state: Path) -> None:
    """The health container's one pass (its loop's body), from the checkout, /state at ``state``."""
    command = containers(daemonset())["health"]["command"][2]
    one_pass = command.split("do ", 1)[1].split(";", 1)[0].replace("/state", str(state))
    env = {**node.env(), "CLUSTERGATE_GPUS_PER_NODE": "8"}
    subprocess.run(["bash", "-c", one_pass], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _label(state: Path, api: FakeApi, token: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [part.replace("/state", str(state)).replace("$(NODE_NAME)", "gpu-a01")
               for part in containers(daemonset())["label-node"]["command"]]
    command = [sys.executable if part == "python3" else part for part in command]
    every = command.index("--every")
    del command[every:every + 2]  # one pass, not forever
    return subprocess.run([*command, "--api", api.url, "--token-file", str(token), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_an_unhealthy_node_is_tainted_with_its_first_failure_and_untainted_once_healthy(tmp_path: Path) -> None:
    node, state, token = GpuNode(tmp_path / "host"), tmp_path / "state", tmp_path / "token"
    token.write_text("t0ken\n")
    node.gpu(5)["state"]["pcie"] = {"width": 8}
    _run_health(node, state)
    api = FakeApi({"gpu-a01": k8s_node("gpu-a01", [GPU_TAINT, EXCLUDED])})
    proc = _label(state, api, token)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    a01 = api.nodes["gpu-a01"]
    assert a01["metadata"]["labels"]["clustergate.io/health"] == "unhealthy"
    assert a01["metadata"]["annotations"]["clustergate.io/health-reason"].startswith(
        "clustergate: health: 1 failure: gpu-node-07 gpu 5 serial 1652923017305: pcie_link = Gen5 x8 (expected Gen5 "
        "x16)")
    assert a01["spec"]["taints"] == [GPU_TAINT, EXCLUDED, {"key": "clustergate.io/unhealthy", "effect": "NoSchedule"}]
    node.gpu(5)["state"]["pcie"] = {"width": 16}
    _run_health(node, state)
    assert _label(state, api, token).returncode == 0
    assert a01["metadata"]["labels"]["clustergate.io/health"] == "healthy"
    assert a01["spec"]["taints"] == [GPU_TAINT, EXCLUDED]  # its own taint gone, the merge's and the GPU's kept
    assert "clustergate.io/health-reason" not in a01["metadata"]["annotations"]


def test_a_report_that_stops_coming_counts_as_not_healthy(tmp_path: Path) -> None:
    state, token = tmp_path / "state", tmp_path / "token"
    token.write_text("t0ken\n")
    api = FakeApi({"gpu-a01": k8s_node("gpu-a01", [])})
    early = _label(state, api, token)
    assert early.returncode == 0 and "no report yet" in early.stdout and api.patches == []
    assert _label(state, api, token, "--max-age", "0").returncode == 0
    assert "no report in" in api.nodes["gpu-a01"]["metadata"]["annotations"]["clustergate.io/health-reason"]
    state.mkdir()
    (state / "health.json").write_text(json.dumps({"status": "healthy", "failures": []}))
    old = time.time() - 3600
    os.utime(state / "health.json", (old, old))
    assert _label(state, api, token).returncode == 0
    a01 = api.nodes["gpu-a01"]
    assert a01["metadata"]["labels"]["clustergate.io/health"] == "unhealthy"
    said = re.search(r"the last report is (\d+) s old", a01["metadata"]["annotations"]["clustergate.io/health-reason"])
    # 3600 s, plus the seconds the labeller took to start and read it (bound: 60 s, a hang guard on 2 busy cores)
    assert said and 3600 <= int(said[1]) <= 3660, a01["metadata"]["annotations"]


def test_without_rights_the_labeller_says_why(tmp_path: Path) -> None:
    state, token = tmp_path / "state", tmp_path / "token"
    token.write_text("t0ken\n")
    state.mkdir()
    (state / "health.json").write_text(json.dumps({"status": "healthy", "failures": []}))
    proc = _label(state, FakeApi({}, status=403), token)
    assert proc.returncode == 1 and "forbidden" in proc.stderr and "label-nodes-rbac.yaml" in proc.stderr
