"""What to do about each failure: an action for every failure category, after DCGM's failure severities.

A failure's category says what broke (``workloads.faults`` holds the categories of the error evidence and
configuration checks, each with its meaning and next step; ``FIGURE_CATEGORIES`` here adds those of the
performance and inventory figures and of the run itself). Its action says what automation and the person
at the rack do first, and ``escalate`` what follows when the failure comes back after that:

    isolate   take the GPU (its node) out of service now            DCGM ISOLATE
    reset     reset the GPU (nvidia-smi -r) or reboot, then re-test  DCGM RESET
    config    fix the node's configuration, then re-test           DCGM CONFIG
    retest    run the failed tests again before anything else      DCGM TRIAGE
    vendor    isolate, and open a vendor ticket with the evidence bundle (an RMA)
    monitor   nothing now; watch the figure's trend                DCGM MONITOR

Which category a failure falls under is read from the run's own records first (the error-evidence tests
record each failing part's category), then from its failed metric (``METRIC_CATEGORY``, and the counter
tables of ``workloads``), then from its test (``TEST_CATEGORY``). Pure lookups over plain data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from functools import cache
from typing import Any

from clustergate.common.numbers import percent
from clustergate.common.parts import on_host
from clustergate.criteria import expect
from workloads import faults
from workloads.faults import Category


class Action(str, Enum):
    VENDOR = "vendor"
    ISOLATE = "isolate"
    RESET = "reset"
    CONFIG = "config"
    RETEST = "retest"
    MONITOR = "monitor"

    @property
    def text(self) -> str:
        return ACTION_TEXT[self]


ACTION_TEXT = {
    Action.VENDOR: "isolate the GPU (drain its node) and open a vendor ticket with the evidence bundle",
    Action.ISOLATE: "isolate the GPU: drain its node from the scheduler until it is repaired",
    Action.RESET: "reset the GPU (nvidia-smi -r) or reboot the node, then run the suite again",
    Action.CONFIG: "fix the node's configuration, then run the suite again",
    Action.RETEST: "run the failed tests again on the idle node before anything else",
    Action.MONITOR: "nothing now: watch the figure's trend in the store",
}
URGENCY = tuple(Action)
"""Most urgent first: a host's action is the most urgent of its failures'."""
DCGM_SEVERITY = {"ISOLATE": Action.ISOLATE, "RESET": Action.RESET, "CONFIG": Action.CONFIG, "TRIAGE": Action.RETEST,
                 "UNKNOWN": Action.RETEST, "MONITOR": Action.MONITOR}
"""DCGM's error severities (dcgmErrorSeverity_t, as workloads.gpu.dcgm names them) -> the action here."""


@dataclass(frozen=True, slots=True)
class Response:
    action: Action
    escalate: Action | None = None
    """What to do when the failure comes back after ``action``."""


