"""What the GPUs, links and fabric logged while the suite ran: counters after the last load test, judged
against the snapshot test_errors_before.py took before the first (acceptance/conftest.py's RUN_ORDER).

Each figure is growth over the run (or a rate over it) with a ``max`` criterion in the profile, judged
per part: a GPU (its rank, host, index and serial), a PCI device or an InfiniBand port (its node and
address). A failure names the part, the counter with both values and the next step
(workloads.faults). Counters NVML or sysfs cannot read make the test skip, saying why; GPU-only tests
skip under the cpu profile; AER and InfiniBand are read for real wherever the files exist.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from acceptance.evidence import (
    Baseline,
    Part,
    counter_parts,
    gpu_label,
    host_root,
    is_node_reader,
    require_baseline,
    settle_parts,
    where_of,
)
from acceptance.gpu_helpers import require_device
from clustergate.run.recorder import Recorder
from workloads import faults
from workloads.counters import Change, diff, grown
from workloads.gpu import error_counters
from workloads.node import ib_counters, kernel_log, pcie_aer
from workloads.node.discovery import sysfs_bus_id
from workloads.result import Result


def _gpu_runs(cg: Recorder, state: Baseline) -> list[dict[str, Any]]:
    """Every rank's GPU counters before and after, and the seconds between."""
    require_device(cg, gpu_only=True)
    require_baseline(cg, state)
    return cg.all_ranks({"before": state.gpu or {"error": "not read before the run"},
                         "after": error_counters.read_device(cg.device), "seconds": time.monotonic() - state.t0})


def _gpu_parts(cg: Recorder, state: Baseline, title: str, metrics: tuple[str, ...], extra: Any = None) -> None:
    """Judge ``metrics`` of error_counters.METRICS on every GPU; ``extra(rank, label, changes, seen)`` adds
    parts of its own (rates, states)."""
    parts: list[Part] = []
    unreadable: dict[str, str] = {}
    broken: dict[int, list[str]] = {}
    for rank, seen in enumerate(_gpu_runs(cg, state)):
        label, before, after = gpu_label(cg, rank), seen["before"], seen["after"]
        if "error" in before:
            unreadable[label] = before["error"]
            continue
        if "error" in after:
            broken[rank] = [f"{label}: NVML read its counters before the run but not after ({after['error']}). "
                            f"Next step: {faults.next_step('gpu_off_bus')}"]
            continue
        changes = diff(before["counters"], after["counters"])
        lost = [c for c in changes if c.after is None]
        if lost:
            why = "; ".join(f"{c.part} {c.counter}: {after['errors'].get(c.counter, 'not read')}" for c in lost[:4])
            broken[rank] = [f"{label}: counters read before the run could not be read after ({why}). "
                            f"Next step: {faults.next_step('gpu_off_bus')}"]
        found, _ = counter_parts({m: error_counters.METRICS[m] for m in metrics}, changes, owner=rank, scope="gpu",
                                 label=label)
        found += extra(rank, label, changes, seen) if extra is not None else []
        parts += found
        unsupported = {**before.get("unsupported", {}), **before.get("errors", {})}
        for m in set(cg.declared) - {p.metric for p in found}:
            names = (*error_counters.SOURCES.get(m, ()), "nvlink")
            unreadable[f"{label} {m}"] = next((unsupported[n] for n in names if n in unsupported), "not read")
    settle_parts(cg, title, parts, unreadable, broken)


