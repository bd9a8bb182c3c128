"""Processes on this rank's GPU that are not the job's own: a GPU shared with another job measures wrong.

A second process running matmuls on the same H100 left the MAMF figure at 731 TFLOPS (each call, timed
alone, mostly ran inside this process's time slice) while the GPU did half the work for the job. So before
anything is measured, NVML's lists of the processes running on each GPU (compute, graphics and MPS:
``nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses``, with the memory each holds) are compared
with the job's own processes: every rank's pid, gathered across the ranks of its host, and their children.
Anything else on the GPU is foreign, named with its pid, name (``/proc/PID/comm``, else NVML's
``nvmlSystemGetProcessName``) and memory.

In a container that does not share the host's PID namespace NVML reports the host's pids, which match no
rank's: then the processes are counted instead, against the ranks that hold a CUDA context on the GPU.

``read`` talks to NVML; ``judge`` is a pure function over what ranks read, so recorded listings replay
without a GPU. Run alone: torchrun --nproc-per-node=8 -m workloads.gpu.processes
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.clocks import device_handle, init_nvml
from workloads.gpu.health import OK, Check
from workloads.node.name import node_name
from workloads.result import Metric, Result

if TYPE_CHECKING:  # torch only for the job's own processes: ``read_with`` and ``judge`` run without it
    import torch

METRIC = "gpu_foreign_processes"
LISTS = (("compute", "nvmlDeviceGetComputeRunningProcesses"), ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
         ("mps", "nvmlDeviceGetMPSComputeRunningProcesses"))
_NOT_SUPPORTED_CODES = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
_MOST_ANCESTORS = 64
GiB = 1 << 30


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    root: str = "/"
    """Where /proc is read (a container that mounts the host's /proc under a directory: that directory)."""
    device: str = "cpu"


def own_process(device: torch.device) -> dict[str, Any]:
    """This rank as the job's own process: host, pid, and the GPUs (UUIDs) it holds a CUDA context on.

    The rank's own GPU gets its context here if it has none yet (a one-element tensor), so the rank is on
    NVML's list of that GPU. Other GPUs are listed only where a context already exists: a rank that touched
    another GPU by mistake is on that GPU's list too, and is still the job's own."""
    import torch

    contexts: list[str] = []
    if device.type == "cuda":
        torch.empty(1, device=device)
        torch.cuda.synchronize(device)
        has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        index = device.index if device.index is not None else torch.cuda.current_device()
        for i in range(torch.cuda.device_count()):
            if i == index or (has_context is not None and has_context(i)):
                uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
                if uuid is not None:
                    contexts.append(f"GPU-{uuid}")
    return {"host": node_name(), "pid": os.getpid(), "contexts": contexts}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def process_name(pid: int, nvml: Any, root: Path) -> str | None:
    """The process's command name: /proc/PID/comm, else NVML's name for it, else None."""
    try:
        return (root / "proc" / str(pid) / "comm").read_text().strip() or None
    except OSError:
        pass
    try:
        return Path(_text(nvml.nvmlSystemGetProcessName(pid))).name or None
    except Exception:  # NVMLError or a missing function: the pid and memory still name the process
        return None


def ancestors(pid: int, root: Path) -> list[int]:
    """Parent, grandparent, ... of ``pid`` from /proc/PID/status (empty where it cannot be read)."""
    out: list[int] = []
    while len(out) < _MOST_ANCESTORS:
        try:
            status = (root / "proc" / str(pid) / "status").read_text()
        except OSError:
            break
        ppid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
        if ppid <= 1 or ppid in out:
            break
        out.append(ppid)
        pid = ppid
    return out


def read_with(nvml: Any, handle: Any, root: Path) -> dict[str, Any]:
    """The processes NVML lists on the GPU of ``handle``: pid, kinds, memory, name and ancestry.

    ``unsupported`` says why NVML cannot list them (then nothing is judged); an NVML error goes to ``error``."""
    found: dict[int, dict[str, Any]] = {}
    unsupported: list[str] = []
    for kind, fn_name in LISTS:
        fn = getattr(nvml, fn_name, None)
        if fn is None:
            unsupported.append(f"{fn_name}: not in this pynvml")
            continue
        try:
            listed = fn(handle)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in _NOT_SUPPORTED_CODES:
                unsupported.append(f"{fn_name}: not supported ({exc})")
                continue
            return {"processes": [], "unsupported": None, "error": f"{fn_name}: {type(exc).__name__}: {exc}"}
        for p in listed:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)
            entry = found.setdefault(pid, {"pid": pid, "kinds": [], "used_bytes": None})
            entry["kinds"].append(kind)
            if isinstance(used, int) and used >= 0 and used < (1 << 60):  # NVML_VALUE_NOT_AVAILABLE is all ones
                entry["used_bytes"] = max(entry["used_bytes"] or 0, used)
    if all(any(u.startswith(f"{fn_name}:") for u in unsupported) for _, fn_name in LISTS[:2]):
        # Neither the compute nor the graphics list (MPS's alone says nothing of other jobs): cannot judge.
        return {"processes": [], "unsupported": "; ".join(unsupported), "error": None}
    for entry in found.values():
        entry["name"] = process_name(entry["pid"], nvml, root)
        entry["ancestors"] = ancestors(entry["pid"], root)
    return {"processes": sorted(found.values(), key=lambda e: e["pid"]), "unsupported": None, "error": None}