FIGURE_CATEGORIES: dict[str, Category] = {
    "gpu_inventory": Category("a GPU is missing, of another model, or shows less memory than its model has",
                              "compare nvidia-smi with the profile; reboot the node, and reseat or replace a GPU "
                              "that is still missing or short after it"),
    "gpu_compute": Category("GPU compute below its criterion (matmul TFLOPS)",
                            "read the clocks and throttle reasons beside the figure in the report (a power or "
                            "thermal cap explains a slow GPU); run again on the idle node; a GPU that stays slow: "
                            "run dcgmi diag -r 3 and open a vendor ticket"),
    "gpu_memory_bandwidth": Category("GPU memory (HBM) bandwidth below its criterion",
                                     "run again on the idle node; if it stays low, check ECC and row remapping "
                                     "(nvidia-smi -q -d ECC,ROW_REMAPPER) and run dcgmi diag -r 3"),
    "host_link": Category("bandwidth between host memory and the GPU over PCIe below its criterion",
                          "check the GPU's PCIe link (generation and width), ACS, the IOMMU mode and the rank's NUMA "
                          "placement; reseat the GPU if its link trains low"),
    "pcie_link": Category("a GPU's PCIe link trained below its generation or width",
                          "reboot to retrain the link; if it stays low, reseat the GPU and its riser"),
    "nvlink_bandwidth": Category("NVLink bandwidth or latency between a node's GPUs below its criterion",
                                 "check nvidia-smi nvlink -s (every link up at full speed) and the fabric manager; "
                                 "reset the GPUs; if one GPU's links stay slow, have the vendor check the baseboard"),
    "fabric_bandwidth": Category("collective bandwidth or latency of the whole job (between nodes where it spans "
                                 "several) below its criterion",
                                 "check the transport NCCL used (a fall-back to TCP sockets is the classic failure), "
                                 "the InfiniBand ports' state and rate and the pair rounds' suspects; then the "
                                 "cables and switch ports"),
    "training": Category("end-to-end training throughput, scaling or learning below its criterion",
                         "compare with the component figures (matmul, HBM, collectives): if they pass, check the "
                         "software stack (driver, CUDA, NCCL, torch) and run again"),
    "gpu_processes": Category("processes of another job use the GPU",
                              "stop them (the report names each one) and give this job whole nodes: a figure "
                              "measured on a shared GPU is not the GPU's"),
    "shared_storage": Category("the shared directory is missing, not shared between nodes, slow, or did not give "
                               "back what was written",
                               "check the mount on every node (the same path, the same file system) and its "
                               "throughput with the storage's own tools"),
    "local_storage": Category("the node's local scratch is slow, did not give back what was written, or the node "
                              "has fewer NVMe devices than its profile",
                              "check the drives (nvme list, smartctl -a, dmesg) and the scratch's RAID or mount; "
                              "replace a drive that is missing or stays slow"),
    "job_shape": Category("the job does not have the ranks, nodes or GPUs the profile expects",
                          "check the launch (nodes, --nproc-per-node, CUDA_VISIBLE_DEVICES) against the profile's "
                          "gpus_per_node"),
    "correctness": Category("a computation gave a wrong answer (an all-reduce not exact, overlapping data shards)",
                            "a wrong answer must never pass: isolate the node, run dcgmi diag -r 3 and the memory "
                            "test, and open a vendor ticket if it repeats"),
    "config_ecc": Category("ECC is off on a GPU", "nvidia-smi -e 1, then reset the GPU or reboot (it applies then)"),
    "config_mig": Category("MIG mode differs from the profile's",
                           "nvidia-smi -mig 0 (or 1, as the profile says), then reset the GPU"),
    "config_node": Category("the node is built differently from the others (CPUs, NUMA, PCIe layout, affinity)",
                            "bring it in line with the others: the report shows each difference"),
    "config_firmware": Category("a GPU's VBIOS or InfoROM, or an HCA's firmware, differs from its node's other parts "
                                "(or, at merge, from the fleet's), or is below the profile's minimum",
                                "flash the part to the version the report names (nvidia-smi -q; mlxfwmanager), then "
                                "run the node again"),
    "config_fleet_firmware": Category("a node's GPU firmware (VBIOS, InfoROM), HCA firmware or driver differs from "
                                      "the fleet's: the version most of the fleet's nodes carry (at merge)",
                                      "bring the node to the fleet's version named beside this step (nvidia-smi -q; "
                                      "mlxfwmanager; the driver package), or, where the node's is the one to keep, "
                                      "the fleet to it; then run the node again"),
    "config_topology": Category("a GPU's nearest NIC is not its own (shared, too far, on another NUMA node), or NCCL "
                                "sent a GPU's traffic through another NIC than its own",
                                "compare the node's nvidia-smi topo -m with its peers' and check NCCL_IB_HCA and "
                                "NCCL_TOPO_FILE; a PCIe or cabling layout that differs: a vendor ticket"),
    "config_power_limit": Category("a GPU's enforced power limit is below its default or below its peers'",
                                   "reset it (nvidia-smi -i GPU -pl DEFAULT, or the site's power policy) and run "
                                   "again; a limit that will not stay: a vendor ticket"),
    "config_network": Category("a host name does not resolve or the rendezvous store cannot be reached",
                               "fix name resolution and the firewall between the nodes for the rendezvous port"),
    "config_nccl_transport": Category("NCCL carried traffic between nodes over another transport than the profile "
                                      "requires (TCP sockets instead of InfiniBand)",
                                      "check that the InfiniBand devices are visible to the job (/dev/infiniband), "
                                      "NCCL_IB_HCA and NCCL_SOCKET_IFNAME, and the ports' state"),
    "run_error": Category("the run did not finish (a rank was lost, a test ran past its time limit, the job was "
                          "killed)",
                          "read the run error and progress.jsonl (the test it was in), then run again; isolate a "
                          "node whose runs keep dying"),
    "interrupted": Category("the run was interrupted before it finished (Ctrl-C, or a signal from outside the run: the "
                            "job cancelled, torchrun signalled or killed), which says nothing about the node",
                            "run it again: the tests it did not finish or reach were not judged"),
    "no_result": Category("no usable result from the node (no report directory, no results.json, or one that still "
                          "says running)",
                          "check that the node's job ran (the scheduler's log) and wrote into the shared report "
                          "directory; run it again"),
    "unusable_run": Category("the node's run cannot be accepted as it stands: it ran less than a complete run, is "
                             "another cluster run's, was judged by other thresholds, or its records contradict its "
                             "verdict",
                             "read the merge's reason, then run the node phase again on this host: the whole suite, "
                             "at the site's level, with the site's thresholds and this run's id"),
    "unknown": Category("a failure this suite's table does not classify",
                        "read the test's message in the report; run again"),
}

