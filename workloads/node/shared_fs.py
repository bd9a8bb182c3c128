"""Is the shared directory really shared, and how fast is it? A token and a throughput test.

Rank 0 writes a random token into a fresh directory under ``Config.directory``; every rank on
every node reads it back. Then one rank per node (local rank 0) writes ``size_bytes`` of random
data with fsync (write GB/s) and reads the file another node wrote (read GB/s: no local page
cache to help; on a single node its own file after dropping it from the cache), checking every
byte. Rank 0 removes what was written. Every phase gathers every rank's outcome before anyone
raises, so a missing directory on one node fails the test on every rank, naming that node.

Run alone: torchrun --nproc-per-node=2 -m workloads.node.shared_fs --directory /shared/scratch
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workloads.common import (
    agree,
    broadcast_object,
    check_level,
    distributed,
    gather_objects,
    place,
    working_alone,
)
from workloads.node.name import node_name
from workloads.result import Metric, Result, WorkloadError

GB = 1e9


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    directory: str
    """A directory every node mounts: the shared filesystem under test."""
    size_bytes: int = 1 << 30
    """Bytes each node writes and reads back for the throughput figures."""
    block_bytes: int = 16 << 20
    """Size of one write/read call."""
    visibility_timeout_s: float = 10.0
    """How long a rank waits for rank 0's token to appear before calling the directory not shared."""

    def __post_init__(self) -> None:
        if self.size_bytes < self.block_bytes or self.size_bytes % self.block_bytes:
            raise ValueError(f"size_bytes={self.size_bytes} must be a positive multiple of "
                             f"block_bytes={self.block_bytes}")

    @classmethod
    def for_level(cls, level: str, device: torch.device, directory: str) -> Config:
        check_level(level)
        size = {"quick": 256 << 20, "standard": 1 << 30, "extended": 4 << 30}[level]
        if device.type == "cpu":
            size = 32 << 20  # CI and laptops: small, still a real write, fsync and read
        return cls(directory=directory, size_bytes=size, block_bytes=min(16 << 20, size))


def filesystem_of(path: str, mounts_text: str | None = None) -> dict[str, str] | None:
    """The mount (mountpoint, fstype, source) holding ``path``: the longest mountpoint prefix."""
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/mounts").read_text()
        except OSError:
            return None
    real = os.path.realpath(path)
    best: dict[str, str] | None = None
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) > len(best["mountpoint"])):
            best = {"mountpoint": mnt, "fstype": parts[2], "source": parts[0]}
    return best


def directory_problem(directory: str) -> str | None:
    """Why this rank cannot use ``directory``; None when it exists and is writable."""
    if not os.path.exists(directory):
        return f"{directory} does not exist"
    if not os.path.isdir(directory):
        return f"{directory} is not a directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable by uid {os.getuid()}"
    return None


SLOWEST_BYTES_PER_S = 20e6
"""The slowest shared directory whose node leader the others wait for without calling it stuck: 20 MB/s, a sixth of
a gigabit link (a cluster's shared storage moves GB/s). Slower, the leader is named past ``_alone_s``."""


def _alone_s(cfg: Config) -> float:
    """How long one leader may write (or read) alone while its node's other ranks wait for it."""
    return cfg.size_bytes / SLOWEST_BYTES_PER_S + 30.0


def _block(token: str, node: int, size: int) -> bytes:
    """The random block node ``node`` writes: any rank can regenerate it to check the read-back."""
    return random.Random(f"{token}/{node}").randbytes(size)


