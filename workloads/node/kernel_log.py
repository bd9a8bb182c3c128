"""XID lines in the kernel log: ``NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.``

The log is read from ``/dev/kmsg`` (each record carries a sequence number, so "after the first snapshot"
is exact) or, where that cannot be opened, from ``dmesg`` (timestamps since boot). Both need
CAP_SYSLOG when ``kernel.dmesg_restrict=1`` (Ubuntu's default): without it the reason is returned and
the NVML event watcher (``workloads.gpu.xid_events``) is the only XID source. The parsers are pure and
replayed in tests from captured text (tests/data/kernel/).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.([0-7]))?\):\s*"
                  r"(\d+)\s*,?\s*(.*)$")
_DMESG = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


@dataclass(frozen=True, slots=True)
class XidLine:
    marker: float
    """kmsg sequence number, or dmesg seconds since boot: later lines have larger markers."""
    bus_id: str
    """sysfs form, '0000:18:00.0' (the same form workloads.node.discovery.sysfs_bus_id gives)."""
    code: int
    text: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_kmsg(text: str) -> list[tuple[float, str]]:
    """'6,1234,5678901,-;message' records -> [(1234, 'message')]; continuation lines (' KEY=value') dropped."""
    out = []
    for line in text.splitlines():
        head, sep, message = line.partition(";")
        fields = head.split(",")
        if sep and len(fields) >= 3 and fields[1].isdigit():
            out.append((float(fields[1]), message))
    return out


def parse_dmesg(text: str) -> list[tuple[float, str]]:
    """'[  123.456789] message' lines -> [(123.456789, 'message')]; lines without a timestamp keep the last one."""
    out, last = [], 0.0
    for line in text.splitlines():
        m = _DMESG.match(line)
        if m:
            last = float(m.group(1))
            out.append((last, m.group(2)))
        elif line.strip():
            out.append((last, line.strip()))
    return out


def xid_lines(records: list[tuple[float, str]]) -> list[XidLine]:
    out = []
    for marker, message in records:
        m = _XID.search(message)
        if m:
            bus = m.group(1).lower()
            domain, rest = bus.split(":", 1)
            out.append(XidLine(marker, f"{int(domain, 16):04x}:{rest}.{m.group(2) or '0'}", int(m.group(3)),
                               m.group(4).strip()))
    return out


def _read_kmsg(path: Path) -> str:
    """Every record /dev/kmsg holds now (one record per read; EAGAIN at the end; EPIPE where records
    were overwritten while reading)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                raise
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def read(root: Path) -> tuple[list[tuple[float, str]], str, str | None]:
    """(records, source, why it could not be read or None)."""
    kmsg = root / "dev/kmsg"
    try:
        return parse_kmsg(_read_kmsg(kmsg)), str(kmsg), None
    except OSError as exc:
        kmsg_problem = f"{kmsg}: {exc.strerror or exc}"
    exe = shutil.which("dmesg")
    if str(root) != "/" or exe is None:
        return [], "", f"{kmsg_problem}; no dmesg to fall back on"
    try:
        proc = subprocess.run([exe], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], "", f"{kmsg_problem}; dmesg: {exc}"
    if proc.returncode != 0:
        return [], "", (f"{kmsg_problem}; dmesg: {proc.stderr.strip()[:200]} (kernel.dmesg_restrict=1 needs "
                        "CAP_SYSLOG: run as root, or sysctl kernel.dmesg_restrict=0)")
    return parse_dmesg(proc.stdout), "dmesg", None


def snapshot(root: Path) -> dict[str, Any]:
    """Where the log stands now, and the XIDs it already holds (history from before the run)."""
    records, source, problem = read(root)
    if problem:
        return {"readable": False, "reason": problem}
    return {"readable": True, "source": source, "marker": max((m for m, _ in records), default=-1.0),
            "xids": [x.as_dict() for x in xid_lines(records)]}


def xids_since(root: Path, start: dict[str, Any]) -> tuple[list[XidLine], str | None]:
    """XID lines logged after ``start`` (a ``snapshot``), or why that cannot be said."""
    if not start.get("readable"):
        return [], start.get("reason") or "the kernel log was not read before the run"
    records, source, problem = read(root)
    if problem:
        return [], problem
    if source != start["source"]:
        return [], f"the kernel log was read from {start['source']} before the run and from {source} after"
    return [x for x in xid_lines(records) if x.marker > start["marker"]], None