@pytest.mark.metrics("xid_critical_events", "xid_other_events")
def test_no_xid_errors_during_run(cg: Recorder, error_baseline: Baseline) -> None:
    """XIDs logged for each GPU during the run: NVML's XID events and the kernel log's NVRM: Xid lines."""
    require_device(cg, gpu_only=True)
    state = error_baseline
    require_baseline(cg, state)
    watcher = state.watcher
    nvml = watcher.summary() if hasattr(watcher, "summary") else {"listening": False, "status": str(watcher),
                                                                   "events": []}
    kernel = None
    if is_node_reader(cg) and state.node is not None:
        lines, why = kernel_log.xids_since(host_root(), state.node["kernel"])
        kernel = {"xids": [x.as_dict() for x in lines], "why": why}
    everyone = cg.all_ranks({"nvml": nvml, "kernel": kernel})
    logs = {cg.identities[r]["node_rank"]: e["kernel"] for r, e in enumerate(everyone) if e["kernel"] is not None}
    parts: list[Part] = []
    unreadable: dict[str, str] = {}
    claimed: set[tuple[int, str]] = set()
    for rank, seen in enumerate(everyone):
        ident, label = cg.identities[rank], gpu_label(cg, rank)
        bus = sysfs_bus_id((ident.get("gpu") or {}).get("pci_bus_id") or "")
        log = logs.get(ident["node_rank"]) or {"xids": [], "why": "no kernel log reader on this node"}
        claimed.add((ident["node_rank"], bus))
        sources: dict[str, list[tuple[int, str]]] = {}
        if seen["nvml"]["listening"]:
            sources["NVML event"] = [(e["code"], "") for e in seen["nvml"]["events"]]
        if not log["why"]:
            sources["kernel log"] = [(x["code"], x["text"]) for x in log["xids"] if x["bus_id"] == bus]
        if not sources:
            unreadable[label] = f"NVML: {seen['nvml']['status']}; kernel log: {log['why']}"
            continue
        for metric, critical in (("xid_critical_events", True), ("xid_other_events", False)):
            hits = {src: [(c, t) for c, t in codes if faults.xid(c).critical == critical]
                    for src, codes in sources.items()}
            evidence = tuple(f"XID {c} ({faults.xid(c).meaning}) [{src}]" + (f": {t}" if t else "")
                             for src, codes in hits.items() for c, t in codes)
            first = next((c for codes in hits.values() for c, _ in codes), None)
            category = faults.xid(first).category if first is not None else "unknown_xid" if critical else "application"
            # NVML and the kernel log report the same events: the larger count stands for both
            parts.append(Part(metric, rank, "gpu", label, float(max(len(v) for v in hits.values())), "count",
                              category, evidence))
    foreign = [{"node_rank": n, **x} for n, log in logs.items() for x in log["xids"] if (n, x["bus_id"]) not in claimed]
    if foreign:  # XIDs of GPUs no rank of this job uses: shown, not judged
        cg.record_result(Result(metrics=(), details={"xids_on_gpus_outside_the_job": foreign}))
    settle_parts(cg, "XIDs during the run", parts, unreadable)


@pytest.mark.metrics("ecc_uncorrected_delta", "ecc_corrected_delta")
def test_ecc_errors_during_run(cg: Recorder, error_baseline: Baseline) -> None:
    """Volatile ECC errors counted during the run: uncorrectable fails, corrected warns above the profile's max."""
    _gpu_parts(cg, error_baseline, "ECC errors during the run", ("ecc_uncorrected_delta", "ecc_corrected_delta"))


def _pending(rank: int, label: str, changes: list[Change], seen: dict[str, Any]) -> list[Part]:
    after = seen["after"]["counters"].get(error_counters.GPU_PART, {})
    states = {k: after[k] for k in error_counters.PENDING if k in after}
    if not states:
        return []
    on = [k for k, v in states.items() if v]
    return [Part("memory_repair_pending", rank, "gpu", label, float(bool(on)), "count", "row_remap_pending",
                 tuple(f"{k} = 1 after the run" for k in on))]


@pytest.mark.metrics("memory_repairs_delta", "memory_repair_pending")
def test_memory_repairs_during_run(cg: Recorder, error_baseline: Baseline) -> None:
    """Rows remapped (or pages retired) during the run, and no repair left waiting for a GPU reset."""
    _gpu_parts(cg, error_baseline, "memory repairs during the run", ("memory_repairs_delta",), extra=_pending)


def _rate(metric: str, counters: tuple[str, ...], per_s: float, unit: str, category: str) -> Any:
    def parts(rank: int, label: str, changes: list[Change], seen: dict[str, Any]) -> list[Part]:
        mine = [c for c in changes if c.counter in counters]
        if not mine:
            return []
        seconds = max(seen["seconds"], 1e-3)
        grew = sum(c.delta or 0 for c in mine)
        return [Part(metric, rank, "gpu", label, grew / seconds * per_s, unit, category,
                     tuple(f"{c.part}: {c.text()}" for c in grown(mine)) + (f"over {seconds:.0f} s",))]
    return parts


@pytest.mark.metrics("pcie_replays_per_min")
def test_pcie_replays_during_run(cg: Recorder, error_baseline: Baseline) -> None:
    """PCIe replays per minute of the run, against the link's expected bit error rate (DCGM's rule)."""
    _gpu_parts(cg, error_baseline, "PCIe replays during the run", (),
               extra=_rate("pcie_replays_per_min", ("pcie_replay",), 60, "1/min", "pcie_replay"))


@pytest.mark.metrics("nvlink_crc_errors_delta", "nvlink_crc_errors_per_s", "nvlink_replay_errors_delta",
                     "nvlink_recovery_errors_delta")
def test_nvlink_errors_during_run(cg: Recorder, error_baseline: Baseline) -> None:
    """NVLink CRC, replay and recovery errors per GPU over the run, every link (DCGM's health rules)."""
    _gpu_parts(cg, error_baseline, "NVLink errors during the run",
               ("nvlink_crc_errors_delta", "nvlink_replay_errors_delta", "nvlink_recovery_errors_delta"),
               extra=_rate("nvlink_crc_errors_per_s", ("crc",), 1, "1/s", "nvlink_crc"))


