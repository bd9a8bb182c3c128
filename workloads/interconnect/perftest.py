"""perftest's ``ib_write_bw`` and ``ib_write_lat``: one HCA port in loopback, server and client on this node, or
the server on one node and the client on another (``start_server``, ``run_client``: the fabric phase's rails).

This is how azurehpc-health-checks gates every HCA (customTests/azure_ib_write_bw_gdr.nhc, ``check_ib_bw_gdr``):
a server ``ib_write_bw -p PORT -s 8388608 -x 0 -F --report_gbits --perform_warm_up --use_cuda=GPU -d HCA`` in the
background and the same command with this host's name as the client, whose result line gives the bandwidth. Here
the client connects to 127.0.0.1, the GPU is named by its PCI bus id where perftest offers
``--use_cuda_bus_id`` (its CUDA index otherwise), dma-buf registration is asked for (``--use_cuda_dmabuf``) where
no peer-memory module is loaded, and ``-x`` is given only on a RoCE port (the GID index NCCL uses; on an
InfiniBand port perftest uses no GID).

Option names and output formats are perftest's own (linux-rdma/perftest, src/perftest_parameters.c and .h):
the results table is a header, ``RESULT_FMT_G`` (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]
MsgRate[Mpps]") or ``RESULT_FMT_LAT`` (" #bytes #iterations    t_min[usec] ... t_typical[usec] ..."), followed by
one line of figures per message size; it is read by the header's column names, never by position. CUDA options
appear in ``--help`` only when perftest was built with CUDA (``cuda_memory_supported()``): Debian's package is not.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.node.discovery import GPUDIRECT_MODULES

BW_TOOL = "ib_write_bw"
LAT_TOOL = "ib_write_lat"
BW_MESSAGE_BYTES = 8388608
"""azurehpc-health-checks' message size for its per-HCA bandwidth gate (8 MiB)."""
BW_COLUMN = "BW average[Gb/sec]"
LAT_COLUMN = "t_typical[usec]"
"""perftest's median latency (t_typical); the mean and percentiles are kept beside it."""
_COLUMN = re.compile(r"#\w+|[^\s\[\]][^\[\]]*?\[[^\]]*\]")


class PerftestError(RuntimeError):
    """perftest ran but gave no figure; the message carries what it said."""


@dataclass(frozen=True, slots=True)
class Tool:
    """One perftest program found on PATH, with what its build offers."""

    path: str
    version: str | None
    cuda: bool
    """``--use_cuda`` is in its --help: built with CUDA (GPUDirect RDMA from GPU memory)."""
    cuda_bus_id: bool
    cuda_dmabuf: bool

    @classmethod
    def find(cls, name: str, timeout_s: float = 10.0) -> Tool | None:
        path = shutil.which(name)
        if path is None:
            return None
        helptext = _output([path, "--help"], timeout_s)
        version = _output([path, "-V"], timeout_s).strip().removeprefix("Version:").strip() or None
        return cls(path=path, version=version, cuda="--use_cuda=" in helptext,
                   cuda_bus_id="--use_cuda_bus_id" in helptext, cuda_dmabuf="--use_cuda_dmabuf" in helptext)


def _output(args: list[str], timeout_s: float) -> str:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr


def parse_results(text: str) -> list[dict[str, float]]:
    """Every row of perftest's results table, as {column name: value}; [] when the text has no table."""
    rows: list[dict[str, float]] = []
    columns: list[str] | None = None
    for line in text.splitlines():
        if line.lstrip().startswith("#bytes"):
            columns = _COLUMN.findall(line)
            continue
        if columns is None:
            continue
        values = line.split()
        if len(values) != len(columns):
            if rows and not line.strip().startswith("-"):
                columns = None  # the table ended
            continue
        try:
            rows.append({c: float(v) for c, v in zip(columns, values, strict=True)})
        except ValueError:
            continue
    return rows


def said(text: str, lines: int = 3) -> str:
    """perftest's own last words, for a message ('Did not detect devices; If device exists, ...')."""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("-", "*"))]
    return "; ".join(kept[-lines:]) or "no output"


