"""The profile's ``expect:`` section: how a node must be configured, key by key.

    expect:
      driver: ">=550.54.15, <580"   # version ranges (PEP 440 specifiers, as pip writes them)
      cuda: ">=12.4"                # the CUDA version the driver supports (nvidia-smi's "CUDA Version")
      nccl: ">=2.21"                # the NCCL torch runs
      persistence_mode: true
      fabric_manager: true          # where NVSwitches exist, the fabric manager has set up every GPU
      acs: false                    # PCIe ACS off on the path between each GPU and its nearest NIC
      iommu: [off, passthrough]     # quote 'off' where it stands alone: YAML reads a bare off as false
      numa_balancing: false
      cpu_governor: performance
      gpudirect_rdma: true          # nvidia_peermem loaded, or the CUDA driver's dma-buf
      nccl_gdr: true                # NCCL's log shows GPUDirect RDMA on its InfiniBand channels

Each key is one acceptance test (acceptance/test_node_config.py); a key the profile leaves out is not
checked (its test skips, saying so). ``parse`` validates the raw mapping with one clear error naming
the file and key (``thresholds.load`` hands it over); ``check`` judges what a node or GPU showed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

IOMMU_MODES = ("off", "passthrough", "translated")


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    """'versions' (a specifier set), 'state' (true/false), 'required' (only true), 'choice' (one or a list)."""
    scope: str
    """'gpu': every GPU is judged; 'node': every node once."""
    category: str
    """Its failure category in workloads.faults (the next step comes from there)."""
    what: str
    choices: tuple[str, ...] = ()


RULES: dict[str, Rule] = {
    "driver": Rule("versions", "gpu", "config_versions", "NVIDIA driver version (NVML)"),
    "cuda": Rule("versions", "gpu", "config_versions", "CUDA version the driver supports"),
    "nccl": Rule("versions", "gpu", "config_versions", "NCCL version torch runs"),
    "persistence_mode": Rule("state", "gpu", "config_persistence", "GPU persistence mode"),
    "fabric_manager": Rule("required", "gpu", "config_fabric_manager",
                           "NVSwitch fabric set up by the fabric manager (where NVSwitches exist)"),
    "acs": Rule("state", "node", "config_acs", "PCIe ACS redirection between each GPU and its nearest NIC"),
    "iommu": Rule("choice", "node", "config_iommu", "IOMMU mode", IOMMU_MODES),
    "numa_balancing": Rule("state", "node", "config_numa_balancing", "automatic NUMA balancing"),
    "cpu_governor": Rule("choice", "node", "config_cpu_governor", "CPU frequency governor"),
    "gpudirect_rdma": Rule("required", "node", "config_gpudirect",
                           "GPUDirect RDMA available (nvidia_peermem, or dma-buf)"),
    "nccl_gdr": Rule("required", "gpu", "config_gpudirect", "NCCL uses GPUDirect RDMA on InfiniBand"),
}


@dataclass(frozen=True, slots=True)
class Expected:
    key: str
    value: Any
    """SpecifierSet for versions, bool for states, a tuple of allowed names for choices."""
    text: str
    """As the file says it, for messages and the report."""

    @property
    def rule(self) -> Rule:
        return RULES[self.key]


Fail = Callable[[str, str], Exception]
"""(key path, problem) -> the error to raise (thresholds.py builds it, naming the file)."""


def _one(key: str, raw: Any, where: str, fail: Fail) -> Expected:
    rule = RULES[key]
    here = f"{where}.{key}"
    if rule.kind == "versions":
        if not isinstance(raw, str):
            raise fail(here, f"must be a version range in quotes, e.g. '>=550.54, <580', got {raw!r}")
        try:
            return Expected(key, SpecifierSet(raw), raw)
        except InvalidSpecifier:
            raise fail(here, f"{raw!r} is not a version range; write e.g. '>=550.54, <580' or '==2.21.5'") from None
    if rule.kind in ("state", "required"):
        if not isinstance(raw, bool):
            raise fail(here, f"must be true or false, got {raw!r}")
        if rule.kind == "required" and not raw:
            raise fail(here, "only true has a meaning here; leave the key out to not check it")
        return Expected(key, raw, str(raw).lower())
    values = raw if isinstance(raw, list) else [raw]
    if any(isinstance(v, bool) for v in values):
        raise fail(here, f"got {raw!r}: YAML reads a bare off/on/yes/no as true/false; quote it, e.g. 'off'")
    if not values or not all(isinstance(v, str) and v for v in values):
        raise fail(here, f"must be a name or a list of names, got {raw!r}")
    bad = [v for v in values if rule.choices and v not in rule.choices]
    if bad:
        raise fail(here, f"{bad[0]!r} is not one of {', '.join(rule.choices)}")
    return Expected(key, tuple(values), " or ".join(values))


def parse(raw: Any, where: str, fail: Fail) -> dict[str, Expected]:
    """The validated ``expect:`` mapping (empty when absent)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise fail(where, f"must be a mapping of {', '.join(RULES)}, got {raw!r}")
    unknown = sorted(set(raw) - set(RULES))
    if unknown:
        raise fail(f"{where}.{unknown[0]}", f"unknown key; expect: takes {', '.join(RULES)}")
    return {key: _one(key, value, where, fail) for key, value in raw.items()}


def check(expected: Expected, seen: Any) -> str | None:
    """Why ``seen`` breaks the expectation, or None when it meets it."""
    rule = expected.rule
    if rule.kind == "versions":
        try:
            ok = expected.value.contains(Version(str(seen)), prereleases=True)
        except InvalidVersion:
            return f"{rule.what} is {seen!r}, not a version the range {expected.text!r} can judge"
        return None if ok else f"{rule.what} is {seen}, the profile expects {expected.text}"
    if rule.kind == "choice":
        return None if seen in expected.value else f"{rule.what} is {seen}, the profile expects {expected.text}"
    if bool(seen) == expected.value:
        return None
    state = {True: "on", False: "off"}
    shown = state[bool(seen)] if rule.kind == "state" else "not met"
    want = state[expected.value] if rule.kind == "state" else "required"
    return f"{rule.what}: {shown}, the profile expects {want}"
