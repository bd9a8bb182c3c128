"""The clustergate command: one command for the suite and the cluster steps around it.

    clustergate run [--nproc-per-node N] [PYTEST ARGS ...]   the packaged acceptance suite on this node
    clustergate merge REPORTS/RUN_ID/nodes/* -o REPORTS/RUN_ID/
    clustergate signoff REPORTS/RUN_ID
    clustergate render R/results.json [--thresholds T --profile P] [-o out.html]
    clustergate calibrate run1/results.json ... --extends h200 -o site-thresholds.yaml

Each command but ``run`` is the module command of the same name (its own --help): ``merge``, ``signoff``
and ``calibrate`` are ``python -m clustergate.cluster``'s, ``render`` is ``python -m clustergate.report``'s.
Exit status: 0 accepted, 1 not accepted, 2 input that cannot be used (a bad option or file); never 3,
which is pytest's internal error. ``run`` exits with torchrun's status: 0 when every rank exited 0
(the verdict is accept), 1 when any rank did not (not accepted, or the run refused its input: results.json
and the output say which), 2 when ``clustergate run`` itself was given something it cannot use.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import clustergate

PROG = "clustergate"
RUN_INI = Path(__file__).resolve().parent / "run.ini"
"""pytest's configuration for ``run`` (the packaged suite has no pyproject.toml beside it)."""

SUMMARIES = {
    "run": "run the packaged acceptance suite on this node: torchrun --standalone --nproc-per-node=N "
           "-m pytest <acceptance> ARGS",
    "merge": "merge every node's run into one cluster verdict (python -m clustergate.cluster merge)",
    "signoff": "sign off the accepted hosts after the fabric phase (python -m clustergate.cluster signoff)",
    "render": "re-render or re-judge a run's report from its results.json (python -m clustergate.report)",
    "calibrate": "turn finished runs of healthy nodes into a site profile (python -m clustergate.cluster calibrate)",
    "health": "this node's state from NVML and sysfs in seconds, judged by the run's profile: no torch, no torchrun "
              "(python -m clustergate.health)",
}


def _cluster(name: str) -> Callable[[list[str]], int]:
    def command(argv: list[str]) -> int:
        from clustergate.cluster.__main__ import command as cluster_command

        return int(cluster_command(name)(argv))
    return command


def _render(argv: list[str]) -> int:
    from clustergate.report.__main__ import main as report_main

    return int(report_main(argv))


def _health(argv: list[str]) -> int:
    from clustergate.health.command import main as health_main

    return int(health_main(argv))


def acceptance_dir() -> Path:
    """The acceptance suite that came with this clustergate (the checkout's, or the wheel's)."""
    import acceptance

    return Path(acceptance.__file__).resolve().parent


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} run", allow_abbrev=False,
        description="Run the acceptance suite that came with clustergate on this node, one pytest per rank under "
                    "torchrun. Every argument it does not know goes to pytest (e.g. --level quick, -k world, "
                    "--report-dir DIR, --profile cpu); `clustergate run -- --help` shows pytest's.",
        epilog="Several nodes: run torchrun yourself on each node (README, 'Running on one node and on many').")
    p.add_argument("--nproc-per-node", default=None, metavar="N",
                   help="ranks on this node (default: the number of CUDA GPUs, else 2 CPU ranks)")
    p.add_argument("--print-command", action="store_true", help="print the torchrun command instead of running it")
    return p


RUN_PLUGINS = ("html", "metadata", "clustergate")
"""The pytest plugins a ``run`` loads (entry-point names): the suite's own and pytest-html's. Every other plugin
installed beside them stays out unless named with ``-p NAME``: one that reruns failures, reorders tests or
times them out its own way would change what a verdict means, and each one loaded costs every rank start-up
time (a hypothesis plugin alone took 1.4 s of a quick run on an H100 node)."""

RUN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
"""The environment ``run`` adds for torchrun and its ranks: only the plugins named (``RUN_PLUGINS``) load."""


def run_command(nproc: int, pytest_args: list[str]) -> list[str]:
    """The torchrun command ``clustergate run`` executes (in ``RUN_ENV``)."""
    suite = acceptance_dir()
    plugins = [arg for name in RUN_PLUGINS for arg in ("-p", name)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "pytest", "-c", str(RUN_INI), "--rootdir", str(suite.parent), *plugins, str(suite),
            *pytest_args]


def _split_run_args(argv: list[str]) -> tuple[list[str], list[str]]:
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


def _run(argv: list[str]) -> int:
    own, rest = _split_run_args(argv)
    args = _run_parser().parse_args(own)
    if args.nproc_per_node is None:
        nproc = local_gpu_count() or 2
    else:
        try:
            nproc = int(args.nproc_per_node)
        except ValueError:
            nproc = 0
        if nproc < 1:
            print(f"{PROG} run: --nproc-per-node {args.nproc_per_node!r} must be a whole number >= 1",
                  file=sys.stderr)
            return 2
    cmd = run_command(nproc, rest)
    if args.print_command:
        print(" ".join(f"{k}={v}" for k, v in RUN_ENV.items()), " ".join(cmd))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    # torchrun in this process's place: signals reach it directly and its exit status is ours.
    os.execve(sys.executable, cmd, {**os.environ, **RUN_ENV})
    return 2  # not reached


def local_gpu_count() -> int:
    """The CUDA GPUs this node gives its ranks (0 without any).

    NVML's count where CUDA_VISIBLE_DEVICES does not narrow the set: it needs no torch import and no CUDA
    context, seconds the first rank would otherwise wait for. A GPU that NVML lists and CUDA cannot use then
    gets its rank, whose health test names it, rather than the node quietly running the CPU suite.
    torch's count where CUDA_VISIBLE_DEVICES is set (its rules for that variable are CUDA's) or NVML cannot
    say (no driver)."""
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

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _run, "merge": _cluster("merge"), "signoff": _cluster("signoff"), "render": _render,
    "calibrate": _cluster("calibrate"), "health": _health,
}


def parser() -> argparse.ArgumentParser:
    """The top level, for --help and --version; each command parses its own arguments."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} {clustergate.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands (each has its own --help)")
    for name, text in SUMMARIES.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    p = parser()
    if not argv:
        p.print_usage(sys.stderr)
        print(f"{PROG}: error: name a command: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        p.parse_args(argv)  # --help, --version, or an unknown command (argparse says so and exits 2)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 2


if __name__ == "__main__":
    sys.exit(main())
