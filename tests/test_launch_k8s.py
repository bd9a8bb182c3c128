"""The Kubernetes manifests: rendered by launch/k8s/render.sh, parsed, and checked where it matters."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RENDER = ROOT / "launch" / "k8s" / "render.sh"

pytestmark = pytest.mark.skipif(shutil.which("envsubst") is None,
                                reason="envsubst not installed (Debian: apt-get install gettext-base)")


def render(manifest: str = "clustergate.yaml", **params: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CG_")} | params
    return subprocess.run(["bash", str(RENDER), manifest], env=env, capture_output=True, text=True, timeout=30)


def docs(manifest: str = "clustergate.yaml", **params: str) -> dict[str, dict[str, Any]]:
    proc = render(manifest, **params)
    assert proc.returncode == 0, proc.stderr
    return {d["kind"]: d for d in yaml.safe_load_all(proc.stdout) if d}


PARAMS = {"CG_NAME": "cg-h100", "CG_NODES": "4", "CG_GPUS_PER_NODE": "8", "CG_IMAGE": "registry.example/cg:1",
          "CG_RDMA_RESOURCE": "rdma/ib", "CG_RDMA_COUNT": "8"}


def _container(job: dict[str, Any]) -> dict[str, Any]:
    [container] = job["spec"]["template"]["spec"]["containers"]
    return container


def test_indexed_job_with_headless_service() -> None:
    out = docs(**PARAMS)
    svc, job = out["Service"], out["Job"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"batch.kubernetes.io/job-name": "cg-h100"}
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"] == job["metadata"]["name"] == "cg-h100"
    assert pod["restartPolicy"] == "Never"
    [anti] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"


def test_gpu_and_rdma_requests_are_parameters() -> None:
    limits = _container(docs(**PARAMS)["Job"])["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 8, "rdma/ib": 8}
    no_rdma = _container(docs(**{**PARAMS, "CG_RDMA_RESOURCE": "", "CG_GPUS_PER_NODE": "2"})["Job"])
    assert no_rdma["resources"]["limits"] == {"nvidia.com/gpu": 2}


def test_every_pod_runs_node_script_with_rendezvous_at_pod_zero() -> None:
    job = docs(**PARAMS)["Job"]
    container = _container(job)
    assert container["command"] == ["bash", "-c", "exec bash launch/node.sh acceptance"]
    env = {e["name"]: e for e in container["env"]}
    assert env["CLUSTERGATE_RDZV_ENDPOINT"]["value"] == "cg-h100-0.cg-h100:29500"  # <job>-0.<service>
    assert env["CLUSTERGATE_NNODES"]["value"] == "4" and env["CLUSTERGATE_GPUS_PER_NODE"]["value"] == "8"
    assert env["CLUSTERGATE_NODE_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert "controller-uid" in env["CLUSTERGATE_RDZV_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    # Kubernetes' own $(VAR) reference survives rendering: one report directory per Job.
    assert env["CLUSTERGATE_REPORT_DIR"]["value"] == "/reports/cg-h100-$(CLUSTERGATE_RDZV_ID)"
    assert int(env["CLUSTERGATE_RDZV_TIMEOUT"]["value"]) >= 600
    # node.sh turns these into torchrun's c10d rendezvous (its torchrun line is checked in test_launch_slurm).
    node_sh = (ROOT / "launch" / "node.sh").read_text()
    assert '--rdzv-backend=c10d --rdzv-endpoint="$CLUSTERGATE_RDZV_ENDPOINT"' in node_sh


def test_reports_on_a_shared_volume() -> None:
    job = docs(**PARAMS, CG_PVC="team-reports")["Job"]
    pod = job["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in _container(job)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["reports"] == "/reports"
    assert volumes["reports"]["persistentVolumeClaim"]["claimName"] == "team-reports"
    assert mounts["dshm"] == "/dev/shm" and volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    pvc = docs("reports-pvc.yaml", CG_PVC="team-reports")["PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == "team-reports" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "storageClassName" not in pvc["spec"]  # empty: the cluster's default class
    assert docs("reports-pvc.yaml", CG_STORAGE_CLASS="cephfs")["PersistentVolumeClaim"]["spec"][
        "storageClassName"] == "cephfs"


def test_nccl_settings_from_an_optional_configmap() -> None:
    [source] = _container(docs(**PARAMS)["Job"])["envFrom"]
    assert source["configMapRef"] == {"name": "clustergate-nccl", "optional": True}


@pytest.mark.parametrize(("params", "message"), [
    ({"CG_IMAGE": ""}, "set CG_IMAGE"),
    ({"CG_IMAGE": "x", "CG_NODES": "two"}, "CG_NODES=two is not a whole number"),
])
def test_render_refuses_bad_parameters(params: dict[str, str], message: str) -> None:
    proc = render(**params)
    assert proc.returncode == 2 and message in proc.stderr


def test_manifests_valid_against_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (pip install "
                                                           "kubernetes-validate) for the schema check")
    for manifest, params in (("clustergate.yaml", PARAMS), ("clustergate.yaml", {"CG_IMAGE": "x"}),
                             ("reports-pvc.yaml", {})):
        for doc in docs(manifest, **params).values():
            kv.validate(doc, "1.30", strict=True)
