"""``clustergate run``: the acceptance suite that came with clustergate, on this node, one pytest per rank.

torchrun runs in this process (its launcher), so what the command prints and how it ends are the run's: rank 0's
output as it goes (every other rank's goes to a file: a problem one rank has before the run starts reaches every
rank and rank 0 says it), no torchrun traceback, then one line with the verdict, last. Its exit status is the one table
(clustergate.common.exit_codes): 0 accept, 1 not accepted, 2 usage or unusable input, 4 could not run.

Nothing here imports torch until the ranks are started: ``--help`` and ``--print-command`` stay instant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clustergate.common import inputfile
from clustergate.common.exit_codes import TABLE, Exit
from clustergate.run.launch import command_note

PROG = "clustergate run"
RUN_INI = Path(__file__).resolve().parents[2] / "run.ini"  # clustergate/run.ini
"""pytest's configuration for ``run`` (the packaged suite has no pyproject.toml beside it)."""

RUN_PLUGINS = ("clustergate",)
"""The pytest plugins a ``run`` names: the suite's own, which loads pytest-html and pytest-metadata itself
(clustergate.run.plugins). Every other plugin installed beside them stays out: one that reruns failures, reorders
tests or times them out its own way would change what a verdict means (one named with ``-p NAME`` makes the run
partial: clustergate.trust.attestation), and each one loaded costs every rank start-up time (a hypothesis plugin alone
took 1.4 s of a quick run on an H100 node)."""

RUN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
"""The environment ``run`` adds for torchrun and its ranks: no installed plugin loads by its entry point."""

def acceptance_dir() -> Path:
    """The acceptance suite that came with this clustergate (the checkout's, or the wheel's)."""
    import acceptance

    return Path(acceptance.__file__).resolve().parent


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Run the acceptance suite that came with clustergate on this node, one pytest per rank under "
                    "torchrun. Every argument it does not know goes to pytest (e.g. --level quick, -k world, "
                    "--report-dir DIR, --profile cpu); `clustergate run -- --help` shows pytest's. Rank 0's output "
                    "is shown as it goes, the verdict last; exit status 0 accept, 1 not accepted, 2 usage or "
                    "unusable input, 4 could not run.",
        epilog="Several nodes: run torchrun yourself on each node (README, 'Running on one node and on many').")
    p.add_argument("--nproc-per-node", default=None, metavar="N",
                   help="ranks on this node (default: the number of CUDA GPUs, else 2 CPU ranks)")
    p.add_argument("--print-command", action="store_true", help="print the torchrun command instead of running it")
    return p


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(run's own arguments, pytest's): run's are --nproc-per-node, --print-command and -h/--help, before a --."""
    own: list[str] = []
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--":
            rest += list(it)
            break
        if arg in ("--print-command", "-h", "--help") or arg.startswith("--nproc-per-node="):
            own.append(arg)
        elif arg == "--nproc-per-node":
            own += [arg, next(it, "")]
        else:
            rest.append(arg)
    return own, rest


def local_gpu_count() -> int:
    """The CUDA GPUs this node gives its ranks (0 without any).

    NVML's count where CUDA_VISIBLE_DEVICES does not narrow the set: it needs no torch import and no CUDA
    context, seconds the first rank would otherwise wait for. A GPU that NVML lists and CUDA cannot use then
    gets its rank, whose health test names it, rather than the node quietly running the CPU suite.
    torch's count where CUDA_VISIBLE_DEVICES is set (as Slurm sets it) or NVML cannot say (no driver):
    ``device_count`` reads that variable by CUDA's rules and counts with NVML too, so this process starts no
    CUDA either; only where NVML fails does it ask the CUDA runtime. (``is_available`` would always ask it:
    cuInit here, and the driver's teardown when this process exits.)"""
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                return int(pynvml.nvmlDeviceGetCount())
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # no driver, no library, no pynvml: torch says (0 without CUDA)
            pass
    import torch

    return torch.cuda.device_count()


