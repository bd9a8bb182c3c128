"""What NCCL chose, read from NCCL's own INFO log: version, transport of every channel, algorithm.

NCCL reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE once, on its first log call, which
happens while the plugin creates the default communicator (pytest_configure): setting them later
has no effect by itself. NCCL exports ``ncclResetDebugInit`` (deprecated in the API, still
exported by every NCCL since 2.19, including the 2.27/2.28 that torch 2.9-2.11 ship): after it,
the next log call re-reads those variables. ``Capture`` uses it to route NCCL's INFO log into a
file of ours for the duration of a with-block (creating a communicator, a first collective), then
puts the user's settings back. Where the user already sends INFO to a file (NCCL_DEBUG=INFO with
NCCL_DEBUG_FILE), the capture only reads what that file gained, and never re-opens it (NCCL opens
it with "w": re-opening would truncate the user's log).

The parsing is pure and replayed in tests/ from captured log excerpts.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import shutil
import socket
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

DEBUG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
CAPTURE_SUBSYS = "INIT,ENV,NET,GRAPH,TUNING"
"""INIT and NET name each channel's transport, GRAPH the path type (NVL: NVLink), TUNING the
algorithm of each collective (rank 0 of a communicator only), ENV the NCCL_* settings NCCL took."""

_CHANNEL = re.compile(r"(?:Channel|Ring) (\d+)(?:/(\d+))? : (\d+)(?:\[[0-9a-fx]+\])? -> (\d+)(?:\[[0-9a-fx]+\])?"
                      r"(?: \[(send|receive)\])? via (.+?)\s*$")
_COMM = re.compile(r"comm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_TUNING = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)")
_ENV = re.compile(r"NCCL INFO (NCCL_\w+) set by environment to (.*?)\.?\s*$")
_GRAPH = re.compile(r"Pattern (\d+), crossNic (\d+), nChannels (\d+), (?:bw|speed) ([\d.]+)/([\d.]+), "
                    r"type (\w+)/(\w+)")
_VERSION = re.compile(r"NCCL version (\S+)")
_NETWORK = re.compile(r"NCCL INFO (?:Using network|Initialized NET plugin|Assigned NET plugin) (\S+(?: \S+)?)")
_NET_USING = re.compile(r"NCCL INFO NET/(IB|Socket) : Using (.+?)\s*$")
_IB_DEVICE = re.compile(r"\[(\d+)\]([^\s:\[\]]+):(\d+)(?::\d*)?(?::\d+)?/(\w+)")
"""One device of 'NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ...' (src/transport/net_ib/init.cc: index,
name, port, an optional rail and plane id, link layer)."""
_NET_DEV = re.compile(r"^NET/([^/]+)/(\d+)(?:\((\d+)\))?")
"""A send channel's 'via NET/<net>/<dev>[(<proxy rank>)]...' (src/transport/net.cc): the NIC index it sends
through, and the rank whose NIC that is where PXN routes it through another GPU of the node."""


def transport_class(via: str) -> str:
    """'P2P', 'SHM', 'NET/IB', 'NET/Socket', 'NET/<plugin>' ... from a channel line's 'via' text.

    NCCL's IB plugins (built-in 'IB', HPC-X 'IBext_v8') all count as NET/IB; 'NET/Socket' is TCP.
    """
    parts = via.split("/")
    head = parts[0].strip()
    if head == "NET" and len(parts) > 1:
        name = parts[1].strip()
        return "NET/IB" if name.startswith("IB") else f"NET/{name}"
    return head


@dataclass(slots=True)
class NcclLog:
    """What one process's NCCL log says (one capture, or several merged)."""

    version: str | None = None
    comms: list[dict[str, int]] = field(default_factory=list)
    channels: list[dict[str, Any]] = field(default_factory=list)
    algorithms: list[dict[str, Any]] = field(default_factory=list)
    graphs: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    networks: list[str] = field(default_factory=list)
    net_devices: dict[str, str] = field(default_factory=dict)
    ib_no_device: bool = False
    warnings: list[str] = field(default_factory=list)
    lines: int = 0

    def transports(self) -> dict[str, int]:
        """Channel connections per transport class."""
        return dict(Counter(c["transport"] for c in self.channels))

    def nodes(self) -> int:
        """Most nodes any communicator of this log spans, as NCCL counts them (distinct hosts)."""
        return max((c["nnodes"] for c in self.comms), default=0)

    def nic_sends(self) -> list[dict[str, Any]]:
        """This process's network send channels by NIC: net plugin, NIC index, PXN proxy rank (None: its own), how
        many channels. Every '[send]' line in a process's log is a connection that process set up."""
        counts: Counter[tuple[str, int, int | None]] = Counter()
        for c in self.channels:
            if c["direction"] == "send" and (m := _NET_DEV.match(c["via"])):
                counts[(m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else None)] += 1
        return [{"net": net, "dev": dev, "proxy": proxy, "channels": n}
                for (net, dev, proxy), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or -1))]

    def merge(self, other: NcclLog) -> None:
        self.version = self.version or other.version
        for name in ("comms", "channels", "algorithms", "graphs", "networks", "warnings"):
            getattr(self, name).extend(getattr(other, name))
        self.env.update(other.env)
        self.net_devices.update(other.net_devices)
        self.ib_no_device = self.ib_no_device or other.ib_no_device
        self.lines += other.lines

    def summary(self) -> dict[str, Any]:
        """Compact, JSON-serialisable: what the report shows (channel lines kept as one example each)."""
        examples: dict[str, str] = {}
        for c in self.channels:
            examples.setdefault(c["transport"], c["line"])
        return {
            "version": self.version, "transports": self.transports(), "transport_examples": examples,
            "nodes": self.nodes(), "comms": self.comms[:8],
            "algorithms": sorted({(a["func"], a["bytes"], a["algo"], a["proto"]) for a in self.algorithms}),
            "path_types": sorted({f"{g['intra']}/{g['inter']}" for g in self.graphs}),
            "env": self.env, "networks": sorted(set(self.networks)), "net_devices": self.net_devices,
            "ib_no_device": self.ib_no_device, "warnings": self.warnings[:5], "lines": self.lines,
            "nic_sends": self.nic_sends(), "ib_devices": ib_devices(self.net_devices.get("IB", "")),
        }