_RESPONSES: dict[str, tuple[str, ...]] = {
    # category: (action, the action if it recurs)
    # workloads.faults: GPU
    "gpu_off_bus": ("isolate", "vendor"),
    "uncorrectable_ecc": ("reset", "vendor"),
    "corrected_ecc": ("monitor", "retest"),
    "memory_repair": ("reset", "vendor"),
    "row_remap_pending": ("reset", "vendor"),
    "row_remap_failure": ("vendor",),
    "memtest": ("reset", "vendor"),
    "pcie_replay": ("isolate", "vendor"),
    "nvlink_crc": ("monitor", "vendor"),
    "nvlink": ("reset", "vendor"),
    "thermal_power": ("isolate", "vendor"),
    "firmware": ("reset", "vendor"),
    "driver": ("reset", "config"),
    "recovery_action": ("reset", "vendor"),
    "application": ("retest", "vendor"),
    "unknown_xid": ("retest", "vendor"),
    # workloads.faults: PCIe AER and InfiniBand
    "aer_fatal": ("isolate", "vendor"),
    "aer_nonfatal": ("isolate", "vendor"),
    "aer_correctable": ("monitor", "isolate"),
    "ib_link_down": ("isolate", "vendor"),
    "ib_link_errors": ("isolate", "vendor"),
    "ib_receive_errors": ("isolate", "vendor"),
    "ib_discards": ("retest", "config"),
    "rdma_bandwidth": ("retest", "vendor"),
    "roce_gid": ("config",),
    # workloads.faults: configuration, DCGM
    **{name: ("config",) for name in faults.CATEGORIES if name.startswith("config_")},
    "dcgm": ("retest", "vendor"),
    # the figures' and the run's
    "gpu_inventory": ("reset", "vendor"),
    "gpu_compute": ("retest", "vendor"),
    "gpu_memory_bandwidth": ("retest", "vendor"),
    "host_link": ("config", "vendor"),
    "pcie_link": ("reset", "vendor"),
    "nvlink_bandwidth": ("retest", "vendor"),
    "fabric_bandwidth": ("retest", "vendor"),
    "training": ("retest", "config"),
    "gpu_processes": ("config",),
    "shared_storage": ("config",),
    "local_storage": ("retest", "vendor"),
    "job_shape": ("config",),
    "correctness": ("isolate", "vendor"),
    **{name: ("config",) for name in FIGURE_CATEGORIES if name.startswith("config_")},
    "run_error": ("retest", "isolate"),
    "interrupted": ("retest",),
    "no_result": ("retest", "isolate"),
    "unusable_run": ("retest",),
    "unknown": ("retest",),
}
"""Every category's (action, and the action if it recurs): a test holds it to every category of workloads.faults
and of FIGURE_CATEGORIES."""
RESPONSES = {name: Response(Action(r[0]), Action(r[1]) if len(r) > 1 else None) for name, r in _RESPONSES.items()}


