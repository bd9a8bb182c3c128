"""InfiniBand port error counters and link state, from sysfs.

``/sys/class/infiniband/<hca>/ports/<port>/counters/`` holds the InfiniBand PortCounters attributes
(IBTA volume 1, PortCounters): they saturate at their width instead of wrapping, so a counter already
at its maximum cannot show growth (``WIDTHS``). State, physical state and rate come from
``workloads.node.discovery.read_infiniband``; a port whose state or rate differs after the run changed
during it (a link that flapped and came back shows in ``link_downed`` instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.node.discovery import _read, read_infiniband

WIDTHS = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16,
}
"""Error counters read, with their width in bits (IBTA PortCounters)."""

METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "ib_link_downed_delta": (("link_downed",), "ib_link_down"),
    "ib_symbol_error_delta": (("symbol_error",), "ib_link_errors"),
    "ib_link_error_recovery_delta": (("link_error_recovery",), "ib_link_errors"),
    "ib_port_rcv_errors_delta": (("port_rcv_errors",), "ib_receive_errors"),
    "ib_port_xmit_discards_delta": (("port_xmit_discards",), "ib_discards"),
    "ib_other_errors_delta": (("port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
                               "port_xmit_constraint_errors", "port_rcv_constraint_errors",
                               "local_link_integrity_errors", "excessive_buffer_overrun_errors", "VL15_dropped"),
                              "ib_receive_errors"),
}
"""Metric -> (the counters summed into it, its failure category in workloads.faults)."""

STATE_FIELDS = ("state", "phys_state", "rate", "link_layer")


def part_name(port: dict[str, Any]) -> str:
    return f"{port['device']} port {port['port']}"


def snapshot(root: Path) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, Any]], str | None]:
    """(error counters per port, state per port, why nothing could be read or None)."""
    ports = read_infiniband(root)
    if not ports:
        return {}, {}, (f"no InfiniBand or RoCE port under {root / 'sys/class/infiniband'} (no HCA, or its driver "
                        "is not loaded)")
    counters: dict[str, dict[str, int]] = {}
    states: dict[str, dict[str, Any]] = {}
    for port in ports:
        name = part_name(port)
        states[name] = {k: port[k] for k in STATE_FIELDS}
        base = root / "sys/class/infiniband" / port["device"] / "ports" / str(port["port"]) / "counters"
        values = {c: _read(base, c) for c in WIDTHS}
        counters[name] = {c: int(v) for c, v in values.items() if v is not None and v.strip().isdigit()}
    if not any(counters.values()):
        return {}, states, f"InfiniBand ports {sorted(states)} expose no error counters under ports/*/counters/"
    return counters, states, None


def state_changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, str]:
    """{port: 'state ACTIVE -> DOWN, rate ...'} for every port whose state, physical state or rate changed."""
    out: dict[str, str] = {}
    for name, old in sorted(before.items()):
        new = after.get(name)
        if new is None:
            out[name] = "gone after the run"
            continue
        moved = [f"{k} {old[k]} -> {new[k]}" for k in STATE_FIELDS if old.get(k) != new.get(k)]
        if moved:
            out[name] = ", ".join(moved)
    return out