def read(device: torch.device, root: Path = Path("/")) -> dict[str, Any]:
    """This rank's GPU and the processes on it (see ``read_with``), with the host they were read on."""
    nvml = init_nvml()
    handle = device_handle(nvml, device)
    listing = read_with(nvml, handle, root)
    gpu: dict[str, Any] = {}
    for key, fn in (("uuid", "nvmlDeviceGetUUID"), ("serial", "nvmlDeviceGetSerial"), ("index", "nvmlDeviceGetIndex")):
        try:
            gpu[key] = _text(getattr(nvml, fn)(handle)) if key != "index" else int(getattr(nvml, fn)(handle))
        except nvml.NVMLError:
            gpu[key] = None
    return {"host": node_name(), "gpu": gpu, **listing}


def failed_read(exc: BaseException) -> dict[str, Any]:
    return {"host": node_name(), "gpu": {}, "processes": [], "unsupported": None,
            "error": f"{type(exc).__name__}: {exc}"}


def _shown(p: dict[str, Any]) -> str:
    memory = f"{p['used_bytes'] / GiB:.1f} GiB" if p.get("used_bytes") is not None else "memory not reported"
    return f"pid {p['pid']} ({p.get('name') or 'name unknown'}, {memory}, {'+'.join(p.get('kinds') or [])})"


def judge(listing: dict[str, Any], own: list[dict[str, Any]]) -> Check:
    """Whether anything but the job's own processes (``own``: every rank's ``own_process``) runs on this GPU.

    ``value`` carries the count of foreign processes (``foreign``) for the metric, and every process listed."""
    if listing.get("error"):
        return Check("fail", f"NVML could not list the processes on this GPU: {listing['error']} (a GPU that errors "
                             "here may have fallen off the bus: check dmesg for Xid errors)")
    if listing.get("unsupported"):
        return Check("unsupported", f"NVML cannot list the processes on this GPU: {listing['unsupported']}")
    host, uuid = listing.get("host"), (listing.get("gpu") or {}).get("uuid")
    here = [o for o in own if o.get("host") == host]
    own_pids = {o["pid"] for o in here}
    processes = listing.get("processes") or []
    listed = {p["pid"] for p in processes}
    ours = [p for p in processes if p["pid"] in own_pids or own_pids & set(p.get("ancestors") or [])]
    foreign = [p for p in processes if p not in ours]
    holders = [o for o in here if uuid and uuid in (o.get("contexts") or [])]
    value: dict[str, Any] = {"foreign": len(foreign), "processes": processes, "own_pids": sorted(own_pids)}
    if holders and not processes:
        return Check("unsupported", f"NVML lists no process on this GPU though {len(holders)} of the job's ranks hold "
                                    "a CUDA context on it: the list is filtered here (a container without the host's "
                                    "PID namespace?), so another job's process would be hidden too; run with the "
                                    "host's PID namespace (docker --pid=host, hostPID: true) to judge it")
    if foreign and holders and not ours and not own_pids & listed:
        # NVML's pids are of another PID namespace: none of the job's ranks that hold this GPU is listed.
        extra = len(processes) - len(holders)
        value.update(foreign=max(extra, 0), pid_namespace="differs")
        if extra <= 0:
            return Check(OK, f"{len(processes)} process(es) on the GPU, as many as the job's ranks holding it "
                             f"({len(holders)}); NVML's pids are of another PID namespace, so they are counted, not "
                             "matched", value)
        return Check("fail", f"{len(processes)} processes on this GPU but the job's ranks account for {len(holders)} "
                             f"(NVML's pids are of the host's PID namespace, not this container's): "
                             f"{'; '.join(_shown(p) for p in processes)}: another job shares the GPU, and every figure "
                             "measured on it is wrong; find it with nvidia-smi on the host, stop it or drain the node",
                     value)
    if foreign:
        return Check("fail", f"{len(foreign)} process(es) of another job on this GPU: "
                             f"{'; '.join(_shown(p) for p in foreign)}"
                             + (f"; the job's own ranks here are pids {sorted(own_pids)}" if own_pids else "")
                             + ". A shared GPU measures wrong (its time and memory are split): stop "
                             "the process (nvidia-smi shows it) or drain the node, then run again", value)
    return Check(OK, f"only the job's own processes on the GPU ({len(ours)})", value)


def run(cfg: Config) -> Result:
    """Judge this rank's GPU against every rank's process (a collective where a group exists)."""
    import torch
    import torch.distributed as dist

    from workloads.common import gather_objects

    device = torch.device(cfg.device)
    mine = own_process(device)
    own = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        own = gather_objects(mine)
    try:
        listing = read(device, Path(cfg.root))
    except Exception as exc:  # ImportError or NVMLError: judged as a failure to read, naming it
        listing = failed_read(exc)
    check = judge(listing, own)
    value = check.value if isinstance(check.value, dict) else {}
    metrics = () if "foreign" not in value else (
        Metric(METRIC, value["foreign"], "count", "gpu", "processes on the GPU that are not the job's own ranks"),)
    return Result(metrics=metrics, details={"listing": listing, "check": check.as_dict()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.environ.get("CLUSTERGATE_HOST_ROOT") or "/",
                        help="where /proc is read (default $CLUSTERGATE_HOST_ROOT, else /)")
    args = parser.parse_args()
    from workloads.common import distributed

    with distributed() as here:
        result = run(Config(root=args.root, device=str(here.device)))
        check = result.details["check"]
        print(f"rank {here.rank}: {check['status']}: {check['message']}")
        if here.rank == 0:
            print(json.dumps(result.details["listing"], indent=1, default=str))


if __name__ == "__main__":
    main()