def ib_devices(using: str) -> dict[int, str]:
    """NIC index -> device name from the text after 'NET/IB : Using' ('[0]mlx5_0:1/IB [1]mlx5_3:1/IB [RO]; OOB ..')."""
    return {int(m.group(1)): m.group(2) for m in _IB_DEVICE.finditer(using.split(";")[0])}


def parse(text: str) -> NcclLog:
    """Parse NCCL INFO/WARN lines (any NCCL from 2.7 on; unknown lines are ignored)."""
    log = NcclLog()
    for line in text.splitlines():
        if "NCCL" not in line:
            continue
        log.lines += 1
        if " NCCL WARN " in line:
            log.warnings.append(line.split(" NCCL WARN ", 1)[1].strip())
        if m := _CHANNEL.search(line):
            via = m.group(6)
            log.channels.append({"channel": int(m.group(1)), "src": int(m.group(3)), "dst": int(m.group(4)),
                                 "direction": m.group(5) or "", "via": via, "transport": transport_class(via),
                                 "line": line[m.start():].strip()})
        elif m := _COMM.search(line):
            log.comms.append({"rank": int(m.group(2)), "nranks": int(m.group(3)), "nnodes": int(m.group(4)),
                              "local_ranks": int(m.group(5)), "local_rank": int(m.group(6))})
        elif m := _TUNING.search(line):
            log.algorithms.append({"func": m.group(1), "bytes": int(m.group(2)), "algo": m.group(3).upper(),
                                   "proto": m.group(4).upper()})
        elif m := _GRAPH.search(line):
            log.graphs.append({"pattern": int(m.group(1)), "channels": int(m.group(3)),
                               "bw_intra": float(m.group(4)), "bw_inter": float(m.group(5)),
                               "intra": m.group(6), "inter": m.group(7)})
        elif m := _ENV.search(line):
            log.env[m.group(1)] = m.group(2)
        elif m := _VERSION.search(line):
            log.version = m.group(1)
        elif m := _NET_USING.search(line):
            log.net_devices[m.group(1)] = m.group(2)
        elif m := _NETWORK.search(line):
            log.networks.append(m.group(1))
        elif "NET/IB : No device found" in line:
            log.ib_no_device = True
    return log


