"""``clustergate health`` as a scheduler runs it: a subprocess on a made-up node (tests/helpers/health_node.py: a fake
NVML, and /sys, /proc, /dev under CLUSTERGATE_HOST_ROOT). A healthy 8-GPU node passes under the profile chosen
from NVML's model; each kind of fault fails with one line naming the host, the GPU's index and serial, the
check, what was seen and what was expected; a GPU node with no driver fails; nothing is healthy unchecked (a
node with no NVIDIA device, which the cpu profile finds nothing to judge on, could not be checked; the cpu profile
on a GPU node and a --skip of every check are usage errors); torch is never imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_pynvml import GPU_IS_LOST
from health_node import BUSES, HOST, ROOT, GpuNode, kmsg, xid

from clustergate.health.checks import CHECKS


@pytest.fixture
def node(tmp_path: Path) -> GpuNode:
    return GpuNode(tmp_path / "host")


def files(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")}


def lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The failure lines (everything before the summary)."""
    out = proc.stdout.strip().splitlines()
    assert out and out[-1].startswith("clustergate health: "), proc.stdout + proc.stderr
    return out[:-1]


def test_a_healthy_node_of_two_gpus_passes_under_its_shape_s_profile(tmp_path: Path) -> None:
    """The shipped profile of the node's own shape judges it (h100-sxm-80gb-2gpu: two GPUs), not the 8-GPU one."""
    proc = GpuNode(tmp_path / "host", gpus=2).run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"clustergate health: {HOST} healthy") and "profile h100-sxm-80gb-2gpu" in proc.stdout


def test_a_healthy_gpu_node_passes_under_the_profile_nvml_names(node: GpuNode) -> None:
    before = files(node.root)
    proc = node.run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lines(proc) == [] and proc.stderr == ""
    assert proc.stdout.startswith(f"clustergate health: {HOST} healthy") and "profile h100-sxm-80gb" in proc.stdout
    report = json.loads(node.run("--json").stdout)
    assert report["status"] == "healthy" and report["exit_status"] == 0 and report["failures"] == []
    assert [g["serial"] for g in report["gpus"]] == [f"16529230173{i:02d}" for i in range(8)]
    judged = {f["check"] for f in report["findings"] if f["status"] == "ok"}
    assert judged >= {"gpu_count", "gpu_model", "gpu_memory", "ecc_mode", "ecc_uncorrectable", "memory_repair_pending",
                      "row_remap_failure", "clock_slowdown", "pcie_link", "nvlinks", "mig_mode", "foreign_processes",
                      "xid_critical_events", "xid_other_events", "expect.driver", "expect.cuda",
                      "expect.persistence_mode", "expect.fabric_manager", "expect.iommu", "expect.numa_balancing",
                      "expect.cpu_governor"}
    assert files(node.root) == before  # nothing written unless asked


def test_torch_is_never_imported(node: GpuNode) -> None:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "clustergate", "health"], env=node.env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "clustergate.health.checks" in imported and "pynvml" in imported  # the fake NVML: importtime saw it all
    assert not [m for m in imported if m.split(".")[0] in ("torch", "numpy", "transformers")]


def _set(index: int, **state: object) -> Callable[[GpuNode], None]:
    return lambda n: n.gpu(index)["state"].update(state)


def _gpu(index: int, key: str, value: object) -> Callable[[GpuNode], None]:
    return lambda n: n.gpu(index).update({key: value})


def _foreign(n: GpuNode) -> None:
    n.process(7001, "bf16_matmuls")
    n.gpu(2)["state"]["compute"] = {"7001": 21 << 30}


