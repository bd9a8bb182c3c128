"""The hangs of the fault table (docs/how-it-works.md), planted on this machine's GPUs and timed: for one or two calls
of a lent GPU machine (a plant takes 1-2 minutes with its start-up; each is bounded).

    python benchmarks/hang_plants.py [--out DIR] [--plants stop,spin,...] [--budget 540] [--dry-run]

Each plant is a test file run by torchrun on this machine's GPUs under the profile NVML chooses (the workloads'
collectives time out after its collective_timeout_s, 300 s; a test after the level's 600 s), as the whole suite
(tests/faults/planted_suite.py). With two ranks (a machine of 2 GPUs or more):

- ``stop``: rank 1 SIGSTOPped in a loop of NCCL all_reduce, rank 0 waiting in one;
- ``spin``: rank 1's GPU spins in a kernel (``torch.cuda._sleep``) ahead of the all_reduce rank 0's GPU started;
- ``skip``: rank 1 passes the test without the all_reduce rank 0 waits in;
- ``kill``: rank 1 killed with SIGKILL in a loop of all_reduce;
- ``hung``: every GPU spins in the same collective: both ranks broadcast 1 GiB, each as its root, so each sends and
  none receives (started on every GPU, completed on none: what an NVSwitch or fabric manager fault looks like).

With one rank (a node of one GPU, as the ``*-1gpu`` profiles): ``lone-spin``, its GPU spins in a kernel and the rank
waits for it (``torch.cuda.synchronize``); ``lone-stop``, the rank SIGSTOPped in a loop of work (its keeper continues
it after 30 s and it finds itself frozen).

For each: the seconds from the fault (the signal sent, or the planted code's file as it goes astray) to the end of
the job; torchrun's exit status; results.json's error, error_ranks and hang (kind, collective, the flight recorder
read: ``source``); every process of the job still there after it (the process table: agents, ranks, their
keepers) and every GPU process left (nvidia-smi). One line per plant on stdout; everything in one tar,
DIR/hang_plants.tgz (DIR: --out, else $OUT, else reports/hang-plants-TIME): hang_plants/hang_plants.json and each
plant's folder (the planted test, its report directory, torchrun's output). A plant that needs more GPUs than the
machine has is skipped, saying so. Exit 0 when every plant run ended within 60 s and left no process.

Every process a plant starts is ended, whatever happens: each torchrun runs under coreutils' ``timeout`` (which
outlives this script), every process of its job is continued and killed once it ends or fails (SIGCONT, then
SIGKILL), on SIGTERM, SIGINT and SIGHUP too; a rank's own keeper continues a rank left stopped.

With ``--dry-run`` (no GPU): CPU ranks under the cpu profile, with the GPU profile's timeouts given on the command
line; ``spin`` becomes a rank computing on in torch's C++, ``lone-spin`` a rank asleep in one call; ``hung`` is a
gloo broadcast of 64 MiB, whose bound at the cpu profile's bandwidth floor (1 MB/s) is minutes: not a dry run's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from clustergate.run.keeper import alive  # noqa: E402  (running, stopped or asleep; a zombie is not)

from torchrun_job import descendants  # noqa: E402  (the suite's own: every process below torchrun, sessions and all)

PLANTS = {"stop": (2, 1), "spin": (2, None), "skip": (2, None), "kill": (2, 1), "hung": (2, None),
          "lone-spin": (1, None), "lone-stop": (1, 0)}
"""Each plant's ranks (one a GPU), and the rank the harness signals (None: the planted code goes astray itself)."""
JOB_LIMIT_S = 150
"""A plant's hang guard: start-up (20-40 s on a GPU) and the 60 s the product promises, with room."""
BUDGET_S = 540
"""The whole script's (--budget): a plant that no longer fits with its start-up and 60 s is skipped, saying so."""
FITS_S = 100
"""What a plant needs to fit: its start-up and the 60 s it may take, with its teardown."""
WITHIN_S = 60.0
NEEDS = ("pytest_html", "pytest_metadata", "jsonschema_rs")
"""What the plugin needs beyond torch and pytest: installed from the wheels folder where the machine lacks them."""