@dataclass(frozen=True, slots=True)
class Loopback:
    """One loopback run's command line, what it printed and its figures."""

    command: list[str]
    returncode: int | None
    output: str
    rows: list[dict[str, float]] = field(default_factory=list)

    def figure(self, column: str) -> float:
        for row in reversed(self.rows):
            if column in row:
                return row[column]
        raise PerftestError(f"{Path(self.command[0]).name} gave no {column!r} (exit {self.returncode}): "
                            f"{said(self.output)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool | None:
    """Whether a TCP socket listens on ``port`` (/proc/net/tcp, tcp6); None where those cannot be read."""
    seen = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        seen = True
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False if seen else None


@dataclass(slots=True)
class Server:
    """A perftest server started on this node: its command line, its process and its TCP port (``-p``)."""

    command: list[str]
    port: int
    proc: subprocess.Popen[str] | None
    gave_up: Loopback | None = None
    """Set when the server ended before it listened (no device, a bad option): its words say why."""


def start_server(tool: Tool, args: list[str], timeout_s: float = 15.0) -> Server:
    """Start ``tool`` as the server with ``args`` on a free TCP port; return once it listens.

    It listens when its port is in /proc/net/tcp (a second's wait where that cannot be read, as the nhc check
    sleeps), or after ``timeout_s`` at most; a server that ended first comes back with its own words.
    """
    port = free_port()
    base = [tool.path, *args, "-p", str(port)]
    proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        state = _listening(port)
        if state is None:
            time.sleep(1.0)
            break
        if state:
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        out = proc.stdout.read() if proc.stdout else ""
        if proc.stdout:
            proc.stdout.close()
        return Server(base, port, None, Loopback(base, proc.returncode, out, parse_results(out)))
    return Server(base, port, proc)


def stop_server(server: Server, timeout_s: float = 10.0) -> str:
    """Wait up to ``timeout_s`` for the server to end on its own (its client is done), else end it; its output."""
    if server.proc is None:
        return server.gave_up.output if server.gave_up else ""
    try:
        out, _ = server.proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        out, _ = server.proc.communicate(timeout=10)
        out = (out or "") + f"\n(server still running {timeout_s:g} s after its client: stopped)"
    return out or ""


def run_client(tool: Tool, args: list[str], port: int, address: str, timeout_s: float = 60.0) -> Loopback:
    """``tool`` as the client of the server at ``address``:``port`` with ``args``; its output and figures."""
    command = [tool.path, *args, "-p", str(port), address]
    try:
        client = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Loopback(command, None, out + f"\n(client still running after {timeout_s:g} s: stopped)")
    except OSError as exc:
        return Loopback(command, None, f"could not start {tool.path}: {exc}")
    return Loopback(command, client.returncode, client.stdout + client.stderr, parse_results(client.stdout))


def loopback(tool: Tool, args: list[str], timeout_s: float = 60.0) -> Loopback:
    """Run ``tool`` as server and as client to 127.0.0.1 with the same ``args``; the client's output is kept.

    The client starts once the server listens (``start_server``). The server is ended if it is still there
    when the client is done.
    """
    server = start_server(tool, args, min(timeout_s, 15.0))
    if server.gave_up is not None:
        return server.gave_up
    try:
        return run_client(tool, args, server.port, "127.0.0.1", timeout_s)
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
        stop_server(server)


def bw_args(device: str, port: int | str, *, gid_index: int | None, cuda: str | None, dmabuf: bool,
            tool: Tool) -> list[str]:
    """ib_write_bw's options for one HCA port: the nhc check's, from GPU memory when ``cuda`` names a GPU (its
    PCI bus id; a CUDA index where this perftest has no --use_cuda_bus_id)."""
    args = ["-d", device, "-i", str(port), "-s", str(BW_MESSAGE_BYTES), "-F", "--report_gbits", "--perform_warm_up"]
    if gid_index is not None:
        args += ["-x", str(gid_index)]
    if cuda is not None:
        args.append(f"--use_cuda_bus_id={cuda}" if tool.cuda_bus_id and ":" in cuda else f"--use_cuda={cuda}")
        if dmabuf:
            args.append("--use_cuda_dmabuf")
    return args


def lat_args(device: str, port: int | str, *, gid_index: int | None) -> list[str]:
    """ib_write_lat's options for one HCA port, from host memory: perftest refuses a write latency test from
    device memory without --write_with_imm (perftest_parameters.c), so the latency is the HCA's and the link's."""
    args = ["-d", device, "-i", str(port), "-F"]
    if gid_index is not None:
        args += ["-x", str(gid_index)]
    return args


REGISTRATION_FAILURES = ("Couldn't allocate MR", "Failed to create MR", "OFED stack does not support DMA-BUF",
                         "Unsupported memory type", "DMA-BUF is not supported on this GPU", "Couldn't init GPU context",
                         "No such device ID", "cuDeviceGetByPCIBusId failed")
"""Words perftest prints when it cannot register or reach GPU memory (perftest_resources.c, cuda_memory.c)."""


def gpudirect_problem(tool: Tool, gdr: dict[str, Any]) -> str | None:
    """Why ``tool`` cannot read GPU memory on a node whose GPUDirect modules are ``gdr``
    (``workloads.node.discovery.read_gpudirect``); None when it can try (a peer-memory module, or dma-buf)."""
    if not tool.cuda:
        return (f"{tool.path} (perftest {tool.version}) was built without CUDA: its --help lists no --use_cuda "
                "(build perftest with ./configure CUDA_H_PATH=/usr/local/cuda/include/cuda.h)")
    if not gdr["loaded"] and not tool.cuda_dmabuf:
        return (f"no peer-memory module loaded ({' or '.join(GPUDIRECT_MODULES)} in {gdr['source']}) "
                f"and {tool.path} offers no --use_cuda_dmabuf")
    return None


def gpu_memory_refused(run: Loopback) -> bool:
    """Whether a run from GPU memory failed on the GPU memory itself (not on the HCA or the link)."""
    return not run.rows and any(w in run.output for w in REGISTRATION_FAILURES)