def torchrun_args(nproc: int, pytest_args: list[str], log_dir: Path | None = None) -> list[str]:
    """torchrun's arguments for this node: every rank but local rank 0 writes its output to files (under
    ``log_dir``; torchrun's own temporary directory where None), so the terminal shows one rank, once."""
    suite = acceptance_dir()
    quiet = ",".join(f"{r}:3" for r in range(1, nproc))
    plugins = [arg for name in RUN_PLUGINS for arg in ("-p", name)]
    return ["--standalone", f"--nproc-per-node={nproc}", *(["--redirects", quiet] if quiet else []),
            *(["--log-dir", str(log_dir)] if log_dir is not None else []),
            "-m", "pytest", "-c", str(RUN_INI), "--rootdir", str(suite.parent), *plugins, str(suite), *pytest_args]


def run_command(nproc: int, pytest_args: list[str]) -> list[str]:
    """The torchrun command ``clustergate run`` stands for (in ``RUN_ENV``), as a user would type it."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args(nproc, pytest_args)]


@dataclass
class Launched:
    """How torchrun's ranks ended."""

    codes: dict[int, int] = field(default_factory=dict)
    """Each failed rank's exit status (negative: the signal that ended it); empty when every rank exited 0."""
    first: int | None = None
    """The rank that failed first (torchrun's root cause)."""
    signal: str | None = None
    """The signal that stopped this command (and torchrun with it)."""
    could_not: str | None = None
    """Why torchrun could not start the ranks at all."""