PLANTED = '''import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

DEVICE = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def spin() -> None:
    """This rank's device busy with work that does not end (a hang guard of 300 s on a CPU)."""
    if DEVICE.type == "cuda":
        torch.cuda._sleep(2**40)  # about 550 s of one SM's cycles
        return
    a = torch.randn(192, 192)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        a = torch.tanh(a @ a)


def spin_and_wait() -> None:
    """This rank's device spins and the rank waits for it (on a CPU: one call that sleeps for 300 s)."""
    if DEVICE.type == "cuda":
        torch.cuda._sleep(2**40)
        torch.cuda.synchronize(DEVICE)
    else:
        time.sleep(300)


def test_first() -> None:
    t = torch.ones(4, device=DEVICE)
    dist.all_reduce(t)
    sync()


def test_planted() -> None:
    rank = int(os.environ["RANK"])
    Path(f"ready-{rank}").write_text(str(os.getpid()))
    t = torch.ones(1 << 20, device=DEVICE)
    PLANT = "{plant}"
    if PLANT in ("stop", "kill", "lone-stop"):
        deadline = time.monotonic() + 300  # a hang guard: the harness acts within seconds
        while time.monotonic() < deadline:
            dist.all_reduce(t)
            sync()
            time.sleep(0.05)
    elif PLANT == "lone-spin":
        spin_and_wait()
    elif PLANT == "hung":
        big = torch.ones((1 << 28) if DEVICE.type == "cuda" else (1 << 24), device=DEVICE)  # 1 GiB, 64 MiB
        dist.broadcast(big, src=rank)  # every rank its own root: each sends, none receives
        sync()
    elif PLANT == "spin":
        if rank == 1:
            spin()
        dist.all_reduce(t)
        sync()
    elif PLANT == "skip":
        if rank != 1:
            dist.all_reduce(t)
            sync()


def test_never_reached() -> None:
    pass
'''

SIGNALS = {"stop": signal.SIGSTOP, "kill": signal.SIGKILL, "lone-stop": signal.SIGSTOP}
"""The plants the harness acts on (the rank ``PLANTS`` names gets the signal); the others go astray by themselves."""


class Jobs:
    """Every process the plants started, so that none outlives the script."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.roots: list[subprocess.Popen[bytes]] = []

    def track(self) -> None:
        for root in self.roots:
            self.seen.update([root.pid, *descendants(root.pid)])

    def end_all(self) -> list[int]:
        """Continue and kill every process of every job still there; the ones that were."""
        self.track()
        left = sorted(pid for pid in self.seen if alive(pid))
        for signum in (signal.SIGCONT, signal.SIGKILL):
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signum)
        for root in self.roots:
            with contextlib.suppress(Exception):
                root.wait(timeout=5)
        return left


def gpu_processes() -> list[str]:
    """The compute processes nvidia-smi lists (pid, name); [] without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def wait_for(path: Path, deadline: float) -> float | None:
    while not path.exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)
    return time.monotonic()


def plant(name: str, folder: Path, env: dict[str, str], jobs: Jobs, dry_run: bool, nproc: int,
          limit_s: float = JOB_LIMIT_S) -> dict[str, Any]:
    """One plant, start to end (at most ``limit_s``): what it left."""
    folder.mkdir(parents=True)
    (folder / "test_fault.py").write_text(PLANTED.replace("{plant}", name))
    shutil.copy(ROOT / "tests" / "faults" / "planted_suite.py", folder / "planted_suite.py")
    limits = ["--profile", "cpu", "--collective-timeout", "300", "--test-timeout", "600"] if dry_run else []
    cmd = ["timeout", "--kill-after=10", str(int(limit_s)), sys.executable, "-m", "torch.distributed.run",
           "--standalone", f"--nproc-per-node={nproc}", "-m", "pytest", "-p", "clustergate", "-p", "no:cacheprovider",
           "--rootdir", str(folder), "--report-dir", str(folder / "report"), "--thresholds",
           str(ROOT / "thresholds.yaml"), "-p", "planted_suite", *limits, "test_fault.py"]
    started = time.monotonic()
    with open(folder / "torchrun.out", "wb") as out:
        job = subprocess.Popen(cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    jobs.roots.append(job)
    row: dict[str, Any] = {"plant": name}
    deadline = started + limit_s
    ready = [wait_for(folder / f"ready-{r}", deadline) for r in range(nproc)]
    if None in ready:
        row["problem"] = "the planted test was not reached (see torchrun.out)"
    else:
        time.sleep(0.5)  # the pids are written, and rank 0 is in its wait
        jobs.track()
        fault = max(ready)  # type: ignore[type-var]
        if name in SIGNALS:
            os.kill(int((folder / f"ready-{PLANTS[name][1]}").read_text()), SIGNALS[name])
            fault = time.monotonic()
        tree = {job.pid, *descendants(job.pid)}
        while job.poll() is None and time.monotonic() < deadline + 15:
            jobs.track()
            tree.update(descendants(job.pid))
            time.sleep(0.2)
        row["seconds"] = round(time.monotonic() - fault, 1)  # type: ignore[operator]
        time.sleep(1.0)  # a keeper goes with its rank (the parent-death signal)
        row["left"] = sorted(pid for pid in tree if alive(pid))
    row["exit"] = job.poll()
    row["killed_after"] = jobs.end_all()
    row["gpu_processes_left"] = gpu_processes()
    results = folder / "report" / "results.json"
    if results.exists():
        res = json.loads(results.read_text())
        hang = res.get("hang") or {}
        row.update(verdict=res.get("verdict"), error=res.get("error"), error_ranks=res.get("error_ranks"),
                   hang_kind=hang.get("kind"), collective=hang.get("collective"), source=hang.get("source"))
    row["within_60_s"] = row.get("seconds") is not None and row["seconds"] < WITHIN_S
    return row


def wheels_site(wheels: Path, work: Path) -> str | None:
    """A folder with the plugin's needs installed from ``wheels`` where this Python lacks them; None otherwise."""
    if all(importlib.util.find_spec(m) for m in NEEDS) or not wheels.is_dir():
        return None
    site = Path(tempfile.mkdtemp(prefix="site-", dir=work))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *map(str, sorted(wheels.glob("*.whl")))], check=False, timeout=120)
    return str(site)


