"""launch/slurm/healthcheck.sh without a cluster: where it writes, what it refuses, when it drains and resumes.

scontrol is a recorder that shows a node state the test chose. The quick tier's Python is a stand-in where
node.sh starts torchrun: it writes the results.json the test chose. The health tier (the default) runs the
real ``clustergate health`` on a node the test makes up (tests/helpers/health_node.py: a fake NVML and the host's files
under CLUSTERGATE_HOST_ROOT). The real Python runs everything else: launch/safe_dir.py,
launch/health_reason.py, the node's name. tests/launch/test_slurm_signoff.py runs the same script on the local Slurm
cluster.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from health_node import GpuNode

from torchrun_job import ROOT

sys.path.insert(0, str(ROOT / "launch"))
import safe_dir  # noqa: E402

HEALTHCHECK = ROOT / "launch" / "slurm" / "healthcheck.sh"
NODE = "node3"
REJECT = {"verdict": "reject", "error": None, "tests": [
    {"nodeid": "acceptance/test_gpu_compute.py::test_matmul_tflops[bf16]", "outcome": "failed",
     "message": "matmul_bf16_tflops=0.16 TFLOPS, expected >= 1000 [cpu, rank 0 node3]"}]}
ACCEPT = {"verdict": "accept", "error": None, "tests": []}


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


class Node:
    """A node as healthcheck.sh sees it: its Slurm state (a file the fake scontrol shows) and its verdict."""

    def __init__(self, where: Path, real_python: str = sys.executable) -> None:
        self.where = where
        where.mkdir(parents=True, exist_ok=True)
        self.host_root = where / "host"  # the host's /sys, /proc, /dev as clustergate health reads them: none
        self.host_root.mkdir(exist_ok=True)
        self.calls = where / "scontrol.log"
        self.state_file = where / "state"
        self.results = where / "results.json"
        self.bin = where / "bin"
        self.bin.mkdir(exist_ok=True)
        _exe(self.bin / "scontrol", f"""#!/bin/bash
echo "$*" >> '{self.calls}'
[ "$1" = show ] && cat '{self.state_file}'
exit 0
""")
        self.python = _exe(where / "python", f"""#!/bin/bash
case $1 in
  launch/preflight.py) exit 0 ;;
  -m) [ "$2" = torch.distributed.run ] || exec '{real_python}' "$@"
      for a in "$@"; do [ "$a" = --help ] && exit 0; done
      while [ $# -gt 0 ]; do [ "$1" = --report-dir ] && dir=$2; shift; done
      cp '{self.results}' "$dir/results.json" && echo '{{}}' > "$dir/progress.jsonl"
      grep -q '"accept"' "$dir/results.json" ;;
  *) exec '{real_python}' "$@" ;;
esac
""")
        self.set_state("IDLE")
        self.set_verdict(ACCEPT)

    def set_state(self, state: str, reason: str = "") -> None:
        lines = [f"NodeName={NODE} Arch=x86_64 CoresPerSocket=1", f"   State={state} ThreadsPerCore=1 TmpDisk=0"]
        if reason:
            lines.append(f"   Reason={reason} [root@2026-11-24T12:00:00]")
        self.state_file.write_text("\n".join(lines) + "\n")

    def set_verdict(self, results: dict[str, object]) -> None:
        self.results.write_text(json.dumps(results))

    def scontrol_updates(self) -> list[str]:
        return [c for c in (self.calls.read_text().splitlines() if self.calls.exists() else []) if
                c.startswith("update")]

    def check(self, health: Path | None, *, env: dict[str, str] | None = None, user: str | None = None,
              script: Path = HEALTHCHECK, tier: str | None = "quick") -> subprocess.CompletedProcess[str]:
        """Run the script as slurmd would; ``tier`` None leaves CLUSTERGATE_HEALTH_TIER unset (the default)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CLUSTERGATE_", "TORCHINDUCTOR"))}
        base |= {"PATH": f"{self.bin}{os.pathsep}{base['PATH']}", "SLURMD_NODENAME": NODE,
                 "CLUSTERGATE_GPUS_PER_NODE": "0", "CLUSTERGATE_PYTHON": str(self.python),
                 "CLUSTERGATE_HOST_ROOT": str(self.host_root)}
        if tier is not None:
            base["CLUSTERGATE_HEALTH_TIER"] = tier
        if health is not None:
            base["CLUSTERGATE_HEALTH_DIR"] = str(health)
        cmd = ["bash", str(script)]
        if user:
            cmd = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", *cmd]
        return subprocess.run(cmd, env=base | (env or {}), capture_output=True, text=True, timeout=60)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "node")


