"""Where the time of an 8-byte all_reduce goes: every communicator and call mode side by side, on GPUs.

Run on 2+ GPUs of one node (the lead's GPU session runs it; nccl-tests' all_reduce_perf -b 8 -e 8 in
the same session is the reference):

    torchrun --nproc-per-node=gpu benchmarks/latency_diag.py --out latency_diag.json
    torchrun --nproc-per-node=2 benchmarks/latency_diag.py --dry-run   # on CPU ranks over gloo: it still runs

Variants (each timed twice, in opposite orders, so an order or warm-up effect shows as a difference):
- communicators: the default group; a new_group of every rank; the suite's node and world scopes;
  groups created with NCCL_PROTO=LL, NCCL_PROTO=Simple and NCCL_ALGO=Ring;
- call modes: ``sync`` (dist.all_reduce call after call, host clock), ``events`` (the suite's old
  timing: CUDA events around rounds of sync calls), ``async`` (the suite's timing now: back-to-back
  async_op=True launches, one wait a round, host clock as nccl-tests), ``graph`` (20 calls captured in
  a CUDA graph and replayed: device time alone, as nccl-tests -G and the suite's judged figure);
- ``bare``: NCCL called directly through ctypes on torch's stream (no c10d at all): what one process
  per GPU gets from NCCL itself, the multi-process counterpart of nccl-tests' -g N (eager and in a graph).
For each: host us a call, device us a call (CUDA events), launch-only us a call (the host's cost of
issuing, nothing waited), median SM clock. Run it again with TORCH_NCCL_TRACE_BUFFER_SIZE=0 to see
the flight recorder's share.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.clocks import ClockSampler  # noqa: E402
from workloads.common import distributed, reduce_int, synchronize  # noqa: E402
from workloads.interconnect import collectives, comm_groups  # noqa: E402
from workloads.interconnect import latency as lat  # noqa: E402
from workloads.interconnect.nccl_log import Capture, _loaded_nccl_paths  # noqa: E402

CALLS, ROUNDS = 20, 10
NCCL_FLOAT32, NCCL_SUM = 7, 0  # ncclDataType_t / ncclRedOp_t values of nccl.h


def agree_max(n: int) -> int:
    """The warm-up's batch count agreed across ranks (the largest), as the suite's latency test agrees it:
    every rank launches the same number of collectives. A collective over every rank."""
    return reduce_int(n, "max")


def env_group(env: dict[str, str], device: torch.device) -> Any:
    """A group of every rank whose communicator is created (and warmed) with ``env`` set."""
    with Capture(enabled=False, env=env):
        group = dist.new_group(list(range(dist.get_world_size())))
        dist.all_reduce(torch.ones(1, device=device), group=group)
        synchronize(device)
    return group


def launch_us(issue: Callable[[], Any], device: torch.device, calls: int = CALLS) -> float:
    """Host microseconds to launch ``calls`` calls, nothing waited (the host's share of a call)."""
    synchronize(device)
    t0 = time.perf_counter()
    works = [issue() for _ in range(calls)]
    cost = (time.perf_counter() - t0) / calls * 1e6
    for work in works:
        lat.finish(work)
    synchronize(device)
    return cost


def events_rounds(fn: Callable[[], Any], device: torch.device) -> float:
    """The suite's old timing: CUDA events around rounds of synchronous calls; median us a call."""
    out = []
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(out)


def graph_us(tensor: torch.Tensor, group: Any, device: torch.device) -> float | str:
    """CALLS all_reduces in one CUDA graph, replayed: device microseconds a call (nccl-tests -G), timed by the
    suite's own ``latency.time_graph``."""
    try:
        span, why = lat.time_graph(lat.issue_all_reduce(tensor, group), device, CALLS, ROUNDS, group)
    except Exception as exc:  # noqa: BLE001 - a replay that fails is this cell's finding; the table stands
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return statistics.median(span) * 1e6 if span else why


def bare_nccl(device: torch.device) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """(issue, issue_here, close): an 8 B fp32 ncclAllReduce through a communicator of every rank made with
    ncclCommInitRank, the unique id sent over the default group; ``issue`` on the stream current now,
    ``issue_here`` on the one current at each call."""
    paths = _loaded_nccl_paths()
    if not paths:
        raise RuntimeError("no libnccl mapped into this process")
    lib = ctypes.CDLL(paths[0])

    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]

    uid = UniqueId()
    box: list[Any] = [None]
    if dist.get_rank() == 0:  # every rank learns rank 0's return code before anyone raises
        rc = lib.ncclGetUniqueId(ctypes.byref(uid))
        box = [(rc, ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)))]
    dist.broadcast_object_list(box, src=0)
    if box[0][0] != 0:
        raise RuntimeError(f"ncclGetUniqueId returned {box[0][0]}")
    ctypes.memmove(ctypes.addressof(uid), box[0][1], ctypes.sizeof(uid))
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    comm = ctypes.c_void_p()
    rc = lib.ncclCommInitRank(ctypes.byref(comm), dist.get_world_size(), uid, dist.get_rank())
    if rc != 0:
        raise RuntimeError(f"ncclCommInitRank returned {rc}")
    buf = torch.ones(2, device=device)
    ptr, stream = ctypes.c_void_p(buf.data_ptr()), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    count = ctypes.c_size_t(2)

    def issue() -> None:
        lib.ncclAllReduce(ptr, ptr, count, NCCL_FLOAT32, NCCL_SUM, comm, stream)

    def issue_here() -> None:  # on whatever stream is current (a CUDA graph captures on its own stream)
        lib.ncclAllReduce(ptr, ptr, count, NCCL_FLOAT32, NCCL_SUM, comm,
                          ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))

    return issue, issue_here, lambda: lib.ncclCommDestroy(comm)