def _family(category: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, category)


METRIC_CATEGORY: dict[str, str] = {
    **_family("gpu_inventory", "gpu_count", "gpu_memory_gib"),
    "gpu_foreign_processes": "gpu_processes",
    **_family("gpu_compute", "matmul_bf16_tflops", "matmul_fp16_tflops", "matmul_tf32_tflops", "matmul_fp8_tflops",
              "matmul_bf16_sustained_tflops"),
    **_family("thermal_power", "sustained_power_w", "sustained_power_fraction", "sustained_sm_clock_mhz",
              "thermal_margin_min_c"),
    **_family("config_power_limit", "power_limit_w", "power_limit_default_fraction"),
    "hbm_bandwidth_tbps": "gpu_memory_bandwidth",
    **_family("host_link", "h2d_bandwidth_gbps", "d2h_bandwidth_gbps", "h2d_bandwidth_all_gpus_gbps",
              "d2h_bandwidth_all_gpus_gbps"),
    **_family("memtest", "memtest_errors", "memtest_coverage"),
    **_family("shared_storage", "shared_fs_write_gbps", "shared_fs_read_gbps", "storage_shared_write_gibps",
              "storage_shared_read_gibps", "storage_shared_randread_iops"),
    **_family("local_storage", "storage_local_write_gibps", "storage_local_read_gibps", "storage_local_randread_iops",
              "nvme_device_count"),
    **_family("training", "scaling_efficiency"),
    # acceptance/test_errors_after.py's own parts (the counters' metrics come from workloads' tables); an XID
    # part records its code's own category, which is read first
    "xid_critical_events": "unknown_xid", "xid_other_events": "application",
    "memory_repair_pending": "row_remap_pending", "pcie_replays_per_min": "pcie_replay",
    "nvlink_crc_errors_per_s": "nvlink_crc", "ib_port_state_changes": "ib_link_down",
    **_family("rdma_bandwidth", "rdma_write_bw_gbps", "rdma_write_lat_us", "rail_write_bw_gbps"),
    **_family("config_topology", "gpu_nic_topology_problems", "nccl_cross_rail_channels"),
}
"""Metric -> category, where the name alone does not say (see ``category_of_metric`` for the rest)."""
METRIC_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"intranode_.*", "nvlink_bandwidth"),
    (r"(net_|internode_)?(allreduce|allgather|reducescatter|alltoall|broadcast|sendrecv|pair)_(busbw|bw|latency)"
     r"_(gbps|us)", "fabric_bandwidth"),
    (r"(train|lora|fsdp|zero3)_.*", "training"),
)
"""Families of metric names: the collectives of each scope, and the training workloads' figures."""

