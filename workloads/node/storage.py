"""Storage tiers with fio: sequential throughput, small-block IOPS and a checksummed read-back, per node.

Sites accept a node's storage with fio (Debian's and every distribution's ``fio``): the local scratch and the
shared filesystem each read and written sequentially in 1 MiB blocks, 4 KiB random reads for IOPS, the written
data read back under a checksum (togethercomputer/skills PR #46). One rank per node (local rank 0) runs one fio
job file on one tier, in a fresh directory it removes afterwards whatever happened:

1. ``warmup``: every file written once in 1 MiB blocks, not counted (lays the files out, wakes the device);
2. ``write``: the same files written again, each block with a crc32c header (``verify=crc32c``): write GiB/s;
3. ``read``: the files read in 1 MiB blocks, every block's crc32c checked: read GiB/s; a block that reads back
   other than written fails naming the tier, the path and the host;
4. ``randread``: 4 KiB random reads for a fixed time after a ramp (``ramp_time``): IOPS.

Direct I/O (``O_DIRECT``) where the filesystem takes it, so the page cache is not measured; where it refuses it
(tmpfs before Linux 6.6, ramfs: EINVAL) fio runs buffered and the record says so. Every figure is the node's.

Run alone: torchrun --nproc-per-node=1 -m workloads.node.storage --tier local --directory /scratch
"""

from __future__ import annotations

import argparse
import errno
import json
import mmap
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workloads.common import agree, check_level, distributed, gather_objects, place, working_alone
from workloads.node.name import node_name
from workloads.node.shared_fs import filesystem_of
from workloads.result import Metric, Result, WorkloadError

