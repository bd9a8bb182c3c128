"""The Kubernetes manifests: rendered by launch/k8s/render.sh, parsed, and checked where it matters."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import clustergate

ROOT = Path(__file__).resolve().parents[2]
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
    ({"CG_IMAGE": ""}, "set CG_REGISTRY to the registry the clustergate image was pushed to"),
    ({"CG_IMAGE": "", "CG_REGISTRY": "https://acme"}, "CG_REGISTRY='https://acme' is not a registry path"),
    ({"CG_IMAGE": "x", "CG_NODES": "two"}, "CG_NODES='two' is not a whole number"),
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


# Each variable with a value that would have changed the manifest (a line break adds YAML; quotes, $( ) and ;
# reach bash -c) or is simply not of its kind. The first is the reported injection: privileged: true via CG_IMAGE.
BAD_VALUES = [
    ("CG_IMAGE", "registry.example/cg:1\n          securityContext: {privileged: true}"),
    ("CG_IMAGE", "registry.example/cg:1 --privileged"),
    ("CG_PYTEST_ARGS", "acceptance; curl http://x | sh"),
    ("CG_PYTEST_ARGS", "acceptance $(id)"),
    ("CG_PYTEST_ARGS", 'acceptance"]\n          securityContext: {privileged: true}'),
    ("CG_PYTEST_ARGS", "acceptance\n-m multinode"),
    ("CG_NAME", "CG_H100"),
    ("CG_NAME", "cg\n  namespace: kube-system"),
    ("CG_NODES", "0"),
    ("CG_GPUS_PER_NODE", "8\n"),
    ("CG_RDZV_PORT", "70000"),
    ("CG_WORKDIR", "opt/clustergate"),
    ("CG_WORKDIR", "/opt/clustergate; rm -rf /"),
    ("CG_SHARED_DIR", '/reports"'),
    ("CG_REPORT_DIR", "/reports/$(id)"),
    ("CG_PVC", "team reports"),
    ("CG_NCCL_CONFIGMAP", "nccl\n  optional: false"),
    ("CG_SHM_SIZE", "64Gi\n  privileged: true"),
    ("CG_RDMA_RESOURCE", "rdma/ib: 1\n              hostPath"),
    ("CG_NODE_SELECTOR", "pool=h100 gpu"),
    ("CG_NODE_SELECTOR", "=h100"),
    ("CG_TOLERATIONS", "nvidia.com/gpu:Sometimes"),
    ("CG_TOLERATIONS", 'a=b"}, {"operator": "Exists'),
    ("CG_LABEL_NODES", "yes"),
]


@pytest.mark.parametrize(("variable", "value"), BAD_VALUES, ids=[f"{v}-{i}" for i, (v, _) in enumerate(BAD_VALUES)])
def test_every_value_is_checked_and_the_error_names_its_variable(variable: str, value: str) -> None:
    proc = render(**{**PARAMS, variable: value})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout  # nothing rendered, not half a manifest
    [line] = proc.stderr.splitlines()  # one clear error
    assert line.startswith(f"render.sh: {variable}") or f" {variable}=" in line, line


def test_values_of_their_kind_render_exactly() -> None:
    image = "registry.example:5000/team/cg@sha256:" + "ab" * 32
    job = docs(**{**PARAMS, "CG_IMAGE": image, "CG_PYTEST_ARGS": "acceptance/test_world.py -k test_world --level=quick",
                  "CG_SHM_SIZE": "1.5Gi"})["Job"]
    container = _container(job)
    assert container["image"] == image
    assert container["command"][2] == "exec bash launch/node.sh acceptance/test_world.py -k test_world --level=quick"
    assert job["spec"]["template"]["spec"]["volumes"][1]["emptyDir"]["sizeLimit"] == "1.5Gi"


def _pods(**params: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for manifest, extra in (("clustergate.yaml", {}), ("node-phase.yaml", {"CG_RUN_ID": "r1"}),
                            ("merge-phase.yaml", {"CG_RUN_ID": "r1"}), ("signoff-phase.yaml", {"CG_RUN_ID": "r1"})):
        out.append((manifest, docs(manifest, **{**PARAMS, **extra, **params})["Job"]["spec"]["template"]["spec"]))
    return out


def test_pods_run_with_no_api_token_no_escalation_and_only_ipc_lock() -> None:
    for manifest, pod in _pods():
        assert pod["automountServiceAccountToken"] is False, manifest
        assert "serviceAccountName" not in pod and "hostNetwork" not in pod, manifest
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged"), (manifest, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (manifest, c["name"])
            gpu = "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
            assert sc["capabilities"].get("add", []) == (["IPC_LOCK"] if gpu else []), (manifest, c["name"])
            # root only where it must be: IPC_LOCK takes effect for root alone, and whoever writes the reports
            # volume writes as the GPU pods that made its directories; a container that only reads runs as the
            # image's own user (the Dockerfile's USER 10001)
            writes = any(not m.get("readOnly") for m in c.get("volumeMounts", []) if m["name"] == "reports")
            assert (sc.get("runAsUser"), sc.get("runAsNonRoot")) == ((0, None) if gpu or writes else (None, True)), \
                (manifest, c["name"])


def test_the_image_is_the_registrys_clustergate_at_this_checkouts_version() -> None:
    """CG_REGISTRY names where the image was pushed; the name and tag are the Dockerfile's, as launch/image.sh
    makes them (the README's build and push commands), in every manifest and container."""
    version = clustergate.__version__  # pyproject.toml's, which launch/image.sh reads
    params = {k: v for k, v in PARAMS.items() if k != "CG_IMAGE"}
    images = {c["image"] for _, pod in _pods(**params, CG_IMAGE="", CG_REGISTRY="ghcr.io/acme")
              for c in pod.get("initContainers", []) + pod["containers"]}
    assert images == {f"ghcr.io/acme/clustergate:{version}"}
    built = subprocess.run(["bash", str(ROOT / "launch" / "image.sh"), "ghcr.io/acme"], capture_output=True, text=True)
    assert built.stdout == f"ghcr.io/acme/clustergate:{version}\n"
    assert {c["image"] for _, pod in _pods(CG_REGISTRY="ghcr.io/acme") for c in pod["containers"]} == \
        {"registry.example/cg:1"}  # CG_IMAGE, where given, is the image


def test_network_policy_admits_only_the_jobs_own_pods() -> None:
    out = docs(**PARAMS)
    policy, svc = out["NetworkPolicy"], out["Service"]
    own = {"batch.kubernetes.io/job-name": "cg-h100"}  # the Job controller puts it on every pod of the Job
    assert policy["spec"]["podSelector"] == {"matchLabels": own} and svc["spec"]["selector"] == own
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": own}}]}]  # no ports: NCCL's vary
    node_phase = docs("node-phase.yaml", **PARAMS, CG_RUN_ID="r1")["NetworkPolicy"]
    assert node_phase["spec"] == {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"], "ingress": []}
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(policy, "1.30", strict=True)
    kv.validate(node_phase, "1.30", strict=True)


def test_gpu_pools_node_selector_and_tolerations() -> None:
    params = {"CG_NODE_SELECTOR": "nvidia.com/gpu.present=true,pool=h100",
              "CG_TOLERATIONS": "nvidia.com/gpu:NoSchedule,dedicated=gpu:NoExecute,spot"}
    wanted = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
              {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"},
              {"key": "spot", "operator": "Exists"}]
    pods = dict(_pods(**params))
    for manifest in ("clustergate.yaml", "node-phase.yaml"):
        assert pods[manifest]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "h100"}, manifest
    assert pods["clustergate.yaml"]["tolerations"] == wanted
    # The node phase also goes where an earlier run's CG_LABEL_NODES tainted a node excluded: to test it again.
    assert pods["node-phase.yaml"]["tolerations"] == [*wanted, {"key": "clustergate.io/excluded", "operator": "Exists",
                                                                "effect": "NoSchedule"}]
    # The GPU-less pods tolerate the pools' taints (a cluster of GPU nodes only) but are not pinned to them.
    for manifest in ("merge-phase.yaml", "signoff-phase.yaml"):
        assert pods[manifest]["tolerations"] == wanted and "nodeSelector" not in pods[manifest], manifest
    plain = dict(_pods())
    assert "nodeSelector" not in plain["clustergate.yaml"] and "tolerations" not in plain["clustergate.yaml"]
    assert "tolerations" not in plain["merge-phase.yaml"]
    kv = pytest.importorskip("kubernetes_validate")
    for manifest in ("clustergate.yaml", "node-phase.yaml", "merge-phase.yaml", "signoff-phase.yaml"):
        for doc in docs(manifest, **PARAMS, **params, CG_RUN_ID="r1").values():
            kv.validate(doc, "1.30", strict=True)