def _runs(health: Path) -> list[Path]:
    return sorted(p for p in (health / NODE).iterdir() if p.is_dir() and p.name != "inductor-cache")


def test_each_check_gets_its_own_private_directory(node: Node, tmp_path: Path) -> None:
    health = tmp_path / "health"
    first, second = node.check(health), node.check(health)  # within the same second, as like as not
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    runs = _runs(health)
    assert len(runs) == 2 and all((r / "results.json").exists() and (r / "node.log").exists() for r in runs)
    for d in [health, health / NODE, *runs, health / NODE / "inductor-cache"]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert f"{NODE} passed in" in first.stdout and node.scontrol_updates() == []  # not drained: nothing to resume


@pytest.mark.parametrize("how", ["others can write it", "another user owns it", "a symlink to another's",
                                 "cache others can write"])
def test_a_directory_another_user_could_control_is_refused(node: Node, tmp_path: Path, how: str) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    health, env, setting = tmp_path / "health", {}, "CLUSTERGATE_HEALTH_DIR"
    if how == "others can write it":
        health.mkdir(mode=0o777)
        health.chmod(0o777)
    elif how == "another user owns it":
        (health / NODE).mkdir(parents=True)
        os.chown(health / NODE, nobody, -1)
    elif how == "a symlink to another's":
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, nobody, -1)
        health.mkdir()
        (health / NODE).symlink_to(theirs)
    else:
        cache = tmp_path / "cache"
        cache.mkdir()
        cache.chmod(0o1777)  # sticky is not enough for a directory torch loads pickles from
        env, setting = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}, "TORCHINDUCTOR_CACHE_DIR"
    proc = node.check(health, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"({setting})" in proc.stderr and "refusing directory" in proc.stderr, proc.stderr
    assert not list(tmp_path.rglob("node.log")) and node.scontrol_updates() == []


def test_the_safe_directory_rule() -> None:
    assert safe_dir.problems("/") == []
    assert safe_dir.problems("/tmp") != []  # world-writable itself: sticky does not make it ours
    with tempfile.TemporaryDirectory() as d:  # under /tmp: a sticky parent is fine
        assert safe_dir.problems(d) == []
        os.chmod(d, 0o770)
        assert "writable by its group" in safe_dir.problems(d)[0]
        os.chmod(d, 0o700)
        assert safe_dir.ensure(Path(d) / "a" / "b", create=True) == Path(os.path.realpath(d)) / "a" / "b"
        assert stat.S_IMODE(os.stat(Path(d) / "a").st_mode) == 0o700
        os.chmod(d, 0o757)
        with pytest.raises(ValueError, match="writable by others"):
            safe_dir.ensure(Path(d) / "a")  # a parent others can write, without the sticky bit


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A directory of user nobody's own under /tmp (tmp_path's parents are root's alone: nobody cannot enter)."""
    d = Path(tempfile.mkdtemp(prefix="cg-nobody-"))
    os.chown(d, pwd.getpwnam("nobody").pw_uid, -1)
    yield d
    shutil.rmtree(d, ignore_errors=True)


NOBODY_NEEDS = ("launch", "workloads/__init__.py", "workloads/node/__init__.py", "workloads/node/name.py",
                "conftest.py", "acceptance/conftest.py")
"""What the check reads as another user: the launch scripts and the node's naming rule (stdlib only), in a
checkout's layout (conftest.py and acceptance/ beside launch/: node.sh runs the checkout's suite, not an
installed one)."""


def readable_copy(into: Path) -> Path:
    """The parts of the checkout the check needs, copied where another user can read them (the checkout itself may
    lie under a directory only its owner may enter, as a clone in a ``mktemp -d`` does); its healthcheck.sh."""
    for rel in NOBODY_NEEDS:
        source, target = ROOT / rel, into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    for p in [into, *into.rglob("*")]:
        p.chmod(0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644)
    return into / HEALTHCHECK.relative_to(ROOT)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, setpriv and /usr/bin/python3 to run the check as another user")
def test_another_user_defaults_to_its_own_state_directory(tmp_path: Path, nobody_dir: Path) -> None:
    node = Node(nobody_dir / "node", real_python="/usr/bin/python3")  # stdlib only: safe_dir, the node's name
    for p in [node.where, *node.where.rglob("*")]:
        os.chown(p, pwd.getpwnam("nobody").pw_uid, -1)
    script = readable_copy(nobody_dir / "checkout")
    proc = node.check(None, env={"XDG_STATE_HOME": str(nobody_dir / "state"), "HOME": str(nobody_dir)},
                      user="nobody", script=script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run] = sorted((nobody_dir / "state" / "clustergate" / "health" / NODE).glob("2*"))
    assert run.stat().st_uid == pwd.getpwnam("nobody").pw_uid and (run / "results.json").exists()


def test_a_failing_node_is_drained_with_the_clustergate_prefix(node: Node, tmp_path: Path) -> None:
    node.set_verdict(REJECT)
    proc = node.check(tmp_path / "health")
    assert proc.returncode == 0, proc.stderr
    [update] = node.scontrol_updates()
    [run] = _runs(tmp_path / "health")
    assert update == (f"update nodename={NODE} state=drain reason=clustergate: reject: test_matmul_tflops[bf16]: "
                      f"matmul_bf16_tflops=0.16 TFLOPS, expected >= 1000 [cpu, rank 0 node3] (report: {run})")


@pytest.mark.parametrize(("state", "reason", "resumed"), [
    ("IDLE+DRAIN", "clustergate: reject: test_matmul_tflops[bf16]: ...", True),
    ("MIXED+DRAIN", "clustergate: health check did not finish within 300 s", True),  # draining: its epilog
    ("IDLE+DRAIN", "admin: fan 3 replaced, burn-in pending", False),
    ("IDLE+DRAIN", "clustergate sign-off: excluded in run r0412", False),  # not the health check's prefix
    ("IDLE", "", False),
])
def test_a_passing_node_is_resumed_only_from_a_clustergate_drain(node: Node, tmp_path: Path, state: str,
                                                                 reason: str, resumed: bool) -> None:
    node.set_state(state, reason)
    proc = node.check(tmp_path / "health")
    assert proc.returncode == 0, proc.stderr
    assert node.scontrol_updates() == ([f"update nodename={NODE} state=resume"] if resumed else [])
    assert ("resumed node3" in proc.stdout) == resumed


@pytest.mark.parametrize(("results", "resumed"), [
    ({"verdict": "partial", "error": None, "reason": "ran less than a complete run: (-k 'test_world')",
      "attestation": {"problems": []},
      "tests": [{"nodeid": "acceptance/test_world.py::test_world_matches_profile", "outcome": "passed"}]}, True),
    (REJECT, False),
])
def test_a_check_the_site_narrowed_passes_when_all_it_ran_passed(node: Node, tmp_path: Path,
                                                                 results: dict[str, object], resumed: bool) -> None:
    """The quick tier with -k in the site's arguments ends partial (status 1): where it ran the shipped suite (its
    attestation records no problem) the node is healthy and its clustergate drain undone; a failed test among the
    narrowed ones still drains it."""
    node.set_state("IDLE+DRAIN", "clustergate: reject: test_matmul_tflops[bf16]: ...")
    node.set_verdict(results)
    proc = node.check(tmp_path / "health")
    assert proc.returncode == 0, proc.stderr
    assert ("passed in" in proc.stdout and "(partial: " in proc.stdout) == resumed, proc.stdout + proc.stderr
    assert node.scontrol_updates()[-1:] == ([f"update nodename={NODE} state=resume"] if resumed else
                                            [node.scontrol_updates()[-1]]), node.scontrol_updates()
    assert ("state=drain" in " ".join(node.scontrol_updates())) != resumed


def _wait_for(predicate: object, timeout: float = 120) -> bool:  # a busy 2-core machine: generous
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize(("state", "reason", "checked"), [
    ("IDLE+DRAIN", "clustergate: reject: test_matmul_tflops[bf16]: ...", True),
    ("ALLOCATED+DRAIN", "clustergate: reject: ...", False),  # still running a job: not now
    ("IDLE+DRAIN", "admin: memory errors", False),
    ("IDLE", "", False),
])
def test_recheck_mode_checks_only_an_idle_node_it_drained(node: Node, tmp_path: Path, state: str, reason: str,
                                                          checked: bool) -> None:
    """CLUSTERGATE_HEALTH_RECHECK=1 (HealthCheckProgram): returns at once; the check runs detached."""
    node.set_state(state, reason)
    health = tmp_path / "health"
    start = time.monotonic()
    proc = node.check(health, env={"CLUSTERGATE_HEALTH_RECHECK": "1"})
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    assert time.monotonic() - start < 20  # slurmd kills a HealthCheckProgram after 60 s
    if checked:
        log = health / NODE / "recheck.log"
        # The detached check resumes the node, then logs it: on busy cores the log line can come a moment later.
        assert _wait_for(lambda: node.scontrol_updates() == [f"update nodename={NODE} state=resume"]
                         and log.exists() and "resumed node3" in log.read_text()), \
            (node.scontrol_updates(), log.read_text() if log.exists() else "no recheck.log")
    else:
        time.sleep(1)
        assert node.scontrol_updates() == [] and _runs(health) == []


# ---- the health tier (the default): clustergate health ---------------------------------------------------------

def gpu_node(node: Node) -> GpuNode:
    """The node's host made an 8-GPU node for clustergate health (healthy until a test plants a fault)."""
    return GpuNode(node.host_root)


def health_env(gpus: GpuNode, **extra: str) -> dict[str, str]:
    env = gpus.env()
    return {"PYTHONPATH": env["PYTHONPATH"], "CLUSTERGATE_FAKE_NVML": env["CLUSTERGATE_FAKE_NVML"],
            "CLUSTERGATE_GPUS_PER_NODE": "8", **extra}


def test_the_default_tier_is_clustergate_health(node: Node, tmp_path: Path) -> None:
    health = tmp_path / "health"
    proc = node.check(health, tier=None, env=health_env(gpu_node(node)))  # a GPU node: health has things to check
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [run] = _runs(health)
    assert sorted(p.name for p in run.iterdir()) == ["health.json", "health.log"]
    assert json.loads((run / "health.json").read_text())["status"] == "healthy"
    assert f"{NODE} passed in" in proc.stdout and node.scontrol_updates() == []
    assert not (health / NODE / "inductor-cache").exists()  # no torch, no compile cache


def test_launch_readme_gives_the_default_tier_and_limits_the_script_has() -> None:
    """launch/README.md says what healthcheck.sh does: its default tier, and each tier's time limit."""
    script = HEALTHCHECK.read_text()
    tier = re.search(r"tier=\$\{CLUSTERGATE_HEALTH_TIER:-(\w+)\}", script)
    health_s, quick_s = re.findall(r"limit=\$\{CLUSTERGATE_HEALTH_TIMEOUT:-(\d+)\}", script)  # the health branch first
    readme = " ".join((ROOT / "launch" / "README.md").read_text().split())
    assert tier and tier[1] == "health" and "(`CLUSTERGATE_HEALTH_TIER`): `health` (the default)" in readme
    assert f"({health_s} s at the health tier, {quick_s} s at the quick tier)" in readme


def test_a_failing_gpu_is_drained_with_the_first_failure_naming_it(node: Node, tmp_path: Path) -> None:
    gpus = gpu_node(node)
    gpus.gpu(3)["state"]["ecc_mode"] = [0, 0]
    proc = node.check(tmp_path / "health", tier=None, env=health_env(gpus))
    assert proc.returncode == 0, proc.stderr
    [update] = node.scontrol_updates()
    [run] = _runs(tmp_path / "health")
    assert update.startswith(f"update nodename={NODE} state=drain reason=clustergate: health: 1 failure: {NODE} gpu 3 "
                             "serial 1652923017303: ecc_mode = disabled (expected enabled): ECC is disabled")
    assert update.endswith(f"(report: {run})"), update


def test_a_gpu_node_whose_driver_is_broken_is_drained_and_never_resumed(node: Node, tmp_path: Path) -> None:
    gpus = gpu_node(node)
    gpus.spec["init_error"] = 9  # the driver is not loaded: NVML does not answer, the PCI bus shows 8 GPUs
    node.set_state("IDLE+DRAIN", "clustergate: health: 1 failure: ...")
    for recheck in ("", "1"):  # as the Prolog, and as the HealthCheckProgram that gives nodes back
        proc = node.check(tmp_path / "health", tier=None, env=health_env(gpus, CLUSTERGATE_HEALTH_RECHECK=recheck))
        assert proc.returncode == 0, proc.stderr
        assert "state=resume" not in node.calls.read_text()
        assert f"draining {NODE}" in proc.stderr and "gpu_driver = NVML does not answer" in proc.stderr


@pytest.mark.parametrize(("state", "reason", "updates"), [
    ("IDLE+DRAIN", "clustergate: health: 1 failure: ...", ["state=resume"]),
    ("IDLE", "", []),
    ("ALLOCATED", "", []),  # a job's processes on its GPUs are its own, not another job's
    ("MIXED", "", []),
])
def test_recheck_at_the_health_tier_checks_every_node_now(node: Node, tmp_path: Path, state: str, reason: str,
                                                          updates: list[str]) -> None:
    gpus = gpu_node(node)
    gpus.process(7001, "python3")
    gpus.gpu(2)["state"]["compute"] = {"7001": 30 << 30}
    node.set_state(state, reason)
    start = time.monotonic()
    proc = node.check(tmp_path / "health", tier=None, env=health_env(gpus, CLUSTERGATE_HEALTH_RECHECK="1"))
    if state.startswith("IDLE"):  # an idle node holds no job: that process is another job's, and it fails
        assert [u.split(" ", 2)[2].split(" reason=")[0] for u in node.scontrol_updates()] == ["state=drain"], proc
        node.calls.unlink()
        gpus.gpu(2)["state"]["compute"] = {}
        node.set_state(state, reason)  # the fake scontrol shows the state the test set, not the drain
        proc = node.check(tmp_path / "health", tier=None, env=health_env(gpus, CLUSTERGATE_HEALTH_RECHECK="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [u.split(" ", 2)[2] for u in node.scontrol_updates()] == updates
    assert time.monotonic() - start < 50  # within slurmd's 60 s for a HealthCheckProgram, on a busy machine


def test_an_unknown_tier_is_refused(node: Node, tmp_path: Path) -> None:
    proc = node.check(tmp_path / "health", tier="slow")
    assert proc.returncode == 2 and "CLUSTERGATE_HEALTH_TIER='slow': health (the default) or quick" in proc.stderr
    assert node.scontrol_updates() == []


@pytest.mark.parametrize("tier", ["health", "quick"])
def test_a_failing_node_someone_else_drained_keeps_their_reason(node: Node, tmp_path: Path, tier: str) -> None:
    """An Epilog's check that fails on a node an admin drained meanwhile does not drain it again: the admin's reason
    stays, and so no later passing check of this script can give the node back."""
    gpus = gpu_node(node)
    gpus.gpu(3)["state"]["ecc_mode"] = [0, 0]
    node.set_verdict(REJECT)
    node.set_state("MIXED+DRAIN", "admin: memory errors, RMA pending")
    proc = node.check(tmp_path / "health", tier=tier, env=health_env(gpus))
    assert proc.returncode == 0, proc.stderr
    assert node.scontrol_updates() == [] and "it is drained already (admin: memory errors" in proc.stderr


def test_recheck_at_the_health_tier_leaves_a_node_someone_else_drained_alone(node: Node, tmp_path: Path) -> None:
    gpus = gpu_node(node)
    gpus.gpu(3)["state"]["ecc_mode"] = [0, 0]
    node.set_state("IDLE+DRAIN", "admin: fan 3 replaced")
    proc = node.check(tmp_path / "health", tier=None, env=health_env(gpus, CLUSTERGATE_HEALTH_RECHECK="1"))
    assert proc.returncode == 0 and proc.stdout == proc.stderr == "", proc.stdout + proc.stderr
    assert node.scontrol_updates() == [] and _runs(tmp_path / "health") == []
