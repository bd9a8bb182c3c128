"""Judging what ``clustergate health`` read against the profile: one ``Finding`` per check and part.

Every rule is the acceptance suite's own: workloads.gpu.health's ``check_*`` for the GPU's state,
workloads.gpu.processes.judge for processes on a GPU, clustergate.criteria.expect.check for the ``expect:`` section,
the profile's metric criteria (clustergate.criteria.criterion, as clustergate.record.judge applies them) for GPU memory
and XIDs, workloads.node.checks.ib_problem for InfiniBand, workloads.faults for what an XID means and what to do. A
node is held to the same rule, in the same words, by both tiers.

Pure functions over plain data: the suite's tests judge planted readings with no GPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from clustergate.common.numbers import number
from clustergate.common.parts import gpu_part
from clustergate.criteria.criterion import Figure
from clustergate.criteria.expect import RULES, check
from clustergate.criteria.thresholds import Profile
from clustergate.health.read import GPU_EXPECT, NODE_EXPECT, GpuRead, NodeRead
from workloads import faults
from workloads.clocks import BAD_CLOCK_EVENTS, reason_names
from workloads.gpu import gpu_config, health, processes
from workloads.node.checks import ib_problem
from workloads.node.discovery import sysfs_bus_id

Status = Literal["ok", "fail", "warn", "unreadable", "skip"]
"""ok; fail (the node is not healthy); warn (a ``warn`` criterion missed: listed, the node stays healthy);
unreadable (NVML or the files cannot say: never a pass, listed); skip (the profile does not judge it here)."""

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: Status
    message: str
    value: str | None = None
    """What was seen, in short ('Gen5 x8', '7', 'disabled')."""
    expected: str | None = None
    """What the profile expects, in short ('Gen5 x16', '>= 79', 'enabled')."""
    gpu: dict[str, Any] | None = None
    """The GPU it concerns: index (NVML's, as nvidia-smi numbers them), serial, uuid, pci_bus_id."""
    part: str | None = None
    """A part that is not a GPU: an InfiniBand port, a PCI address."""

    def where(self, host: str) -> str:
        if self.gpu is not None:
            return f"{host} {gpu_part(self.gpu['index'], self.gpu.get('serial'))}"
        return f"{host} {self.part}" if self.part else host

    def line(self, host: str) -> str:
        """'gpu017 gpu 3 serial 1652...: ecc_mode = disabled (expected enabled): ECC is disabled (...)'."""
        seen = f" = {self.value}" if self.value is not None else ""
        want = f" (expected {self.expected})" if self.expected is not None else ""
        return f"{self.where(host)}: {self.check}{seen}{want}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


_STATUS: dict[str, Status] = {"ok": "ok", "fail": "fail", "unsupported": "unreadable"}

GpuRule = Callable[[GpuRead, Profile], Finding | None]


def _finding(name: str, c: health.Check, gpu: GpuRead, value: str | None, expected: str | None) -> Finding:
    return Finding(name, _STATUS[c.status], c.message, value if c.status != "unsupported" else None, expected,
                   gpu=gpu.identity)


def _value(c: health.Check, key: str) -> Any:
    return c.value.get(key) if isinstance(c.value, dict) else None


def _on_off(flag: Any) -> str:
    return "enabled" if flag else "disabled"


def gpu_model(g: GpuRead, p: Profile) -> Finding | None:
    want = p.setting("gpu_name", None)
    if want is None:
        return None
    c = health.check_model(g.snapshot, str(want))
    return _finding("gpu_model", c, g, (g.snapshot.get("gpu") or {}).get("name"), f"a name containing {want!r}")


def ecc_mode(g: GpuRead, p: Profile) -> Finding:
    c = health.check_ecc_enabled(g.snapshot)
    now, pending = _value(c, "current"), _value(c, "pending")
    shown = None if now is None else _on_off(now) + ("" if pending == now else f", {_on_off(pending)} after a reset")
    return _finding("ecc_mode", c, g, shown, "enabled")


def ecc_uncorrectable(g: GpuRead, p: Profile) -> Finding:
    c = health.check_no_uncorrectable_ecc(g.snapshot)
    n = _value(c, "uncorrected_volatile")
    return _finding("ecc_uncorrectable", c, g, None if n is None else str(n), "0 since the driver loaded")


def memory_repair_pending(g: GpuRead, p: Profile) -> Finding:
    c = health.check_no_pending_memory_repair(g.snapshot)
    judged = {k: v for k, v in (c.value or {}).items() if k != "not_supported"} if isinstance(c.value, dict) else {}
    pending = [k for k, v in judged.items() if v]
    return _finding("memory_repair_pending", c, g, ", ".join(pending) or "none", "none pending")


def row_remap_failure(g: GpuRead, p: Profile) -> Finding:
    c = health.check_no_remap_failure(g.snapshot)
    failed = _value(c, "failure")
    return _finding("row_remap_failure", c, g, None if failed is None else "failed" if failed else "none",
                    "no failure")


def clock_slowdown(g: GpuRead, p: Profile) -> Finding:
    c = health.check_no_throttle(g.snapshot)
    return _finding("clock_slowdown", c, g, ", ".join(_value(c, "reasons") or []) or "none",
                    f"none of {', '.join(reason_names(BAD_CLOCK_EVENTS))}")


def pcie_link(g: GpuRead, p: Profile) -> Finding:
    gen, width = p.setting("pcie_generation", None), p.setting("pcie_width", None)
    c = health.check_pcie_link(g.snapshot, gen, width, idle=True)
    v = c.value if isinstance(c.value, dict) else {}
    seen = f"Gen{v.get('pcie_gen_max')} x{v.get('pcie_width_current')}" if v else None
    want_gen = gen if gen is not None else v.get("pcie_gen_max")
    want = f"Gen{want_gen} x{width if width is not None else v.get('pcie_width_max')}"
    return _finding("pcie_link", c, g, seen, want)


def nvlinks(g: GpuRead, p: Profile) -> Finding:
    want = p.setting("nvlinks_per_gpu", None)
    c = health.check_nvlinks(g.snapshot, want)
    v = c.value if isinstance(c.value, dict) else {}
    seen = f"{v['active']} of {v['present']} active" if v else None
    return _finding("nvlinks", c, g, seen, f"{want} active" if want is not None else "every link active")


def mig_mode(g: GpuRead, p: Profile) -> Finding | None:
    want = p.setting("mig_mode", None)
    if want is None:
        return None
    c = health.check_mig_mode(g.snapshot, str(want))
    return _finding("mig_mode", c, g, _value(c, "current"), str(want))


def driver_minimum(g: GpuRead, p: Profile) -> Finding | None:
    minimum = p.setting("min_driver_version", None)
    if minimum is None:
        return None
    c = health.check_driver_at_least(g.snapshot, str(minimum))
    return _finding("driver_minimum", c, g, g.snapshot.get("software", {}).get("driver"), f">= {minimum}")


def foreign_processes(g: GpuRead, p: Profile) -> Finding:
    """Before a job starts (a Prolog) or after it ended (an Epilog) every process on a GPU is another job's."""
    listing = {"host": None, "gpu": {"uuid": g.identity["uuid"]}, **g.processes}
    c = processes.judge(listing, [])
    foreign = _value(c, "foreign")
    return _finding("foreign_processes", c, g, None if foreign is None else str(foreign), "0")


GPU_RULES: dict[str, GpuRule] = {
    "gpu_model": gpu_model, "ecc_mode": ecc_mode, "ecc_uncorrectable": ecc_uncorrectable,
    "memory_repair_pending": memory_repair_pending, "row_remap_failure": row_remap_failure,
    "clock_slowdown": clock_slowdown, "pcie_link": pcie_link, "nvlinks": nvlinks, "mig_mode": mig_mode,
    "driver_minimum": driver_minimum, "foreign_processes": foreign_processes,
}
"""Checks of each GPU's own state, by name."""

XID_CHECKS = ("xid_critical_events", "xid_other_events")
"""The kernel log's XIDs, judged by the metric criteria of the same names the run records (``xid_events``)."""
NODE_CHECKS = ("gpu_driver", "gpu_count", "infiniband")
CHECKS = (*NODE_CHECKS, *GPU_RULES, "gpu_memory", "xid_events", *(f"expect.{k}" for k in (*GPU_EXPECT, *NODE_EXPECT)))
"""Every check ``--skip`` can leave out (``xid_events`` both XID checks; ``expect`` every expect: key)."""


def skipped(check: str, skip: frozenset[str]) -> bool:
    return check in skip or check.split(".")[0] in skip or (check.startswith("xid_") and "xid_events" in skip)


def _metric(name: str, metric: str, p: Profile, parts: list[tuple[float, dict[str, Any] | None, str | None, str]],
            unit: str) -> list[Finding]:
    """Each part's figure (value, gpu, part, evidence) against the profile's criterion of ``metric``."""
    c = p.metrics.get(metric)
    if c is None or not c.judged:
        return [Finding(name, "skip", f"profile {p.name!r} sets no criterion for {metric}")] if parts else []
    weighed = c.weigh([Figure(value, c.unit or unit, 0) for value, _, _, _ in parts], "gpu")
    out = []
    for (value, gpu, part, evidence), (failed, warned) in zip(parts, weighed, strict=True):
        status: Status = "fail" if failed else "warn" if warned else "ok"
        said = "; ".join(failed or warned)
        message = f"{metric}={number(value)} {c.unit or unit}" + (f", {said}" if said else "") + \
            (f": {evidence}" if evidence else "")
        shown = number(value) if (c.unit or unit) == "count" else f"{number(value)} {c.unit or unit}"
        out.append(Finding(name, status, message, shown, c.text(), gpu=gpu, part=part))
    return out


def gpu_memory(node: NodeRead, p: Profile) -> list[Finding]:
    """NVML's memory total per GPU against the criterion of gpu_memory_gib (the run records CUDA's, about 0.5 GiB
    less on an H100: the reserve the driver keeps)."""
    parts = []
    for g in node.gpus:
        total = (g.snapshot.get("gpu") or {}).get("nvml_memory_total_bytes")
        if total is not None:
            parts.append((total / GiB, g.identity, None, "NVML's memory total"))
    return _metric("gpu_memory", "gpu_memory_gib", p, parts, "GiB")


def xid_events(node: NodeRead, p: Profile) -> list[Finding]:
    """XIDs in the kernel log, per GPU (by PCI address) and for addresses no GPU of NVML's has, split as the run
    splits them: critical (hardware, memory, link, firmware) and other (application faults)."""
    log = node.kernel
    if log is None:
        return []
    if not log.readable:
        return [Finding("xid_events", "unreadable", f"the kernel log cannot be read: {log.reason}")]
    since = "since boot" if log.since is None else "since the last healthy check"
    by_bus: dict[str, list[dict[str, Any]]] = {}
    for x in log.xids:
        by_bus.setdefault(x["bus_id"], []).append(x)
    owners: list[tuple[dict[str, Any] | None, str | None, list[dict[str, Any]]]] = []
    for g in node.gpus:
        bus = sysfs_bus_id(g.identity["pci_bus_id"] or "")
        owners.append((g.identity, None, by_bus.pop(bus, [])))
    owners += [(None, f"PCI {bus}", xids) for bus, xids in sorted(by_bus.items())]
    out: list[Finding] = []
    for metric, critical in (("xid_critical_events", True), ("xid_other_events", False)):
        parts = []
        for gpu, part, xids in owners:
            hits = [x for x in xids if faults.xid(x["code"]).critical == critical]
            if not hits and gpu is None:
                continue
            said = "; ".join(f"XID {x['code']} ({faults.xid(x['code']).meaning}): {x['text']}" for x in hits[:3])
            if hits:
                said += f" ({len(hits)} {since}). Next step: {faults.next_step(faults.xid(hits[0]['code']).category)}"
            parts.append((float(len(hits)), gpu, part, said))
        out += _metric(metric, metric, p, parts, "count")
    return out


def expect_gpu(node: NodeRead, p: Profile) -> list[Finding]:
    """The profile's expect: keys NVML answers, for every GPU."""
    out = []
    for key in GPU_EXPECT:
        expected = p.expect.get(key)
        if expected is None:
            continue
        for g in node.gpus:
            if key == "fabric_manager":
                value, shown = gpu_config.fabric_seen(g.config, node.nvswitches, node.fabric_managers)
            else:
                value, shown = gpu_config.field_seen(g.config, key)
            out.append(_expected(key, expected, value, shown, gpu=g.identity))
    return out


def _expected(key: str, expected: Any, value: Any, shown: str, **where: Any) -> Finding:
    if value is None:
        return Finding(f"expect.{key}", "unreadable", shown, None, expected.text, **where)
    problem = check(expected, value)
    message = f"{problem} ({shown}). Next step: {faults.next_step(RULES[key].category)}" if problem else shown
    shown_value = str(value).lower() if isinstance(value, bool) else str(value)
    return Finding(f"expect.{key}", "fail" if problem else "ok", message, shown_value, expected.text, **where)


def expect_node(node: NodeRead, p: Profile) -> list[Finding]:
    return [_expected(key, p.expect[key], value, shown) for key, (value, shown) in node.node_settings.items()]


def not_here(p: Profile) -> list[Finding]:
    """The profile's expect: keys only a run can judge, named so nobody takes their absence for a pass."""
    return [Finding(f"expect.{key}", "skip", f"{RULES[key].what}: needs torch's NCCL, judged by the run")
            for key in ("nccl", "nccl_gdr") if key in p.expect]


def gpu_count(node: NodeRead, p: Profile) -> list[Finding]:
    """GPUs NVML lists against the profile's gpus_per_node, and against the GPUs on the PCI bus: a GPU the bus
    shows and NVML does not is one the driver cannot use."""
    listed, on_bus = len(node.presence.nvml_gpus), len(node.presence.pci_gpus)
    want = p.setting("gpus_per_node", None)
    problems = []
    if want is not None and listed != want:
        problems.append(f"NVML lists {listed} GPUs, the profile expects {want}")
    if on_bus > listed:
        problems.append(f"{on_bus} NVIDIA GPUs on the PCI bus but NVML lists {listed}: the driver cannot use "
                        f"{on_bus - listed} (dmesg: Xid 79, 'fallen off the bus'; nvidia-smi)")
    seen = f"{listed} (NVML), {on_bus} on the PCI bus"
    expected = str(want) if want is not None else "as many as the PCI bus shows"
    if problems:
        return [Finding("gpu_count", "fail", "; ".join(problems) + f". Next step: {faults.next_step('gpu_off_bus')}",
                        seen, expected)]
    return [Finding("gpu_count", "ok", f"{listed} GPUs", seen, expected)]


def infiniband(node: NodeRead, p: Profile) -> list[Finding]:
    required = p.setting("ib_ports_per_node", None)
    if not required or node.infiniband is None:
        return []
    rate = p.setting("ib_rate_gbps", None)
    expected = f"{required} ports ACTIVE" + (f" at >= {number(rate)} Gb/s" if rate else "")
    problem = ib_problem(node.infiniband, required, rate)
    if problem:
        return [Finding("infiniband", "fail", f"{problem}. Next step: {faults.next_step('ib_link_down')}",
                        expected=expected)]
    return [Finding("infiniband", "ok", f"{len(node.infiniband)} ports read", expected=expected)]


def judge_node(node: NodeRead, p: Profile, *, gpus_expected: bool, skip: frozenset[str] = frozenset()) -> list[Finding]:
    """Every finding for ``node`` under profile ``p``; checks named in ``skip`` are left out."""
    out: list[Finding] = []
    if gpus_expected:
        if node.nvml_error is not None:
            out.append(Finding("gpu_driver", "fail", node.presence.broken(node.nvml_error), "NVML does not answer",
                               "NVML lists the GPUs"))
        else:
            out += gpu_count(node, p)
            for g in node.gpus:
                if g.snapshot.get("gpu") is None:
                    why = g.snapshot["nvml"]["error"]
                    out.append(Finding("gpu_driver", "fail", f"{why}. Next step: {faults.next_step('gpu_off_bus')}",
                                       gpu={"index": g.index, "serial": None}))
                    continue
                out += [f for rule in GPU_RULES.values() if (f := rule(g, p)) is not None]
            out += gpu_memory(node, p) + expect_gpu(node, p)
        out += xid_events(node, p)
    out += infiniband(node, p) + expect_node(node, p) + not_here(p)
    # the node's own findings first, then GPU by GPU (each GPU's in the order above)
    kept = [f for f in out if not skipped(f.check, skip)]
    return sorted(kept, key=lambda f: -1 if f.gpu is None else int(f.gpu["index"]))