def _node_runs(cg: Recorder, state: Baseline, read: Any) -> list[tuple[int, dict[str, Any]]]:
    """(reader rank, its node's before and after) for every node."""
    require_baseline(cg, state)
    mine = read(state.node) if is_node_reader(cg) and state.node is not None else None
    return [(rank, seen) for rank, seen in enumerate(cg.all_ranks(mine)) if seen is not None]


def _gpu_on_node(cg: Recorder, rank: int, bdf: str) -> str:
    node = cg.identities[rank]["node_rank"]
    for r, ident in enumerate(cg.identities):
        gpu = ident.get("gpu") or {}
        if ident["node_rank"] == node and gpu.get("pci_bus_id") and sysfs_bus_id(gpu["pci_bus_id"]) == bdf:
            return f", {gpu_label(cg, r)}"
    return ""


@pytest.mark.metrics("pcie_aer_fatal_delta", "pcie_aer_nonfatal_delta", "pcie_aer_correctable_delta")
def test_pcie_aer_errors_during_run(cg: Recorder, error_baseline: Baseline) -> None:
    """PCIe AER fatal, non-fatal and correctable errors of every PCI device of every node during the run."""
    def read(node: dict[str, Any]) -> dict[str, Any]:
        after, described, why = pcie_aer.snapshot(host_root())
        return {"before": node["aer"], "after": after, "devices": {**node["aer_devices"], **described},
                "why": node["aer_unreadable"]}

    parts: list[Part] = []
    unreadable: dict[str, str] = {}
    broken: dict[int, list[str]] = {}
    for rank, seen in _node_runs(cg, error_baseline, read):
        node = where_of(cg, rank).label("node")
        if seen["why"]:
            unreadable[node] = seen["why"]
            continue
        changes = diff(seen["before"], seen["after"])
        for bdf in sorted(seen["before"]):
            mine = [c for c in changes if c.part == bdf]
            label = f"{bdf} ({seen['devices'].get(bdf, 'device')}{_gpu_on_node(cg, rank, bdf)})"
            if any(c.after is None for c in mine):
                broken.setdefault(rank, []).append(
                    f"{node}: {label} had AER counters before the run and is gone after: it fell off the bus or was "
                    f"removed. Next step: {faults.next_step('aer_fatal')}")
                continue
            found, _ = counter_parts(pcie_aer.METRICS, mine, owner=rank, scope="node", label=label)
            for p in found:  # name the error types that grew, not only the total
                kind = pcie_aer.METRICS[p.metric][0][0].split(".")[0]
                kinds = tuple(c.text() for c in grown(mine) if c.counter.startswith(kind + ".")
                              and not c.counter.endswith(pcie_aer.KINDS[kind]))
                parts.append(replace(p, evidence=p.evidence + kinds))
    settle_parts(cg, "PCIe AER errors during the run", parts, unreadable, broken)


@pytest.mark.metrics(*ib_counters.METRICS, "ib_port_state_changes")
def test_infiniband_errors_during_run(cg: Recorder, error_baseline: Baseline) -> None:
    """InfiniBand port error counters and link state of every port of every node, before against after."""
    def read(node: dict[str, Any]) -> dict[str, Any]:
        after, states, _ = ib_counters.snapshot(host_root())
        return {"before": node["ib"], "after": after, "states_before": node["ib_states"], "states_after": states,
                "why": node["ib_unreadable"]}

    parts: list[Part] = []
    unreadable: dict[str, str] = {}
    portless = 0
    for rank, seen in _node_runs(cg, error_baseline, read):
        node = where_of(cg, rank).label("node")
        if seen["why"]:
            unreadable[node] = seen["why"]
            portless += not seen["states_before"]
            continue
        changes = diff(seen["before"], seen["after"], ib_counters.WIDTHS)
        moved = ib_counters.state_changes(seen["states_before"], seen["states_after"])
        for port in sorted(seen["states_before"]):
            found, _ = counter_parts(ib_counters.METRICS, [c for c in changes if c.part == port], owner=rank,
                                     scope="node", label=port)
            parts += found
            parts.append(Part("ib_port_state_changes", rank, "node", port, float(port in moved), "count",
                              "ib_link_down", (moved[port],) if port in moved else ()))
    # Nodes without a port at all skip on that fact (the record's discovery shows it); a port whose counters cannot be
    # read is one the node does not offer.
    settle_parts(cg, "InfiniBand errors during the run", parts, unreadable,
                 unreadable_fact="no_infiniband" if unreadable and portless == len(unreadable) else "unsupported")
