"""Error counters before the first load test: the baseline the tests in test_errors_after.py judge against.

Runs right after the job itself is checked (acceptance/conftest.py's RUN_ORDER) and before any load.
Every rank reads its GPU's counters through NVML and starts listening for NVML XID events; each node's
local rank 0 reads the node's PCIe AER counters, InfiniBand port counters and states, and where the
kernel log stands (with the XIDs it already holds). Nothing is judged here: what was read, and what
could not be, goes into the details, and the GPUs' identities (serial, VBIOS, InfoROM, board part
number) into results.json's ``hardware_inventory`` for the report's support section.
"""

from __future__ import annotations

import time
from typing import Any

from acceptance.evidence import Baseline, host_root, is_node_reader
from clustergate.run.recorder import Recorder
from workloads.gpu import error_counters, xid_events
from workloads.node import ib_counters, kernel_log, pcie_aer
from workloads.result import Result


def _node_snapshot() -> dict[str, Any]:
    root = host_root()
    aer, described, aer_why = pcie_aer.snapshot(root)
    ib, states, ib_why = ib_counters.snapshot(root)
    return {"aer": aer, "aer_devices": described, "aer_unreadable": aer_why, "ib": ib, "ib_states": states,
            "ib_unreadable": ib_why, "kernel": kernel_log.snapshot(root)}


def test_error_counters_before_load(cg: Recorder, error_baseline: Baseline) -> None:
    """Snapshot every error counter and start the XID watcher before any load (judged after the last)."""
    state = error_baseline
    state.t0 = time.monotonic()
    gpu = cg.device.type == "cuda"
    state.gpu = error_counters.read_device(cg.device) if gpu else None
    state.watcher = xid_events.watch(cg.device) if gpu else "no GPU on this rank"
    state.node = _node_snapshot() if is_node_reader(cg) else None
    state.taken = True
    watcher = state.watcher.summary() if hasattr(state.watcher, "summary") else {"listening": False,
                                                                                 "status": state.watcher}
    everyone = cg.all_ranks({"gpu": state.gpu, "xid_watcher": watcher, "node": state.node})
    gpus, nodes = [], []
    for rank, seen in enumerate(everyone):
        ident = cg.identities[rank]
        if seen["gpu"] is not None:
            gpus.append({"rank": rank, "host": ident["host"], "node_rank": ident["node_rank"],
                         **seen["gpu"].get("identity", {}), "counters_before": seen["gpu"].get("counters", {}),
                         "unreadable": {**seen["gpu"].get("unsupported", {}), **seen["gpu"].get("errors", {}),
                                        **({"nvml": seen["gpu"]["error"]} if "error" in seen["gpu"] else {})},
                         "xid_watcher": seen["xid_watcher"]["status"]})
        if seen["node"] is not None:
            node = seen["node"]
            nodes.append({"host": ident["host"], "node_rank": ident["node_rank"],
                          "aer_devices": len(node["aer"]), "aer_unreadable": node["aer_unreadable"],
                          "ib_ports": node["ib_states"], "ib_unreadable": node["ib_unreadable"],
                          "kernel_log": node["kernel"].get("source") or node["kernel"].get("reason"),
                          "xids_before_run": node["kernel"].get("xids", [])})
    section = {"gpus": gpus, "nodes": nodes}
    cg.add_run_section("hardware_inventory", section)
    cg.record_result(Result(metrics=(), details=section))
