"""The settings a profile may give (``settings:`` in thresholds.yaml): each name, type, range and meaning.

A profile's settings must use these names: a typo is an error, not a silently ignored value; a
number outside its range (a negative GPU count, a zero timeout) is an error naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clustergate.common.numbers import yaml_text_number

Check = Callable[[Any], "str | None"]


def at_least(low: int) -> Check:
    """A count: ``low`` or more."""
    return lambda v: None if v >= low else f"must be >= {low}, got {v!r}"


def positive(v: float) -> str | None:
    """A duration, rate or peak: finite and above zero."""
    return None if math.isfinite(v) and v > 0 else f"must be a finite number > 0, got {v!r}"


def fraction(v: float) -> str | None:
    """A share of something: in (0, 1]."""
    return None if math.isfinite(v) and 0 < v <= 1 else f"must lie in (0, 1], got {v!r}"


def below_one(v: float) -> str | None:
    """A share that must leave something: in (0, 1)."""
    return None if math.isfinite(v) and 0 < v < 1 else f"must lie in (0, 1), got {v!r}"


def one_of(*choices: str) -> Check:
    """A word of a fixed list."""
    return lambda v: None if v in choices else f"must be {' or '.join(map(repr, choices))}, got {v!r}"


def anything(v: Any) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class Setting:
    types: tuple[type, ...]
    help: str
    check: Check = anything


NUMBER = (int, float)
DRIFT_FRACTION = 0.05
"""drift_fraction where the profile does not set it: run-to-run spread of a healthy part stays within a few per
cent, and a GPU that lost more than this of a figure it once had is worth a look."""
DRIFT_SEVERITY = "warn"
"""drift_severity where the profile does not set it: a drift informs until a site decides it should fail."""
SETTINGS: dict[str, Setting] = {
    "gpus_per_node": Setting((int,), "GPUs (and torchrun ranks) expected on every node; 0 means CPU ranks",
                             at_least(0)),
    "gpu_name": Setting((str,), "substring the NVML GPU name must contain"),
    "test_timeout_s": Setting(NUMBER, "every test's time limit in place of its own from its measured time, or the "
                              "level's (clustergate/run/testlimit.py); a test past it ends the run", positive),
    "collective_timeout_s": Setting(NUMBER, "default timeout of the workloads' process group", positive),
    "peak_bf16_tflops": Setting(NUMBER, "dense bf16 peak of one device, for MFU", positive),
    "baseline_tolerance": Setting(NUMBER, "relative change against --baseline that is flagged", fraction),
    "peak_tf32_tflops": Setting(NUMBER, "dense tf32 peak of one device", positive),
    "peak_fp16_tflops": Setting(NUMBER, "dense fp16 peak of one device", positive),
    "peak_fp8_tflops": Setting(NUMBER, "dense fp8 peak of one device", positive),
    "nvlinks_per_gpu": Setting((int,), "NVLink links that must be active on every GPU (18 on H100/H200 SXM; "
                               "0: none expected, as on a PCIe card or one GPU passed through to a VM)", at_least(0)),
    "mig_mode": Setting((str,), "required MIG mode: 'disabled' or 'enabled'"),
    "min_driver_version": Setting((str,), "lowest acceptable NVIDIA driver version, e.g. '550.54'"),
    "min_vbios_version": Setting((str,), "lowest acceptable GPU VBIOS, e.g. '96.00.A5.00.1A' (parts compared as "
                                         "hexadecimal numbers; workloads/gpu/firmware.py)"),
    "min_inforom_version": Setting((str,), "lowest acceptable InfoROM image version, e.g. 'G520.0282.02.02'"),
    "min_hca_firmware_version": Setting((str,), "lowest acceptable HCA firmware (/sys/class/infiniband/*/fw_ver), "
                                                "e.g. '28.39.1002'"),
    "pcie_generation": Setting((int,), "PCIe link generation every GPU must train at", at_least(1)),
    "pcie_width": Setting((int,), "PCIe link width every GPU must train at", at_least(1)),
    "collective_judge_bytes": Setting((int,), "message size (bytes) at which collective busbw is judged",
                                      at_least(1)),
    "collective_max_bytes": Setting((int,), "largest message size (bytes) swept at --level standard", at_least(1)),
    "required_transport": Setting((str,), "NCCL transport cross-node traffic must use: 'NET/IB' or 'any'"),
    "ib_ports_per_node": Setting((int,), "active InfiniBand or RoCE ports every node must have (0: none required)",
                                 at_least(0)),
    "ib_rate_gbps": Setting(NUMBER, "link rate (Gb/s) every required InfiniBand or RoCE port must run at", positive),
    "nics_per_node": Setting((int,), "NICs for GPU traffic in nvidia-smi topo -m; at least one a GPU means every "
                             "GPU must have its own nearest NIC (0: the topology is not judged)", at_least(0)),
    "nic_max_distance": Setting((str,), "farthest PCIe distance from a GPU to its own NIC (nvidia-smi topo -m): PIX, "
                                "PXB (default: NCCL's default GPUDirect RDMA level), PHB, NODE or SYS",
                                one_of("PIX", "PXB", "PHB", "NODE", "SYS")),
    "collective_dtype": Setting((str,), "element type of the collective sweeps: 'fp32' (nccl-tests' default) "
                                        "or 'bf16'"),
    "nccl_algo": Setting((str,), "NCCL_ALGO while the bandwidth sweeps' communicators are created: 'Ring' for "
                                 "fabric tests, '' for NCCL's own choice"),
    "burn_in_s": Setting(NUMBER, "seconds of sustained matmul at --level extended", positive),
    "matmul_wallclock_fraction": Setting(NUMBER, "least share of the per-call (event-timed) matmul figure the same "
                                                 "calls must reach by the host's clock (a GPU shared with another job "
                                                 "falls short)", fraction),
    "shared_dir": Setting((str,), "a directory every node mounts (checkpoints, the shared-filesystem test)"),
    "local_scratch_dir": Setting((str,), "the node's local scratch directory fio measures (default $TMPDIR, else "
                                         "/tmp)"),
    "gpu_serial_readable": Setting((bool,), "false for a GPU model whose serial NVML cannot read (it answers a "
                                            "placeholder such as [N/A]): merge and sign-off then know each GPU by its "
                                            "UUID alone; otherwise a placeholder serial leaves its node unbound "
                                            "(default true)"),
    "drift_fraction": Setting(NUMBER, "with a results store (--store): a figure more than this fraction below its "
                                      "own first accepted figure (a GPU's by its serial, a node's by its name) has "
                                      f"drifted (default {DRIFT_FRACTION:g})", below_one),
    "drift_severity": Setting((str,), "with a results store: 'warn' lists a drift among the warnings; "
                                      "'fail' fails its test, unless the metric's own criterion is severity warn "
                                      f"(default {DRIFT_SEVERITY!r})",
                              one_of("warn", "fail")),
}


def setting_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be setting ``name`` (its type or its range); None when it can."""
    spec = SETTINGS[name]
    if isinstance(value, bool) and bool not in spec.types or not isinstance(value, spec.types):
        return f"must be {' or '.join(t.__name__ for t in spec.types)}, got {value!r}{yaml_text_number(value)}"
    return spec.check(value)