TEST_CATEGORY: dict[str, str] = {
    "test_world.py::test_world_matches_profile": "job_shape",
    "test_world.py::test_allreduce_is_exact": "correctness",
    "test_gpu_inventory.py::test_gpu_count": "gpu_inventory",
    "test_gpu_inventory.py::test_gpu_model": "gpu_inventory",
    "test_gpu_inventory.py::test_gpu_memory": "gpu_inventory",
    "test_gpu_inventory.py::test_gpu_uuids_distinct": "gpu_inventory",
    "test_gpu_inventory.py::test_no_foreign_gpu_processes": "gpu_processes",
    "test_gpu_inventory.py::test_ecc_enabled": "config_ecc",
    "test_gpu_inventory.py::test_no_uncorrectable_ecc_errors": "uncorrectable_ecc",
    "test_gpu_inventory.py::test_no_pending_memory_repair": "row_remap_pending",
    "test_gpu_inventory.py::test_no_row_remap_failure": "row_remap_failure",
    "test_gpu_inventory.py::test_no_clock_slowdown": "thermal_power",
    "test_gpu_inventory.py::test_pcie_link": "pcie_link",
    "test_gpu_inventory.py::test_nvlinks_active": "nvlink",
    "test_gpu_inventory.py::test_mig_mode": "config_mig",
    "test_gpu_inventory.py::test_software_versions_identical": "config_versions",
    "test_gpu_inventory.py::test_driver_version_minimum": "config_versions",
    "test_gpu_firmware.py::test_gpu_firmware_alike": "config_firmware",
    "test_gpu_firmware.py::test_hca_firmware_alike": "config_firmware",
    "test_gpu_limits.py::test_thermal_margin_under_load": "thermal_power",
    "test_gpu_limits.py::test_power_limit_alike": "config_power_limit",
    "test_gpu_limits.py::test_power_limit_default": "config_power_limit",
    "test_gpu_memory.py::test_gpu_memory_patterns": "memtest",
    "test_gpu_compute.py::test_matmul_tflops": "gpu_compute",
    "test_gpu_compute.py::test_sustained_matmul": "thermal_power",  # its own failure is a slowdown reason
    "test_gpu_compute.py::test_power_under_load": "thermal_power",
    "test_gpu_compute.py::test_hbm_bandwidth": "gpu_memory_bandwidth",
    "test_gpu_compute.py::test_host_link": "host_link",
    "test_gpu_compute.py::test_host_link_all_gpus": "host_link",
    "test_interconnect.py::test_nccl_transport": "config_nccl_transport",
    "test_interconnect.py::test_allreduce_latency": "fabric_bandwidth",
    "test_interconnect.py::test_collective_bandwidth": "fabric_bandwidth",
    "test_interconnect.py::test_gpu_pairs": "fabric_bandwidth",
    "test_node.py::test_nodes_built_alike": "config_node",
    "test_node.py::test_same_software_on_every_node": "config_versions",
    "test_node.py::test_cpu_affinity_local_to_gpu": "config_node",
    "test_node.py::test_infiniband_ports_active": "ib_link_down",
    "test_node.py::test_shared_directory_is_shared": "shared_storage",
    "test_node.py::test_hosts_resolve_and_rendezvous_store_reachable": "config_network",
    "test_storage.py::test_local_scratch_fio": "local_storage",
    "test_storage.py::test_shared_dir_fio": "shared_storage",
    "test_storage.py::test_nvme_count": "local_storage",
    "test_node_config.py::test_fabric_manager": "config_fabric_manager",
    "test_node_config.py::test_gpudirect_rdma_available": "config_gpudirect",
    "test_node_config.py::test_nccl_uses_gdr": "config_gpudirect",
    "test_training.py::test_gpt_throughput": "training",
    "test_training.py::test_gpt_original_settings": "training",
    "test_training.py::test_scaling_efficiency": "training",
    "test_training.py::test_sampler_gives_disjoint_shares": "correctness",
    "test_training.py::test_checkpoint_round_trip": "shared_storage",
    "test_finetune.py::test_lora_finetune_learns": "training",
    "test_finetune.py::test_fsdp_full_finetune": "training",
    "test_finetune.py::test_zero3_finetune": "training",
    "test_errors_before.py::test_error_counters_before_load": "driver",
    "test_errors_after.py::test_no_xid_errors_during_run": "unknown_xid",
    "test_errors_after.py::test_ecc_errors_during_run": "uncorrectable_ecc",
    "test_errors_after.py::test_memory_repairs_during_run": "memory_repair",
    "test_errors_after.py::test_pcie_replays_during_run": "pcie_replay",
    "test_errors_after.py::test_nvlink_errors_during_run": "nvlink",
    "test_errors_after.py::test_pcie_aer_errors_during_run": "aer_fatal",
    "test_errors_after.py::test_infiniband_errors_during_run": "ib_link_errors",
    "test_dcgm.py::test_dcgm_diagnostic": "dcgm",
    "test_rdma.py::test_rdma_write_per_hca": "rdma_bandwidth",
    "test_rdma_rails.py::test_rdma_write_per_rail": "rdma_bandwidth",
    "test_topology.py::test_gpu_nearest_nic_is_its_own": "config_topology",
    "test_topology.py::test_nccl_uses_each_gpus_own_nic": "config_topology",
    "test_rdma.py::test_roce_gid_at_nccl_index": "roce_gid",
}
"""``FILE::FUNCTION`` of each acceptance test -> the category of a failure that names no part or metric.
``test_node_config.py``'s per-key tests take their key's category from clustergate.criteria.expect."""
EXPECT_TESTS = ("test_node_config.py::test_gpu_setting", "test_node_config.py::test_node_setting")


