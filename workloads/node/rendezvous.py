"""Can every rank resolve every node's name and reach the rendezvous store (torchrun's TCPStore)?

Each rank resolves every host name in the job (the fully qualified name counts where the short one
does not: Kubernetes pods under a headless Service) and the rendezvous host, then connects to the
store as a client, writes its key and waits for every rank's: a store that only some nodes reach
ends a later restart or a second job, not this one, so it is checked here. Every rank's problems
are gathered, so every rank returns the same list.

Run alone: torchrun --nproc-per-node=2 -m workloads.node.rendezvous
"""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workloads.common import check_level, distributed, gather_objects, place
from workloads.node.name import node_name
from workloads.result import Result


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    store_timeout_s: float = 30.0
    """How long a rank waits to connect to the store and for every rank's key."""

    @classmethod
    def for_level(cls, level: str, device: torch.device) -> Config:
        check_level(level)
        return cls()


def resolve_problem(name: str) -> str | None:
    """Why ``name`` does not resolve; None when it does."""
    try:
        socket.getaddrinfo(name, None)
        return None
    except OSError as exc:
        return str(exc)


def name_problems(names: list[tuple[str, str]]) -> list[str]:
    """Every (host name, fully qualified name) that resolves neither way here."""
    problems = []
    for host, fqdn in sorted(set(names)):
        why = resolve_problem(host)
        if why and fqdn != host and resolve_problem(fqdn) is None:
            why = None
        if why:
            problems.append(f"cannot resolve {host!r} (nor {fqdn!r}): {why}")
    return problems


def store_problem(addr: str, port: int, rank: int, world_size: int, timeout_s: float) -> str | None:
    """This rank, as a client of the rendezvous store: set its key, wait for every rank's."""
    prefix = f"clustergate/rdzv-check/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/" \
             f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    try:
        store = dist.PrefixStore(prefix, dist.TCPStore(addr, port, is_master=False,
                                                       timeout=timedelta(seconds=timeout_s)))
        store.set(str(rank), node_name())
        store.wait([str(r) for r in range(world_size)], timedelta(seconds=timeout_s))
    except Exception as exc:  # gathered and judged on every rank
        return f"rendezvous store {addr}:{port}: {type(exc).__name__}: {exc}"
    return None


def run(cfg: Config) -> Result:
    """``details["problems"]`` names every rank's problems (the same list on every rank; empty: fine)."""
    here = place()
    names = [(host, fqdn) for host, fqdn in gather_objects((socket.gethostname(), socket.getfqdn()))]
    mine = name_problems(names)
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if here.world_size > 1 and addr and port:
        if why := resolve_problem(addr):
            mine.append(f"cannot resolve the rendezvous host MASTER_ADDR={addr!r}: {why}")
        if problem := store_problem(addr, int(port), here.rank, here.world_size, cfg.store_timeout_s):
            mine.append(problem)
    everyone = gather_objects((node_name(), here.node_rank, mine))
    problems = [f"rank {r} (node {node} ({host})): {p}" for r, (host, node, said) in enumerate(everyone) for p in said]
    return Result(metrics=(), details={"hosts": sorted(set(names)), "rendezvous": f"{addr}:{port}",
                                       "problems": problems})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    args = parser.parse_args()
    with distributed() as here:
        result = run(Config.for_level(args.level, here.device))
        if here.rank == 0:
            print("\n".join(result.details["problems"]) or f"every rank resolves {len(result.details['hosts'])} "
                  f"host names and reaches {result.details['rendezvous']}")


if __name__ == "__main__":
    main()