FAULTS: dict[str, tuple[Callable[[GpuNode], None], str, int, str]] = {
    # name: (plant, check, GPU index (-1: the node), a piece of the line)
    "ecc disabled": (_set(3, ecc_mode=[0, 0]), "ecc_mode", 3, "ecc_mode = disabled (expected enabled)"),
    "uncorrectable ecc": (lambda n: n.gpu(1).update(counters={"ecc_uncorrected": 2}), "ecc_uncorrectable", 1,
                          "ecc_uncorrectable = 2"),
    "remap pending": (lambda n: n.gpu(6).update(counters={"remap_pending": 1}), "memory_repair_pending", 6,
                      "reset the GPU"),
    "remap failure": (_set(0, remap_failure=1), "row_remap_failure", 0, "needs an RMA"),
    "hw slowdown": (_set(5, clock_reasons=0x8 | 0x1), "clock_slowdown", 5, "clock_slowdown = gpu_idle, hw_slowdown"),
    "power brake": (_set(4, clock_reasons=0x80), "clock_slowdown", 4, "hw_power_brake_slowdown"),
    "pcie width": (_set(2, pcie={"width": 8}), "pcie_link", 2, "pcie_link = Gen5 x8 (expected Gen5 x16)"),
    "pcie gen4 slot": (_set(7, pcie={"gen_max": 4}), "pcie_link", 7, "pcie_link = Gen4 x16 (expected Gen5 x16)"),
    "nvlink down": (_set(3, links_down=[4, 11]), "nvlinks", 3, "nvlinks = 16 of 18 active (expected 18 active)"),
    "mig on": (_set(1, mig_mode=[1, 1]), "mig_mode", 1, "mig_mode = enabled (expected disabled)"),
    "small memory": (_set(6, memory_total=70 << 30), "gpu_memory", 6, "gpu_memory = 70 GiB (expected >= 79)"),
    "foreign process": (_foreign, "foreign_processes", 2, "pid 7001 (bf16_matmuls, 21.0 GiB, compute)"),
    "persistence off": (_gpu(0, "persistence", 0), "expect.persistence_mode", 0,
                        "expect.persistence_mode = false (expected true)"),
    "old driver": (lambda n: [n.gpu(i)["answers"].update(nvmlSystemGetDriverVersion="520.61.05") for i in range(8)],
                   "expect.driver", 0, "expect.driver = 520.61.05 (expected >=525.60.13)"),
    "old cuda": (lambda n: [n.gpu(i)["answers"].update(nvmlSystemGetCudaDriverVersion=11080) for i in range(8)],
                 "expect.cuda", 0, "expect.cuda = 11.8 (expected >=12.0)"),
    "fabric not up": (_gpu(5, "fabric", [2, 0]), "expect.fabric_manager", 5, "fabric in progress"),
    "xid 79": (lambda n: n.write("dev/kmsg", kmsg(xid(BUSES[4], 79, "GPU has fallen off the bus."))),
               "xid_critical_events", 4, "XID 79 (GPU has fallen off the bus)"),
    "gpu lost": (_gpu(3, "fail", {"*": GPU_IS_LOST}), "gpu_driver", 3,
                 "NVML cannot open GPU 3: NVMLError: GPU is lost"),
    "gpu missing": (lambda n: n.spec["gpus"].pop(), "gpu_count", -1,
                    "gpu_count = 7 (NVML), 8 on the PCI bus (expected 8)"),
    "numa balancing": (lambda n: n.write("proc/sys/kernel/numa_balancing", "1\n"), "expect.numa_balancing", -1,
                       "expect.numa_balancing = true (expected false)"),
    "cpu governor": (lambda n: n.write("sys/devices/system/cpu/cpu2/cpufreq/scaling_governor", "powersave\n"),
                     "expect.cpu_governor", -1, "mixed: performance on 3 CPUs, powersave on 1 CPUs"),
    "iommu translated": (lambda n: n.write("sys/kernel/iommu_groups/0/type", "DMA-FQ\n"), "expect.iommu", -1,
                         "expect.iommu = translated (expected off or passthrough)"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_kind_of_fault_fails_naming_host_gpu_serial_check_value_and_expected(node: GpuNode, fault: str) -> None:
    plant, check, index, said = FAULTS[fault]
    plant(node)
    proc = node.run()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = lines(proc)
    mine = [line for line in failed if f": {check}" in line]
    assert mine and all(line.startswith(HOST) for line in failed), failed
    serial = "" if fault == "gpu lost" else f" serial 16529230173{index:02d}"  # a lost GPU tells NVML nothing
    where = f"{HOST} gpu {index}{serial}: " if index >= 0 else f"{HOST}: "
    assert any(line.startswith(where) and said in line for line in mine), mine
    assert proc.stdout.strip().splitlines()[-1].startswith(f"clustergate health: {HOST} NOT HEALTHY: ")
    report = json.loads(node.run("--json").stdout)
    assert report["status"] == "not healthy" and report["exit_status"] == 1
    assert {f["check"] for f in report["findings"] if f["status"] == "fail"} == {check}, report["failures"]


def test_infiniband_ports_and_driver_minimum_of_a_site_profile(node: GpuNode) -> None:
    site = str(node.site_thresholds())
    assert node.run("--thresholds", site, "--profile", "site").returncode == 0
    node.ib_port("mlx5_1", state="1: DOWN")
    node.gpu(0)["answers"]["nvmlSystemGetDriverVersion"] = "530.30.02"
    proc = node.run("--thresholds", site, "--profile", "site")
    assert proc.returncode == 1
    failed = lines(proc)
    assert any(line.startswith(f"{HOST}: infiniband (expected 2 ports ACTIVE at >= 400 Gb/s): 1 InfiniBand or RoCE "
                               "ports ACTIVE") and "mlx5_1/1 DOWN" in line for line in failed), failed
    assert any(line.startswith(f"{HOST} gpu 0 serial 1652923017300: driver_minimum = 530.30.02 (expected >= 535)")
               for line in failed), failed


def test_an_xid_of_an_application_is_a_warning_and_a_critical_one_elsewhere_names_its_address(node: GpuNode) -> None:
    node.write("dev/kmsg", kmsg(xid(BUSES[2], 13, "Graphics SM Warp Exception"), xid("0000:e1:00.0", 48, "DBE")))
    proc = node.run()
    assert proc.returncode == 1
    out = proc.stdout.splitlines()
    assert f"warn: {HOST} gpu 2 serial 1652923017302: xid_other_events = 1 (expected <= 0): " \
           "xid_other_events=1 count, expected <= 0: XID 13 (graphics engine exception)" in out[1]
    assert out[0].startswith(f"{HOST} PCI 0000:e1:00.0: xid_critical_events = 1 (expected <= 0)")
    assert "XID 48 (double-bit (uncorrectable) ECC error)" in out[0] and "Next step:" in out[0]


def test_a_gpu_node_with_no_driver_fails_and_names_the_driver(node: GpuNode) -> None:
    """The PCI bus and /dev show GPUs, NVML does not answer: auto-selection keeps it a GPU node (the fallback
    profile: no model can be read) and the check fails, never passing as a machine without GPUs."""
    node.spec["init_error"] = 9  # NVML_ERROR_DRIVER_NOT_LOADED
    proc = node.run()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [line] = lines(proc)
    assert line.startswith(f"{HOST}: gpu_driver = NVML does not answer (expected NVML lists the GPUs): this is a GPU "
                           "node (/dev/nvidia0, /dev/nvidia1, /dev/nvidia2 and 5 more; 8 GPUs and 4 other devices of "
                           "vendor 0x10de on the PCI bus")
    assert "NVMLError: Driver Not Loaded" in line and "the NVIDIA driver or CUDA is broken" in line
    assert "profile nvidia-generic" in proc.stdout and "has no criteria of its own" in proc.stdout


def test_a_node_with_no_nvidia_device_is_never_healthy_unchecked(tmp_path: Path) -> None:
    """The cpu profile is chosen there, and judges nothing health can read (no GPU, no InfiniBand, no expect: key):
    the check could not run (4), never "healthy" (0) nor a finding against the node (1)."""
    empty = GpuNode(tmp_path / "host", gpus=0)
    for switch in (empty.root / "sys/bus/pci/devices").iterdir():
        (switch / "vendor").write_text("0x8086\n")
    empty.spec["init_error"] = 12  # the NVML library is not there at all
    proc = empty.run("--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 4 and "healthy" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"clustergate health: could not run: {HOST}: profile 'cpu' judges nothing "
                                   "clustergate health can read on this node (no GPU, no InfiniBand port and no "
                                   "expect: key to check): a check of nothing is not healthy; run the acceptance "
                                   "suite here instead (clustergate run)")
    report = json.loads((tmp_path / "r" / "health.json").read_text())
    assert (report["status"], report["exit_status"], report["profile"]) == ("could not run", 4, "cpu")
    real = empty.run(real_nvml=True)  # whatever this machine's pynvml says: no NVIDIA device here either
    assert real.returncode == 4 and "profile 'cpu' judges nothing" in real.stderr, real.stdout + real.stderr


def test_the_cpu_profile_on_a_gpu_node_is_a_usage_error(node: GpuNode) -> None:
    """It would judge none of the GPUs: the node would read healthy unchecked."""
    proc = node.run("--profile", "cpu")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("clustergate health: --profile cpu on a GPU node (NVML lists 8 GPUs") and \
        "that profile judges no GPU" in line


def test_skipping_every_check_is_a_usage_error(node: GpuNode) -> None:
    proc = node.run(*[arg for check in CHECKS for arg in ("--skip", check)])
    assert proc.returncode == 2 and "leaves nothing to check" in proc.stderr and proc.stdout == "", proc.stderr


def test_a_state_file_that_is_a_fifo_is_refused_at_once(node: GpuNode, tmp_path: Path) -> None:
    """Reading a FIFO would wait for a writer forever: it is refused without a read, in one line."""
    state = tmp_path / "state.json"
    os.mkfifo(state)
    started = time.monotonic()
    proc = node.run("--state", str(state))
    # The hang guard is node.run's own timeout; a refusal takes the command's start-up (well under a second here).
    assert time.monotonic() - started < 30
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stdout + proc.stderr
    assert f"--state {state}" in proc.stderr and "a FIFO, not a regular file" in proc.stderr


def test_a_gpu_profile_where_nvml_is_absent_and_no_device_shows_could_not_run(tmp_path: Path) -> None:
    empty = GpuNode(tmp_path / "host", gpus=0)
    for switch in (empty.root / "sys/bus/pci/devices").iterdir():
        (switch / "vendor").write_text("0x8086\n")
    empty.spec["init_error"] = 12
    proc = empty.run("--profile", "h100-sxm-80gb", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"clustergate health: could not run: {HOST}: profile 'h100-sxm-80gb' judges GPUs, "
                                  "but NVML does not answer") and "run it on a GPU node" in proc.stderr
    assert json.loads((tmp_path / "r" / "health.json").read_text())["status"] == "could not run"


def test_without_nvidia_ml_py_a_gpu_node_could_not_run(node: GpuNode) -> None:
    code = "import sys; sys.modules['pynvml'] = None; from clustergate.cli import main; sys.exit(main(['health']))"
    proc = subprocess.run([sys.executable, "-c", code], env=node.env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "nvidia-ml-py (the pynvml module) is not installed" in proc.stderr


def test_state_counts_only_xids_after_the_last_healthy_check(node: GpuNode, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    assert node.run("--state", str(state)).returncode == 0
    mark = json.loads(state.read_text())
    assert mark["marker"] == 1200 and mark["source"].endswith("dev/kmsg")
    node.write("dev/kmsg", kmsg("NVRM: loading", xid(BUSES[1], 79, "GPU has fallen off the bus.")))
    for _ in range(2):  # a check that fails keeps the mark: the XID is seen again until a check passes
        assert node.run("--state", str(state)).returncode == 1
        assert json.loads(state.read_text()) == mark
    state.write_text(json.dumps({**mark, "marker": 1201}))  # a healthy check after the XID had been logged
    assert node.run("--state", str(state)).returncode == 0
    node.write("proc/sys/kernel/random/boot_id", "another-boot\n")  # a mark of an earlier boot is no mark
    state.write_text(json.dumps({**mark, "marker": 1201}))
    assert node.run("--state", str(state)).returncode == 1
    assert node.run().returncode == 1  # without --state: every XID since boot


def test_report_dir_keeps_everything_read(node: GpuNode, tmp_path: Path) -> None:
    node.gpu(3)["state"]["ecc_mode"] = [0, 0]
    proc = node.run("--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 1
    [written] = (tmp_path / "r").iterdir()
    report = json.loads(written.read_text())
    assert written.name == "health.json" and report["failures"] == lines(proc)
    assert report["read"]["gpus"][3]["snapshot"]["gpu"]["ecc_mode_current"] is False
    blocked = tmp_path / "file"
    blocked.write_text("")
    cannot = node.run("--report-dir", str(blocked / "r"))
    assert cannot.returncode == 4 and "--report-dir" in cannot.stderr


def test_skip_leaves_a_check_out(node: GpuNode) -> None:
    _foreign(node)
    assert node.run().returncode == 1
    assert node.run("--skip", "foreign_processes").returncode == 0


@pytest.mark.parametrize(("args", "says"), [
    (("--skip", "ecc"), "--skip ecc: no such check; the checks are gpu_driver, gpu_count"),
    (("--profile", "h900"), "no profile 'h900'; profiles are: h100-sxm-80gb"),
    (("--thresholds", "/nonexistent/t.yaml"), "/nonexistent/t.yaml: file not found"),
    (("--state", "STATE"), "--state STATE: cannot be read as a state file"),
    (("--no-such",), "unrecognized arguments: --no-such"),
])
def test_bad_input_is_one_line_and_exit_2(node: GpuNode, args: tuple[str, ...], says: str) -> None:
    (node.root / "STATE").write_text("{not json")
    proc = node.run(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""


def test_every_check_name_is_documented() -> None:
    page = (ROOT / "docs" / "day-2.md").read_text()
    missing = [c for c in CHECKS if f"`{c}`" not in page]
    assert not missing, f"docs/day-2.md's table of clustergate health's checks does not name: {missing}"