def transport_problems(scope: str, logs: Iterable[dict[str, Any]], required: str) -> list[str]:
    """Why the transports seen in one scope break ``required`` ('NET/IB', 'any'); [] when they do not.

    ``logs`` are ``NcclLog.summary()`` of every rank of the scope. Rules for a required network:
    no channel may use another network (NET/Socket is TCP: the classic silent fallback); and a
    communicator spanning several hosts must show at least one channel on the required network.
    P2P (NVLink/PCIe) and SHM inside a host are always allowed.
    """
    if required.lower() == "any":
        return []
    logs = list(logs)
    transports: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for s in logs:
        transports.update(s["transports"])
        for k, v in s["transport_examples"].items():
            examples.setdefault(k, v)
    if not transports:
        return [f"{scope}: NCCL logged no channel connection, so its transport is unknown "
                f"(required {required}); see 'nccl_log_mode' in the details"]
    problems = []
    for kind, count in sorted(transports.items()):
        if kind.startswith("NET/") and not kind.startswith(required):
            why = " (NCCL logged 'NET/IB : No device found.')" if any(s["ib_no_device"] for s in logs) else ""
            problems.append(
                f"{scope}: {count} channel connections via {kind}, the profile requires {required}{why}; "
                f"e.g. '{examples[kind]}'. "
                + ("NET/Socket is TCP: NCCL fell back to sockets. Check that the InfiniBand ports are "
                   "Active (ibstat), that NCCL_IB_DISABLE, NCCL_NET and NCCL_IB_HCA are unset or right, "
                   "and that the container sees /dev/infiniband." if kind == "NET/Socket" else ""))
    spans_hosts = max((s["nodes"] for s in logs), default=0) > 1
    if spans_hosts and not problems and not any(k.startswith(required) for k in transports):
        problems.append(f"{scope}: the communicator spans {max(s['nodes'] for s in logs)} hosts but no channel "
                        f"used {required} (seen: {dict(transports)})")
    return problems


# ---- capture --------------------------------------------------------------------------------------

def _loaded_nccl_paths() -> list[str]:
    """Paths of the libnccl copies mapped into this process (torch loads its own at import)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libnccl" in line and "/" in line.split()[-1]}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libnccl"))


_RESET: list[tuple[Callable[[], None] | None, str]] = []


def reset_function() -> tuple[Callable[[], None] | None, str]:
    """NCCL's ``ncclResetDebugInit`` for every libnccl in the process, or (None, why not); looked up once."""
    if not _RESET:
        _RESET.append(_find_reset())
    return _RESET[0]


def _find_reset() -> tuple[Callable[[], None] | None, str]:
    found = []
    for path in _loaded_nccl_paths():
        try:
            fn = ctypes.CDLL(path).ncclResetDebugInit
        except (OSError, AttributeError):
            continue
        fn.restype = None
        found.append(fn)
    if not found:
        try:  # NCCL linked statically into libtorch_cuda: its symbols may still be global
            fn = ctypes.CDLL(None).ncclResetDebugInit
            fn.restype = None
            found.append(fn)
        except AttributeError:
            return None, "no libnccl with ncclResetDebugInit in this process (NCCL not loaded, or static)"

    def reset() -> None:
        for f in found:
            f()

    return reset, f"{len(found)} libnccl"