GIB = float(1 << 30)
TIERS = ("local", "shared")
STEPS = ("warmup", "write", "read", "randread")
FILE_PREFIX = "cg-fio"
MISSING = "fio is not installed (Debian and Ubuntu: apt-get install fio; RHEL: dnf install fio)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    tier: str
    """``local`` (the node's scratch) or ``shared`` (the directory every node mounts)."""
    directory: str
    """Where the tier is: fio works in a fresh subdirectory of it."""
    file_bytes: int = 1 << 30
    """Bytes of each job's file (fio's ``size``)."""
    jobs: int = 4
    """Parallel fio jobs (``numjobs``), each on its own file."""
    iodepth: int = 16
    """Requests in flight per job (libaio)."""
    random_ms: int = 5000
    """How long the 4 KiB random reads are counted (``runtime``)."""
    ramp_ms: int = 1000
    """Random reads before counting starts (``ramp_time``)."""
    fio: str = "fio"
    """The fio program (found on PATH)."""

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"tier={self.tier!r}: must be one of {', '.join(TIERS)}")
        if self.file_bytes < (1 << 20) or self.file_bytes % (1 << 20):
            raise ValueError(f"file_bytes={self.file_bytes} must be a positive multiple of 1 MiB (the block)")
        if self.jobs < 1 or self.iodepth < 1 or self.random_ms < 1 or self.ramp_ms < 0:
            raise ValueError(f"jobs={self.jobs}, iodepth={self.iodepth}, random_ms={self.random_ms}, "
                             f"ramp_ms={self.ramp_ms}: each must be positive (ramp_ms may be 0)")

    @classmethod
    def for_level(cls, level: str, device: torch.device, tier: str, directory: str) -> Config:
        check_level(level)
        if device.type == "cpu":
            # CI and laptops: a real fio run on every step, small enough to cost well under a second (most of
            # it fio's own start-up, about 0.4 s); it proves the flow, not the disk.
            mib = {"quick": 4, "standard": 16, "extended": 64}[level]
            ms = {"quick": 50, "standard": 100, "extended": 1000}[level]
            return cls(tier=tier, directory=directory, file_bytes=mib << 20, jobs=1, iodepth=4,
                       random_ms=ms, ramp_ms=ms // 5)
        # A node: 4 jobs at iodepth 16 (as the lent H200 was measured), 4 GiB a tier at standard: past a drive's
        # DRAM cache, with O_DIRECT past the page cache, and seconds of I/O on a tier of 10 GiB/s (docs/checks.md).
        # 16 GiB a tier took 52-54 s on the lent H200's virtio disk; 4 GiB a few seconds a step. Quick runs none.
        mib = {"quick": 256, "standard": 1024, "extended": 4096}[level]
        seconds = {"quick": 1, "standard": 3, "extended": 15}[level]
        return cls(tier=tier, directory=directory, file_bytes=mib << 20, random_ms=seconds * 1000,
                   ramp_ms=1000)


def fio_program(program: str = "fio") -> str | None:
    """The path of fio, or None where it is not installed."""
    return shutil.which(program)


def local_scratch(setting: str | None) -> tuple[str, str]:
    """(directory, where it came from) of the node's local scratch: the profile's setting, else $TMPDIR, else /tmp."""
    if setting:
        return setting, "settings.local_scratch_dir"
    if os.environ.get("TMPDIR"):
        return os.environ["TMPDIR"], "$TMPDIR"
    return "/tmp", "the default /tmp"


def direct_io_problem(directory: str) -> str | None:
    """Why ``directory``'s filesystem refuses O_DIRECT (opened and one aligned block written); None where it takes
    it. Only EINVAL, the refusal itself, is an answer: any other error is the directory's and raised."""
    probe = Path(directory) / f".{FILE_PREFIX}-direct-probe-{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(probe, flags, 0o600)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return f"O_DIRECT refused on open ({exc.strerror})"
    try:
        block = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT needs
        try:
            os.write(fd, block)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return f"O_DIRECT write refused ({exc.strerror})"
        finally:
            block.close()
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return None


def fio_args(cfg: Config, workdir: str, direct: bool, steps: tuple[str, ...] = STEPS) -> list[str]:
    """fio's command line for ``steps`` of the job file in ``workdir`` (the module's docstring says each)."""
    args = [cfg.fio, "--output-format=json", "--eta=never", f"--directory={workdir}",
            # job N of every step works on file N: the read checks what the write wrote
            f"--filename_format={FILE_PREFIX}.$jobnum", f"--size={cfg.file_bytes}", f"--numjobs={cfg.jobs}",
            f"--direct={int(direct)}", "--ioengine=libaio", f"--iodepth={cfg.iodepth}", "--group_reporting",
            "--verify_state_save=0"]
    spec = {
        "warmup": ["--rw=write", "--bs=1M", "--end_fsync=1"],
        "write": ["--rw=write", "--bs=1M", "--end_fsync=1", "--verify=crc32c", "--do_verify=0"],
        "read": ["--rw=read", "--bs=1M", "--verify=crc32c"],
        "randread": ["--rw=randread", "--bs=4k", "--time_based", f"--runtime={cfg.random_ms}ms",
                     f"--ramp_time={cfg.ramp_ms}ms"],
    }
    for i, step in enumerate(steps):
        args += [f"--name={cfg.tier}-{step}", *([] if i == 0 else ["--stonewall"]), *spec[step]]
    return args


def parse(stdout: str) -> dict[str, Any]:
    """fio's JSON document from its standard output. fio prints its own error lines (``fio: pid=...``) before the
    document, so it starts at the first line that is ``{``."""
    lines = stdout.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "{"), None)
    if start is None:
        raise WorkloadError(f"fio wrote no JSON document (its output began {stdout[:200]!r})")
    try:
        doc = json.loads("".join(lines[start:]))
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"fio's JSON output does not parse ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise WorkloadError("fio's JSON output has no jobs list")
    return doc