def launch(args: list[str]) -> Launched:
    """torchrun with ``args``, in this process; how its ranks ended, never a traceback."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import parse_args, run

    # torchrun logs each failed rank as an error line of its own ("failed (exitcode: 2) local_rank: 0 ..."); the
    # command's last line says the same with the run's word, so that logger is quiet while the ranks run here.
    failures = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    level = failures.level
    failures.setLevel(logging.CRITICAL)
    try:
        run(parse_args(args))
    except ChildFailedError as exc:
        first, _ = exc.get_first_failure()
        return Launched(codes={rank: f.exitcode for rank, f in exc.failures.items()}, first=first)
    except SignalException as exc:
        return Launched(signal=exc.sigval.name)
    except RendezvousError as exc:
        return Launched(could_not=f"{type(exc).__name__}: {exc}")
    finally:
        failures.setLevel(level)
    return Launched()


def signalled_ranks(launched: Launched) -> list[str]:
    """The ranks a signal ended, as torchrun saw them: what a record written by the survivors cannot know (they
    see a peer gone, not why), and what torchrun's own error line said before it was kept quiet. SIGTERM is left
    out: torchrun sends it to every rank once one has ended (a consequence), and a rank that gets it from outside
    records that itself."""
    said = []
    for rank, code in sorted(launched.codes.items()):
        if code < 0 and -code != signal.SIGTERM:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            said.append(f"torchrun: rank {rank} was ended by {name} (exit status {code})")
    return said


def status_of(launched: Launched, told: dict[str, Any]) -> Exit:
    """The command's exit status: every rank's 0 is an accept; a status the run decided (its first rank to fail,
    or rank 0's word before any test) is the table's already; torchrun that could not start is 4; a rank killed
    or pytest stopped by a signal is not accepted. pytest's own refusal of its arguments (4, before the plugin
    runs) is a usage error."""
    if launched.could_not is not None:
        return Exit.COULD_NOT_RUN
    if launched.signal is not None:
        return Exit.NOT_ACCEPTED
    if not launched.codes:
        return Exit.ACCEPT
    if isinstance(told.get("status"), int) and told["status"] in tuple(Exit):
        return Exit(told["status"])
    code = launched.codes.get(launched.first, 1) if launched.first is not None else 1
    if code == Exit.COULD_NOT_RUN:  # rank 0 told no such thing: pytest refused the command line itself
        return Exit.USAGE
    return Exit(code) if code in (Exit.NOT_ACCEPTED, Exit.USAGE) else Exit.NOT_ACCEPTED


def results_of(told: dict[str, Any]) -> tuple[Path | None, dict[str, Any] | None]:
    """results.json where rank 0 said the outputs are, as written (None where there is none)."""
    if not told.get("report_dir"):
        return None, None
    path = Path(told["report_dir"]) / "results.json"
    try:
        data = json.loads(inputfile.read_text(path, "results"))
    except (OSError, ValueError):
        return path, None
    return path, data if isinstance(data, dict) else None


def verdict_line(status: Exit, path: Path | None, results: dict[str, Any] | None, launched: Launched,
                 told: dict[str, Any] | None = None) -> str | None:
    """The command's last line; None for a run that decides nothing and ends well (a listing, pytest's help)."""
    from clustergate.common.terminal import printable

    if results is not None:
        # rank 0 recorded no ending (killed mid-run): the launcher's account
        return verdict_of(results, status, path, otherwise=_how_it_ended(status, launched))
    if status == Exit.ACCEPT:
        return None
    how = _how_it_ended(status, launched)
    if told and told.get("rank") not in (None, 0) and told.get("error"):  # its words are in its log file alone
        how = f"rank {told['rank']}: {str(told['error']).splitlines()[0]}"
    return printable(f"{PROG}: {TABLE[status]}: no results.json was written; {how} (exit {int(status)})")


def verdict_of(results: dict[str, Any], status: int, path: Path | None, *, prog: str = PROG,
               otherwise: str = "") -> str:
    """A run's verdict in one line, ``PROG: WORD: why (exit N; results.json)``: why from its error or reason, else
    ``otherwise`` (an accept says none). ``clustergate run`` ends with it; under plain torchrun the summary of the
    failed ranks shows it (``clustergate.run.plugin``)."""
    from clustergate.common.terminal import printable
    from clustergate.record.verdict import word_of

    verdict = str(results.get("verdict"))
    why = [] if verdict == "accept" else str(results.get("error") or results.get("reason") or "").splitlines()
    if verdict != "accept" and not why and otherwise:
        why = [otherwise]
    said = f": {why[0]}" if why else ""
    return printable(f"{prog}: {word_of(results, status)}{said} (exit {int(status)}; {path})")


def _how_it_ended(status: Exit, launched: Launched) -> str:
    """What the launcher saw end the run, for a line that has no word from the run itself."""
    if launched.could_not:
        return f"torchrun could not start the ranks ({launched.could_not})"
    if launched.signal:
        return f"stopped by {launched.signal}"
    if status in (Exit.USAGE, Exit.COULD_NOT_RUN):
        return "see the error above"
    return f"rank {launched.first} ended with exit status {launched.codes.get(launched.first)}"


@contextlib.contextmanager
def environment(extra: dict[str, str]) -> Iterator[None]:
    """``extra`` in this process's environment while torchrun's agent runs here (its ranks inherit it), then as it
    was: a caller that goes on (a test, a script calling ``main``) keeps its own plugins and variables."""
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(argv: list[str], launcher: Callable[[list[str]], Launched] = launch) -> int:
    own, rest = split_args(argv)
    args = parser().parse_args(own)
    if args.nproc_per_node is None:
        nproc = local_gpu_count() or 2
    else:
        try:
            nproc = int(args.nproc_per_node)
        except ValueError:
            nproc = 0
        if nproc < 1:
            print(f"{PROG}: --nproc-per-node {args.nproc_per_node!r} must be a whole number >= 1", file=sys.stderr)
            return Exit.USAGE
    if args.print_command:
        print(" ".join(f"{k}={v}" for k, v in RUN_ENV.items()), " ".join(run_command(nproc, rest)))
        return Exit.ACCEPT
    tmp = Path(tempfile.mkdtemp(prefix="clustergate-run-"))
    told_path, log_dir = tmp / "outcome.json", tmp / "ranks"
    sys.stdout.flush()
    # torchrun sets OMP_NUM_THREADS=1 for several ranks where it is unset, in a four-line warning before every run;
    # the same value set here says nothing (a value the caller set is kept).
    threads = {"OMP_NUM_THREADS": "1"} if nproc > 1 and "OMP_NUM_THREADS" not in os.environ else {}
    with environment({**RUN_ENV, **threads, command_note.OUTCOME_ENV: str(told_path)}):
        launched = launcher(torchrun_args(nproc, rest, log_dir))
    told = command_note.read(told_path)
    status = status_of(launched, told)
    path, results = results_of(told)
    if results is None and launched.first not in (None, 0):  # no record, and another rank stopped first: keep theirs
        print(f"{PROG}: rank {launched.first} stopped first; every rank's own output is under {log_dir}",
              file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    for said in signalled_ranks(launched):
        print(f"{PROG}: {said}", file=sys.stderr)
    line = verdict_line(status, path, results, launched, told)
    sys.stderr.flush()
    if line is not None:
        # A rank that ended the run early left rank 0's last line of output unfinished (a test's name, its dots): the
        # verdict starts a line of its own.
        print(("\n" if launched.codes else "") + line, flush=True)
    return int(status)