def _write(path: Path, cfg: Config, block: bytes) -> float:
    """Write ``size_bytes`` (each block made unique by its index) with fsync; seconds taken."""
    chunk = bytearray(block)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(cfg.size_bytes // cfg.block_bytes):
            chunk[:8] = i.to_bytes(8, "little")  # no two blocks alike: defeats dedup and compression
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def _read(path: Path, cfg: Config, block: bytes) -> float:
    """Read the file back, checking every block against what was written; seconds taken."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # drop this host's clean cached pages
        buf = bytearray(cfg.block_bytes)
        expected = bytearray(block)
        t0 = time.perf_counter()
        with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
            for i in range(cfg.size_bytes // cfg.block_bytes):
                got = f.readinto(buf)
                expected[:8] = i.to_bytes(8, "little")
                if got != cfg.block_bytes or buf != expected:
                    raise WorkloadError(f"{path}: block {i} reads back wrong ({got} bytes): the shared "
                                        "filesystem returned other data than was written")
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def _token_phase(cfg: Config, here: Any, host: str) -> tuple[Path, str, dict[str, Any]]:
    """Rank 0 writes a token; every rank reads it back. Returns the work directory and details."""
    workdir: Path | None = None
    token = secrets.token_hex(16)
    problem = None
    if here.rank == 0:
        workdir = Path(cfg.directory) / f".clustergate-{token[:12]}"
        try:
            workdir.mkdir()
            (workdir / "token").write_text(token)
            fd = os.open(workdir, os.O_RDONLY)  # fsync the directory so the new entry is durable
            os.fsync(fd)
            os.close(fd)
        except OSError as exc:
            problem = f"rank 0 cannot write the token under {cfg.directory}: {exc}"
    path, token, problem = broadcast_object((str(workdir) if workdir else None, token, problem))
    if problem:
        raise WorkloadError(f"{problem} (host {host})")
    workdir = Path(path)
    seen, waited, deadline = None, 0.0, time.monotonic() + cfg.visibility_timeout_s
    t0 = time.monotonic()
    while True:
        try:
            seen = (workdir / "token").read_text()
        except OSError:
            seen = None
        if seen is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    waited = time.monotonic() - t0
    problem = None
    if seen is None:
        problem = (f"rank 0's token file {workdir}/token is not visible here after {cfg.visibility_timeout_s:.0f} s: "
                   "the directory is not shared with rank 0's node (a local disk mounted at the same path?)")
    elif seen != token:
        problem = f"{workdir}/token reads {seen[:40]!r}, rank 0 wrote {token!r}: a stale or different filesystem"
    try:
        agree(problem, f"the shared directory {cfg.directory} is not shared")
    except WorkloadError:
        if here.rank == 0:  # every rank has looked (the agreement): clean up, then fail
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    return workdir, token, {"token_read_by_ranks": here.world_size, "token_visible_after_s": round(waited, 3)}


def run(cfg: Config) -> Result:
    """Check the directory on every rank, the token on every rank, then throughput per node."""
    here = place()
    host = node_name()
    agree(directory_problem(cfg.directory), f"the shared directory {cfg.directory} is unusable",
          "mount it on every node, or point the test at one that is")
    nodes = sorted(set(gather_objects(here.node_rank)))
    workdir, token, details = _token_phase(cfg, here, host)
    try:
        figures: dict[str, Any] | None = None
        problem = None
        leader = here.local_rank == 0
        if leader:
            try:
                with working_alone(f"writing {cfg.size_bytes >> 20} MiB to the shared directory", _alone_s(cfg)):
                    write_s = _write(workdir / f"node-{here.node_rank}.bin", cfg,
                                     _block(token, here.node_rank, cfg.block_bytes))
                figures = {"node": here.node_rank, "host": host, "write_gbps": cfg.size_bytes / write_s / GB,
                           "mount": filesystem_of(cfg.directory)}
            except Exception as exc:  # raised below on every rank, once all agree
                problem = f"writing {cfg.size_bytes} bytes under {workdir}: {exc}"
        agree(problem, "the shared-directory write failed")
        if leader and figures is not None:
            source = nodes[(nodes.index(here.node_rank) + 1) % len(nodes)]
            try:
                with working_alone(f"reading {cfg.size_bytes >> 20} MiB from the shared directory", _alone_s(cfg)):
                    read_s = _read(workdir / f"node-{source}.bin", cfg, _block(token, source, cfg.block_bytes))
                figures.update(read_gbps=cfg.size_bytes / read_s / GB, read_from_node=source)
            except Exception as exc:  # raised below on every rank, once all agree
                problem = f"reading node {source}'s file: {exc}"
        agree(problem, "the shared-directory read-back failed")
        results = gather_objects(figures)
    finally:
        dist.barrier()  # nobody may still be reading when rank 0 removes the files
        if here.rank == 0:
            shutil.rmtree(workdir, ignore_errors=True)
    per_node = {f["node"]: f for f in results if f is not None}
    mine = per_node[here.node_rank]
    metrics = (
        Metric("shared_fs_write_gbps", mine["write_gbps"], "GB/s", "node",
               f"{cfg.size_bytes >> 20} MiB from one rank per node, fsync included"),
        Metric("shared_fs_read_gbps", mine["read_gbps"], "GB/s", "node",
               f"{cfg.size_bytes >> 20} MiB written by another node (or cache dropped), every byte checked"),
    )
    return Result(metrics=metrics, details={
        **details, "directory": cfg.directory, "size_bytes": cfg.size_bytes,
        "per_node": [per_node[n] for n in sorted(per_node)],
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--directory", required=True, help="a directory every node mounts")
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    args = parser.parse_args()
    with distributed() as here:
        result = run(Config.for_level(args.level, here.device, args.directory))
        if here.rank == 0:
            for node in result.details["per_node"]:
                print(f"node {node['node']} ({node['host']}): write {node['write_gbps']:.2f} GB/s, "
                      f"read {node['read_gbps']:.2f} GB/s")


if __name__ == "__main__":
    main()