def step_figures(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Step name -> {error, read_bytes_per_s, write_bytes_per_s, read_iops, write_iops} of each reporting group."""
    out = {}
    for job in doc["jobs"]:
        step = str(job.get("jobname", "")).rpartition("-")[2]
        out[step] = {"error": int(job.get("error") or 0),
                     "read_bytes_per_s": float(job["read"]["bw_bytes"]), "read_iops": float(job["read"]["iops"]),
                     "write_bytes_per_s": float(job["write"]["bw_bytes"]), "write_iops": float(job["write"]["iops"])}
    return out


VERIFY_LINE = re.compile(r"verify failed|bad (magic|header|crc)|verify: ", re.IGNORECASE)


def failure(steps: dict[str, dict[str, Any]], stderr: str, cfg: Config, workdir: str, host: str) -> str | None:
    """What went wrong, naming the tier, the path and the host; None when every step ended without an error."""
    for step, fig in steps.items():
        if not fig["error"]:
            continue
        said = [line.strip() for line in stderr.splitlines() if line.strip()]
        verify = [line for line in said if VERIFY_LINE.search(line)]
        where = f"the {cfg.tier} tier at {workdir} on host {host}"
        if step == "read" and (verify or fig["error"] == errno.EILSEQ):
            return (f"{where} read back other data than fio wrote (crc32c verify, fio error {fig['error']}): "
                    f"{(verify or said or ['no message'])[0]}: the storage does not return what was written")
        return (f"fio's {step} step failed on {where}: error {fig['error']} "
                f"({os.strerror(fig['error'])}): {(said or ['no message'])[-1]}")
    return None


def run_fio(cfg: Config, workdir: str, direct: bool, host: str, steps: tuple[str, ...] = STEPS,
            timeout_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Run ``steps`` in ``workdir`` and return their figures; WorkloadError naming tier, path and host on a failure."""
    limit = timeout_s if timeout_s is not None else _alone_s(cfg)
    try:
        proc = subprocess.run(fio_args(cfg, workdir, direct, steps), capture_output=True, text=True, timeout=limit)
    except FileNotFoundError:
        raise WorkloadError(f"{MISSING} (host {host})") from None
    except subprocess.TimeoutExpired:
        raise WorkloadError(f"fio on the {cfg.tier} tier at {workdir} on host {host} did not finish in "
                            f"{limit:.0f} s: the storage is stuck or far slower than 20 MB/s") from None
    try:
        figures = step_figures(parse(proc.stdout))
    except WorkloadError as exc:  # fio refused before it ran (an option, a file it cannot open): say where
        raise WorkloadError(f"fio on the {cfg.tier} tier at {workdir} on host {host} exited {proc.returncode}: {exc}; "
                            f"it said: {proc.stderr.strip()[-300:] or 'nothing'}") from None
    if (problem := failure(figures, proc.stderr, cfg, workdir, host)) is not None:
        raise WorkloadError(problem)
    if proc.returncode != 0:
        raise WorkloadError(f"fio exited {proc.returncode} on the {cfg.tier} tier at {workdir} on host {host}: "
                            f"{proc.stderr.strip()[-300:] or 'no message'}")
    return figures


SLOWEST_BYTES_PER_S = 20e6
"""As the shared-directory test: a tier slower than 20 MB/s is stuck, and its node leader is named."""


def _alone_s(cfg: Config) -> float:
    passes = 3 * cfg.file_bytes * cfg.jobs  # warm-up, write, read
    return passes / SLOWEST_BYTES_PER_S + (cfg.random_ms + cfg.ramp_ms) / 1000 + 30.0


def measure(cfg: Config, host: str) -> dict[str, Any]:
    """One tier of this node, measured by fio in a fresh directory that is removed afterwards (also on failure)."""
    if not os.path.isdir(cfg.directory) or not os.access(cfg.directory, os.W_OK | os.X_OK):
        raise WorkloadError(f"the {cfg.tier} tier's directory {cfg.directory} on host {host} does not exist or is "
                            "not writable: name a writable one")
    need = cfg.file_bytes * cfg.jobs
    free = shutil.disk_usage(cfg.directory).free
    if free < need + (need >> 3):
        raise WorkloadError(f"the {cfg.tier} tier at {cfg.directory} on host {host} has {free / GIB:.1f} GiB free; "
                            f"fio writes {need / GIB:.1f} GiB there: free space or name a larger directory")
    workdir = tempfile.mkdtemp(prefix=f".{FILE_PREFIX}-{host}-", dir=cfg.directory)
    try:
        refused = direct_io_problem(workdir)
        t0 = time.perf_counter()
        steps = run_fio(cfg, workdir, refused is None, host)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"host": host, "tier": cfg.tier, "path": cfg.directory, "mount": filesystem_of(cfg.directory),
            "io": "direct" if refused is None else f"buffered: {refused} (figures include the page cache)",
            "file_bytes": cfg.file_bytes, "jobs": cfg.jobs, "iodepth": cfg.iodepth, "fio_wall_s": round(wall, 3),
            "command": " ".join(fio_args(cfg, "DIR", refused is None)), "steps": steps}