def torch_records() -> dict[str, Any]:
    """Which of torch's flight-recorder dumps this torch has (the plugin reads them back)."""
    code = ("import json, torch, torch._C._distributed_c10d as c; print(json.dumps({'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'gpus': torch.cuda.device_count(), "
            "'dumps': sorted(n for n in dir(c) if n.startswith('_dump_'))}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"problem": out.stderr[-400:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--plants", default=",".join(PLANTS))
    parser.add_argument("--dry-run", action="store_true", help="2 CPU ranks, the cpu profile with the GPU timeouts")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for every plant together")
    args = parser.parse_args()
    names = [p for p in args.plants.split(",") if p]
    unknown = [p for p in names if p not in PLANTS]
    if unknown:
        parser.error(f"--plants: {', '.join(unknown)} not among {', '.join(PLANTS)}")
    out = args.out or Path(os.environ.get("OUT") or ROOT / "reports" / f"hang-plants-{time.strftime('%Y%m%dT%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hang-plants-")) / "hang_plants"  # tarred into OUT at the end
    work.mkdir()
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    site = wheels_site(args.wheels, work)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH"), site]))
    if args.dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""
    jobs = Jobs()

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(f"hang_plants: signal {signum}: every planted process is ended")

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    summary: dict[str, Any] = {"torch": torch_records(), "dry_run": args.dry_run, "plants": []}
    gpus = 2 if args.dry_run else int(summary["torch"].get("gpus") or 0)
    end = time.monotonic() + args.budget
    try:
        for name in names:
            left, nproc = end - time.monotonic(), PLANTS[name][0]
            why = f"{left:.0f} s of the --budget left" if left < FITS_S else \
                f"it needs {nproc} GPUs, this machine has {gpus}" if nproc > gpus else None
            if why:
                summary["plants"].append({"plant": name, "problem": f"skipped: {why}"})
                print(f"{name}: skipped, {why}", flush=True)
                continue
            row = plant(name, work / name, env, jobs, args.dry_run, nproc=nproc,
                        limit_s=min(JOB_LIMIT_S, left - 15))
            summary["plants"].append(row)
            print(f"{name}: {row.get('seconds', '-')} s from the fault to the job's end (exit {row.get('exit')}); "
                  f"error_ranks {row.get('error_ranks')}; hang {row.get('hang_kind')} via {row.get('source')}; "
                  f"left {row.get('left')}; GPU processes left {row.get('gpu_processes_left')}; error: "
                  f"{str(row.get('error') or row.get('problem') or '').splitlines()[0:1]}", flush=True)
            (work / "hang_plants.json").write_text(json.dumps(summary, indent=1))
    finally:
        summary["left_at_the_end"] = jobs.end_all()
        (work / "hang_plants.json").write_text(json.dumps(summary, indent=1))
        if site:
            shutil.rmtree(site, ignore_errors=True)
        with tarfile.open(out / "hang_plants.tgz", "w:gz") as tar:
            tar.add(work, arcname="hang_plants")
        shutil.rmtree(work.parent, ignore_errors=True)
        print(f"written: {out / 'hang_plants.tgz'}")
    ran = [r for r in summary["plants"] if not str(r.get("problem", "")).startswith("skipped")]
    return 0 if all(r.get("within_60_s") and not r.get("left") for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