def expand_debug_file(pattern: str, host: str, pid: int) -> str:
    """NCCL_DEBUG_FILE as NCCL expands it: %h the host name up to its first dot, %p the pid, %% a %."""
    short = host.split(".")[0].replace("%", "-").replace("/", "-")
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern):
            code = pattern[i + 1]
            out.append({"h": short, "p": str(pid), "%": "%"}.get(code, "%" + code))
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


_TMP: list[str] = []
_TMP_PREFIX = "clustergate-nccl-"


def _tmpdir() -> str:
    """This process's folder for NCCL's log, removed at a normal exit. A run that failed leaves through
    ``os._exit`` and skips that, so each new folder first removes those that processes gone since left."""
    if not _TMP:
        _remove_left_behind(tempfile.gettempdir())
        _TMP.append(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, _TMP[0], True)
    return _TMP[0]


def _remove_left_behind(root: str) -> None:
    """Removes this user's NCCL log folders under ``root`` whose process no longer runs (the pid in the name);
    never a link, another user's folder or a running process's."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(_TMP_PREFIX):].split("-", 1)[0]
        if not entry.name.startswith(_TMP_PREFIX) or not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid():
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue


class Capture:
    """NCCL's INFO log, as a string, for what NCCL does inside a with-block (see the module doc).

    ``env`` are extra variables set for the block only (e.g. NCCL_ALGO=Ring while a communicator is
    created: NCCL reads it when a communicator is initialised). ``mode`` after entry: 'ours' (our
    file), 'user' (the user's INFO file, read from where it was), or 'off' with ``reason``.
    """

    _count = 0

    def __init__(self, enabled: bool, env: dict[str, str] | None = None, subsys: str = CAPTURE_SUBSYS) -> None:
        self.enabled = enabled
        self.env = dict(env or {})
        self.subsys = subsys
        self.mode = "off"
        self.reason = "not a CUDA/NCCL run" if not enabled else ""
        self.path: str | None = None
        self.offset = 0
        self._saved: dict[str, str | None] = {}
        self._reset: Callable[[], None] | None = None
        self._text = ""

    def _user_file(self) -> str | None:
        if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE") or not os.environ.get("NCCL_DEBUG_FILE"):
            return None
        return expand_debug_file(os.environ["NCCL_DEBUG_FILE"], socket.gethostname(), os.getpid())

    def __enter__(self) -> Capture:
        touched = set(self.env) | (set(DEBUG_VARS) if self.enabled else set())
        self._saved = {k: os.environ.get(k) for k in touched}
        os.environ.update(self.env)
        if not self.enabled:
            return self
        user = self._user_file()
        if user is not None:
            self.mode, self.path = "user", user
            self.offset = os.path.getsize(user) if os.path.exists(user) else 0
            return self
        self._reset, why = reset_function()
        if self._reset is None:
            self.reason = why
            return self
        Capture._count += 1
        self.mode = "ours"
        self.path = os.path.join(_tmpdir(), f"nccl-{Capture._count}.log")
        os.environ.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": self.subsys, "NCCL_DEBUG_FILE": self.path})
        self._reset()
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self.mode == "ours" and self._reset is not None:
            self._reset()  # the next NCCL log call re-reads the user's settings and closes our file
        if self.path and os.path.exists(self.path):
            with open(self.path, errors="replace") as f:
                f.seek(self.offset)
                self._text = f.read()
            if self.mode == "ours":
                os.unlink(self.path)  # NCCL may still hold it open until its next log call: harmless

    def text(self) -> str:
        return self._text

    def log(self) -> NcclLog:
        return parse(self._text)

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "reason": self.reason, "file": self.path if self.mode == "user" else None}


def nccl_environment() -> dict[str, str]:
    """The NCCL-relevant environment of this process (recorded next to every interconnect figure)."""
    keep = ("NCCL_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS", "UCX_", "FI_")
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(keep)}