def measure(name: str, group: Any, device: torch.device, tensor: torch.Tensor, calls: int = CALLS,
            rounds: int = ROUNDS) -> dict[str, Any]:
    """Every call mode on one communicator (on CPU, the dry run: the host-clock modes only)."""
    row: dict[str, Any] = {"comm": name}
    cuda = device.type == "cuda"
    warmup = 100 if cuda else 2
    warmup_s = lat.WARMUP_S if cuda else 0.0  # on CPU (the dry run) a few calls show the path works; no settling
    with ClockSampler(device) as clocks:
        sync = lat.time_rounds(lambda: dist.all_reduce(tensor, group=group), device, warmup, calls, rounds,
                               warmup_s=warmup_s, agree=agree_max)
        row["sync_host_us"] = lat.summary_us(sync)["host_us"]
        row["events_us"] = events_rounds(lambda: dist.all_reduce(tensor, group=group), device) if cuda else "no GPU"
        issue = lat.issue_all_reduce(tensor, group)
        row.update({f"async_{k}": v for k, v in lat.summary_us(
            lat.time_rounds(issue, device, warmup, calls, rounds, warmup_s=warmup_s, agree=agree_max)).items()})
        row["async_launch_us"] = launch_us(issue, device, calls)
        row["graph_us"] = graph_us(tensor, group, device) if cuda else "no GPU"
    row["sm_clock_mhz"] = clocks.summary().get("sm_clock_mhz", {}).get("median")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="latency_diag.json")
    parser.add_argument("--dry-run", action="store_true",
                        help="a few calls of every CPU-capable mode, also on CPU ranks over gloo (the suite's own "
                             "tests run it so the script cannot rot); its figures mean nothing")
    args = parser.parse_args()
    with distributed() as here:
        device = here.device
        if not args.dry_run and (device.type != "cuda" or here.world_size < 2):
            print("latency_diag: needs 2+ GPU ranks under torchrun (nothing to measure); --dry-run runs on CPU")
            return
        calls, rounds = (4, 2) if args.dry_run else (CALLS, ROUNDS)
        tensor = torch.ones(2, device=device)
        groups: dict[str, Any] = {"default": None}
        groups["new_group"] = env_group({}, device)
        groups["suite-node"] = comm_groups.scope_comm("node").group
        groups["suite-world"] = comm_groups.scope_comm("world").group
        if device.type == "cuda":
            groups["proto-LL"] = env_group({"NCCL_PROTO": "LL"}, device)
            groups["proto-Simple"] = env_group({"NCCL_PROTO": "Simple"}, device)
            groups["algo-Ring"] = env_group({"NCCL_ALGO": "Ring"}, device)
        rows: list[dict[str, Any]] = []
        for sweep, order in (("A", list(groups)), ("B", list(reversed(groups)))):
            for name in order:
                rows.append({"pass": sweep, **measure(name, groups[name], device, tensor, calls, rounds)})
        try:
            if device.type != "cuda":
                raise RuntimeError("no GPU: NCCL is not called on CPU ranks")
            issue, issue_here, close = bare_nccl(device)
            bare = lat.summary_us(lat.time_rounds(issue, device, 100, calls, rounds, agree=agree_max))
            span, why = lat.time_graph(issue_here, device, calls, rounds)
            rows.append({"pass": "A", "comm": "bare NCCL (ctypes)", **{f"async_{k}": v for k, v in bare.items()},
                         "async_launch_us": launch_us(issue, device, calls),
                         "graph_us": statistics.median(span) * 1e6 if span else why})
            torch.cuda.synchronize()
            close()
        except Exception as exc:  # noqa: BLE001 - the rest of the table stands
            rows.append({"pass": "A", "comm": "bare NCCL (ctypes)", "error": f"{type(exc).__name__}: {exc}"})
        suite = []
        for scope in ("node", "world", "node"):
            result = collectives.run(collectives.Config.for_latency("quick" if args.dry_run else "standard", device,
                                                                    scope=scope))
            curve = result.details["curves"].get(result.details["group"], [{}])[0]
            suite.append({"scope": scope, "time_us": curve.get("time_us"), "timing": curve.get("timing"),
                          "host_time_us": curve.get("host_time_us"), "algo": curve.get("algo")})
        gathered: list[Any] = [None] * here.world_size
        dist.all_gather_object(gathered, {"rows": rows, "suite": suite})
        if here.rank == 0:
            report(gathered, args.out, here.world_size)