def nvme_devices(root: Path = Path("/")) -> dict[str, Any]:
    """The node's local NVMe devices: namespaces in /sys/block (nvme0n1, ...; multipath paths and partitions are
    not block devices there), and the controllers in /sys/class/nvme."""
    names = sorted(p.name for p in (root / "sys/block").glob("nvme*") if re.fullmatch(r"nvme\d+n\d+", p.name))
    controllers = sorted(p.name for p in (root / "sys/class/nvme").glob("nvme*"))
    return {"namespaces": names, "controllers": controllers}


def run(cfg: Config) -> Result:
    """One tier on every node at once (local rank 0 of each), every rank recording its node's figures."""
    here = place()
    host = node_name()
    mine, problem = None, None
    if here.local_rank == 0:
        try:
            with working_alone(f"fio on the {cfg.tier} tier", _alone_s(cfg)):
                mine = {"node": here.node_rank, **measure(cfg, host)}
        except (WorkloadError, OSError) as exc:  # raised below on every rank, once all agree
            problem = str(exc)
    agree(problem, f"fio on the {cfg.tier} storage tier failed")
    per_node = {f["node"]: f for f in gather_objects(mine) if f is not None}
    node = per_node[here.node_rank]["steps"]
    what = f"fio, {cfg.jobs} job(s) x {cfg.file_bytes >> 20} MiB, iodepth {cfg.iodepth}"
    metrics = (
        Metric(f"storage_{cfg.tier}_write_gibps", node["write"]["write_bytes_per_s"] / GIB, "GiB/s", "node",
               f"{what}, 1 MiB sequential writes after a warm-up pass"),
        Metric(f"storage_{cfg.tier}_read_gibps", node["read"]["read_bytes_per_s"] / GIB, "GiB/s", "node",
               f"{what}, 1 MiB sequential reads, every block's crc32c checked"),
        Metric(f"storage_{cfg.tier}_randread_iops", node["randread"]["read_iops"], "IOPS", "node",
               f"{what}, 4 KiB random reads for {cfg.random_ms} ms after a {cfg.ramp_ms} ms ramp"),
    )
    return Result(metrics=metrics, details={"tier": cfg.tier, "per_node": [per_node[n] for n in sorted(per_node)]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="local", choices=TIERS)
    parser.add_argument("--directory", help="the tier's directory (default for local: $TMPDIR, else /tmp)")
    parser.add_argument("--level", default="standard", choices=("quick", "standard", "extended"))
    args = parser.parse_args()
    if args.tier == "shared" and not args.directory:
        parser.error("--tier shared needs --directory (a directory every node mounts)")
    directory = args.directory or local_scratch(None)[0]
    with distributed() as here:
        result = run(Config.for_level(args.level, here.device, args.tier, directory))
        if here.rank == 0:
            for node in result.details["per_node"]:
                s = node["steps"]
                print(f"node {node['node']} ({node['host']}) {node['tier']} {node['path']} ({node['io']}): "
                      f"write {s['write']['write_bytes_per_s'] / GIB:.2f} GiB/s, read "
                      f"{s['read']['read_bytes_per_s'] / GIB:.2f} GiB/s, 4 KiB random read "
                      f"{s['randread']['read_iops']:.0f} IOPS")


if __name__ == "__main__":
    main()
