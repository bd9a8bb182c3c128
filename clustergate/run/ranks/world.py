"""The job as torchrun describes it: process groups, this rank's place, and the control group.

Two groups: the default group (NCCL where CUDA is present, gloo otherwise) belongs to the
workloads; a separate gloo group carries the plugin's own traffic (outcomes, metrics, verdicts)
with a longer timeout, so a workload's broken NCCL state never blocks the verdict.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from workloads.common import start_process_group

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class WorldError(RuntimeError):
    """The launch environment is inconsistent; the message says what to set."""


class StartupLost(WorldError):
    """Ranks that did not come to the start of the run in time: the process groups cannot form without them."""

    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(slots=True)
class World:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host: str
    device: torch.device
    backend: str
    control: dist.ProcessGroup | None
    """gloo group for the plugin's traffic; None at world size 1 (nothing to exchange)."""
    under_agent: bool = False
    """Started by torchrun's agent (``Launch.under_agent``)."""

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def launched(self) -> bool:
        """Several ranks: there are peers to exchange with."""
        return self.world_size > 1

    @property
    def supervised(self) -> bool:
        """Watched as a job is (``Launch.supervised``): the rendezvous store, liveness, a keeper, the launcher's
        death."""
        return self.launched or self.under_agent


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise WorldError(f"{name}={raw!r} is not an integer; torchrun sets it, do not set it by hand") from None


@dataclass(frozen=True, slots=True)
class Launch:
    """This rank's place as torchrun's environment says it (world size 1 without torchrun)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int

    @property
    def launched(self) -> bool:
        """Several ranks: there are peers to exchange with."""
        return self.world_size > 1

    @property
    def under_agent(self) -> bool:
        """Started by torchrun's agent (it serves the rendezvous store and is this rank's launcher)."""
        return bool(os.environ.get("TORCHELASTIC_RUN_ID"))

    @property
    def supervised(self) -> bool:
        """Under torchrun's agent (one rank included), or one of several ranks: the run is watched (liveness, a
        keeper, the launcher's death). A lone rank left unwatched was the one that could be stopped, orphaned or
        stuck for good, and then accept."""
        return self.launched or self.under_agent


def launch_from_env() -> Launch:
    """torchrun's variables; WorldError saying what to set where they are inconsistent."""
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size > 1:
        missing = [v for v in TORCHRUN_VARS if v not in os.environ]
        if missing:
            raise WorldError(f"WORLD_SIZE={world_size} but {', '.join(missing)} unset: launch with torchrun")
    return Launch(rank=_env_int("RANK", 0), world_size=world_size, local_rank=_env_int("LOCAL_RANK", 0),
                  local_world_size=_env_int("LOCAL_WORLD_SIZE", 1), node_rank=_env_int("GROUP_RANK", 0))


def rendezvous(launch: Launch, timeout_s: float) -> dist.Store | None:
    """The rendezvous store every rank reaches (torchrun's agent holds it), as init_process_group's env://
    would make it; None where no launcher serves one (pytest alone, world size 1)."""
    if not launch.supervised:
        return None
    store, _, _ = next(dist.rendezvous("env://", rank=launch.rank, world_size=launch.world_size,
                                       timeout=timedelta(seconds=timeout_s)))
    return store


class StartupRefused(WorldError):
    """A rank could not take part (its thresholds, its device, its node's name): every rank stops with its words."""


def meet_at_start(store: dist.Store, launch: Launch, host: str | None, wait_s: float,
                  problem: str | None = None) -> None:
    """Every rank says it has come to the start of the run, and what keeps it from taking part (``problem``), and
    waits up to ``wait_s`` for all the others, through the rendezvous store, before the process groups form.

    StartupLost names the ranks that did not come (a conftest, an import or a plugin's configure that hangs),
    where the groups' own creation would wait their whole timeout and end in a traceback naming no one.
    StartupRefused carries the first rank's problem to every rank, so all stop at once with the same words
    (rank 0 prints them), where the others would wait for that rank in vain."""
    def key(r: int) -> str:
        return f"clustergate/start/{r}"

    node = launch.rank // max(launch.local_world_size, 1)
    store.set(key(launch.rank), json.dumps({"host": host, "node": node, "problem": problem}))
    ranks = range(launch.world_size)
    try:
        store.wait([key(r) for r in ranks], timedelta(seconds=wait_s))
        missing = []
    except Exception:  # the store's own timeout error; which ranks are missing says more
        missing = [r for r in ranks if not store.check([key(r)])]
    said = {r: json.loads(store.get(key(r))) for r in ranks if r not in missing}
    hosts = {s["node"]: s["host"] for s in said.values() if s.get("host")}

    def who(r: int) -> str:
        host = said.get(r, {}).get("host") or hosts.get(r // max(launch.local_world_size, 1))
        return f"rank {r} ({host})" if host else f"rank {r}"

    refused = [(r, s["problem"]) for r, s in sorted(said.items()) if s.get("problem")]
    if refused:
        r, first = refused[0]
        alone = len(refused) < launch.world_size
        raise StartupRefused(first + (f" (on {who(r)}" + (f" and {len(refused) - 1} more" if len(refused) > 1 else "")
                                      + ")" if alone else ""))
    if missing:
        names = ", ".join(who(r) for r in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise StartupLost(f"{names} did not reach the start of the run within {wait_s:.0f} s of {who(launch.rank)}: "
                          "stuck before the process groups form (in a conftest, an import or a plugin's configure), "
                          "or started that much later than the others", missing)


def init_world(launch: Launch, store: dist.Store | None, device: torch.device, host: str,
               collective_timeout_s: float, control_timeout_s: float) -> World:
    """The process groups: the workloads' default group on ``device`` (over the rendezvous ``store``) and the
    plugin's gloo control group."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        timeout = timedelta(seconds=collective_timeout_s)
        # The run never destroys its groups: it leaves through Run.end (os._exit), or ends at a usage error
        # before any test ran. So no torch._dynamo import first (workloads.common.start_process_group says why
        # one would need it): that import was a quarter of the CPU time of a short run.
        kwargs: dict[str, Any] = {"destroyed_later": False}
        if backend == "nccl":
            kwargs["device_id"] = device
        if store is not None:
            store.set_timeout(timeout)
            # As init_process_group's own env:// rendezvous would: the agent's store, under the group's prefix.
            start_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=launch.rank,
                                world_size=launch.world_size, timeout=timeout, **kwargs)
        else:
            start_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **kwargs)
    control = None
    if launch.launched:
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=control_timeout_s))
    return World(rank=launch.rank, world_size=launch.world_size, local_rank=launch.local_rank,
                 local_world_size=launch.local_world_size, node_rank=launch.node_rank, host=host, device=device,
                 backend=backend, control=control, under_agent=launch.under_agent)