# ---- lookups -------------------------------------------------------------------------------------------
def category(name: str) -> Category:
    """A category's meaning and next step (KeyError for one no table has: a bug, not input)."""
    return faults.CATEGORIES.get(name) or FIGURE_CATEGORIES[name]


def response(name: str) -> Response:
    """A category's action, and what follows if it recurs (KeyError for an unknown category)."""
    return RESPONSES[name]


def from_dcgm(severity: str | None) -> Action | None:
    """The action for a DCGM error severity (``ISOLATE``, ``DCGM_ERROR_RESET``, ...); None for NONE or unknown."""
    return DCGM_SEVERITY.get(str(severity or "").upper().removeprefix("DCGM_ERROR_"))


@cache
def _counter_categories() -> dict[str, str]:
    """The counter metrics' categories, from the tables the error-evidence tests judge by (imported only when
    needed: they import torch)."""
    from workloads.gpu import error_counters
    from workloads.node import ib_counters, pcie_aer

    return {metric: cat for table in (error_counters.METRICS, ib_counters.METRICS, pcie_aer.METRICS)
            for metric, (_, cat) in table.items()}


def category_of_metric(metric: str) -> str:
    """The category of a metric's miss; ``unknown`` for a metric no table lists."""
    if metric in METRIC_CATEGORY:
        return METRIC_CATEGORY[metric]
    for pattern, cat in METRIC_PATTERNS:
        if re.fullmatch(pattern, metric):
            return cat
    return _counter_categories().get(metric, "unknown")


def split_nodeid(nodeid: str) -> tuple[str, str | None]:
    """(``FILE::FUNCTION``, its parameter id or None) of a node id such as
    ``acceptance/test_node_config.py::test_node_setting[iommu]``."""
    path, _, name = nodeid.partition("::")
    function, _, param = name.partition("[")
    return f"{path.rsplit('/', 1)[-1]}::{function}", (param[:-1] if param.endswith("]") else None)


def category_of_test(nodeid: str) -> str:
    """The category of a test's failure that names no part or metric; ``unknown`` for a test no table lists."""
    key, param = split_nodeid(nodeid)
    if key in EXPECT_TESTS and param in expect.RULES:
        return expect.RULES[param].category
    return TEST_CATEGORY.get(key, "unknown")


# ---- a run's failures ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Step:
    """What to do about one failure of one run."""

    action: Action
    escalate: Action | None
    category: str
    meaning: str
    next_step: str
    test: str | None
    where: str
    """The part (GPU, device, port, node) where known; empty otherwise."""

    def text(self) -> str:
        """``reset: uncorrectable ECC error in GPU memory [rank 3 gpu01 gpu 3 serial 1654...]: drain ...``"""
        where = f" [{self.where}]" if self.where else ""
        then = f"; if it recurs: {self.escalate.value}" if self.escalate else ""
        return f"{self.action.value}: {self.meaning}{where}: {self.next_step}{then}"

    def as_json(self) -> dict[str, Any]:
        """The step as results.json keeps it: its fields, and ``text`` as the terminal and the report say it."""
        out = asdict(self)
        out["action"] = self.action.value
        out["escalate"] = self.escalate.value if self.escalate else None
        out["text"] = self.text()
        return out