def report(gathered: list[Any], out: str, world: int) -> None:
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL_", "CUDA_"))}
    with open(out, "w") as f:
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
        json.dump({"world_size": world, "env": env, "torch": torch.__version__, "nccl": nccl, "ranks": gathered},
                  f, indent=1)
    cols = ("sync_host_us", "events_us", "async_host_us", "async_device_us", "async_launch_us", "graph_us",
            "sm_clock_mhz")
    print(f"8 B all_reduce, {world} ranks, torch {torch.__version__}; slowest rank per cell (us a call)")
    print(f"{'pass':4} {'communicator':20} " + " ".join(f"{c:>16}" for c in cols))
    for i, row in enumerate(gathered[0]["rows"]):
        cells = []
        for c in cols:
            vals = [g["rows"][i].get(c) for g in gathered]
            nums = [v for v in vals if isinstance(v, (int, float))]
            cells.append(f"{max(nums):16.1f}" if nums else f"{str(vals[0] or row.get('error', ''))[:16]:>16}")
        print(f"{row['pass']:4} {row['comm']:20} " + " ".join(cells))
    for i, s in enumerate(gathered[0]["suite"]):
        print(f"suite run {i + 1} ({s['scope']}): judged {s['time_us'] or 0:.1f} us ({s['timing']}), host clock "
              f"{s['host_time_us'] or 0:.1f} us, algo {s['algo'] or '?'}")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