def step(cat: str, test: str | None = None, where: str = "") -> Step:
    """The step for one failure of category ``cat``."""
    c, r = category(cat), response(cat)
    return Step(r.action, r.escalate, cat, c.meaning, c.next_step, test, where)


FAILED = ("failed", "error")


def _parts_missed(metric: Mapping[str, Any]) -> str:
    bad = [p for p in metric.get("per_rank") or [] if not p.get("passed", True)]
    labels = []
    for p in bad[:4]:
        labels.append(on_host(p.get("host", "?"), p.get("gpu_index"), p.get("gpu_serial")))
    return ", ".join(labels) + (" ..." if len(bad) > 4 else "")


def _drift_step(finding: Mapping[str, Any]) -> Step:
    """The step for a drift that failed its test (a results.json ``drift.findings`` entry): what its metric's miss
    calls for, where the part is said with how far it fell."""
    where = finding.get("where") or finding.get("host") or ""
    return step(category_of_metric(str(finding.get("metric"))), finding.get("test"),
                f"{where}: {percent(float(finding.get('fraction', 0)))} below its first accepted figure")


def ended_by(results: Mapping[str, Any]) -> str:
    """The category of a run's own ending: ``interrupted`` where no rank caused it (results.json's ``interrupted``:
    Ctrl-C, a signal from outside, its launcher killed), else ``run_error``."""
    return "interrupted" if results.get("interrupted") else "run_error"


def steps_of_test(test: Mapping[str, Any], drifted: Iterable[Mapping[str, Any]] = (),
                  ending: str = "run_error") -> list[Step]:
    """The steps for one test entry of results.json (none when it passed or was skipped); ``drifted``: the drift
    findings that failed it; ``ending``: the category of a test the run's ending interrupted (``ended_by``)."""
    outcome, nodeid = test.get("outcome"), str(test.get("nodeid"))
    if outcome == "interrupted":
        return [step(ending, nodeid)]
    if outcome not in FAILED:
        return []
    details = test.get("details") or {}
    evidence = [row for row in details.get("evidence") or [] if row.get("status") == "fail" and row.get("category")]
    steps = [step(str(row["category"]) if row["category"] in RESPONSES else "unknown", nodeid,
                  str(row.get("where") or row.get("label") or "")) for row in evidence]
    steps += [step(category_of_metric(str(m["name"])), nodeid, _parts_missed(m))
              for m in test.get("metrics") or [] if not m.get("passed", True)]
    steps += [_drift_step(d) for d in drifted]
    return steps or [step(category_of_test(nodeid), nodeid)]


def steps(results: Mapping[str, Any]) -> list[Step]:
    """Every step a run's results.json calls for, most urgent first: its run error, each failed test's
    failures, and each drift that failed the run (a results.json ``drift`` section)."""
    found: list[Step] = []
    if results.get("error"):
        found.append(step(ended_by(results)))
    failing = [d for d in (results.get("drift") or {}).get("findings") or [] if d.get("severity") == "fail"]
    tests = results.get("tests") or []
    for test in tests:
        found += steps_of_test(test, [d for d in failing if d.get("test") == test.get("nodeid")], ended_by(results))
    failed = {t.get("nodeid") for t in tests if t.get("outcome") in FAILED}
    found += [_drift_step(d) for d in failing if d.get("test") not in failed]  # a record that failed no test
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda s: URGENCY.index(s.action))


def section(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """results.json's ``actions``: every step the run calls for, most urgent first."""
    return [s.as_json() for s in steps(results)]


def most_urgent(found: Iterable[Step]) -> Action | None:
    """The host's action: the most urgent of its steps' (None without any)."""
    return min((s.action for s in found), key=URGENCY.index, default=None)
