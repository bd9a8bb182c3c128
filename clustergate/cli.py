"""The clustergate command: one command for the suite and the cluster steps around it.

    clustergate run [--nproc-per-node N] [PYTEST ARGS ...]   the packaged acceptance suite on this node
    clustergate merge REPORTS/RUN_ID/nodes/* -o REPORTS/RUN_ID/
    clustergate signoff REPORTS/RUN_ID
    clustergate render R/results.json [--thresholds T --profile P] [-o out.html]
    clustergate calibrate run1/results.json ... --extends h200 -o site-thresholds.yaml
    clustergate list [--profile P] [--level L] [--json]
    clustergate history [HOST|SERIAL] [--metric M] [--json] --store fleet.db
    clustergate record REPORT_DIR ... --store fleet.db

Each command has its own --help; ``python -m clustergate`` is the same command.

Exit status of every command (clustergate.common.exit_codes), ``run`` included:
0 accepted, 1 not accepted, 2 input that cannot be used (a bad option or file), 4 could not run;
never 3, which is pytest's internal error.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
from collections.abc import Callable
from typing import NoReturn

import clustergate
from clustergate.common.exit_codes import Exit

PROG = "clustergate"

SUMMARIES = {
    "run": "run the packaged acceptance suite on this node: torchrun --standalone --nproc-per-node=N "
           "-m pytest <acceptance> ARGS",
    "merge": "merge every node's run into one cluster verdict",
    "signoff": "sign off the accepted hosts after the fabric phase",
    "render": "re-render or re-judge a run's report from its results.json",
    "calibrate": "turn finished runs of healthy nodes into a site profile",
    "list": "the tests and criteria a profile judges at a level, as text or --json",
    "health": "this node's state from NVML and sysfs in seconds, judged by the run's profile: no torch, no "
              "torchrun",
    "history": "each stored figure's history from the results store: of a host, a GPU serial, or every part",
    "record": "record finished runs, merges and sign-offs into the results store",
}


def _cluster(name: str) -> Callable[[list[str]], int]:
    def command(argv: list[str]) -> int:
        from clustergate.cluster.__main__ import command as cluster_command

        return int(cluster_command(name)(argv))
    return command


def _render(argv: list[str]) -> int:
    from clustergate.render import main as render_main

    return int(render_main(argv))


def _health(argv: list[str]) -> int:
    from clustergate.health.command import main as health_main

    return int(health_main(argv))


def _list(argv: list[str]) -> int:
    from clustergate.listing import main as list_main

    return int(list_main(argv))


def _history(argv: list[str]) -> int:
    from clustergate.store.history_cli import main as history_main

    return int(history_main(argv))


def _record(argv: list[str]) -> int:
    from clustergate.store.record_cli import main as record_main

    return int(record_main(argv))


def torch_problem() -> str | None:
    """Why torch cannot be imported here, in one line; None where it can. ``run`` imports it anyway to start
    torchrun in this process, so asking first costs a run nothing."""
    try:
        import torch  # noqa: F401
    except Exception as exc:  # missing, or installed and broken (a CUDA library it cannot load): say which
        said = str(exc).strip().splitlines()
        return (f"torch cannot be imported in this Python ({sys.executable}: {type(exc).__name__}: "
                f"{said[0] if said else 'no message'}); install it there first (README, 'Set-up: two commands')")
    return None


def _run(argv: list[str]) -> int:
    from clustergate.run.launch.command import main as run_main
    from clustergate.run.launch.command import split_args

    own, _ = split_args(argv)
    if not {"-h", "--help", "--print-command"} & set(own) and (problem := torch_problem()):
        print(f"{PROG} run: {problem}", file=sys.stderr)
        return int(Exit.COULD_NOT_RUN)
    return run_main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _run, "merge": _cluster("merge"), "signoff": _cluster("signoff"), "render": _render,
    "calibrate": _cluster("calibrate"), "health": _health, "list": _list, "history": _history,
    "record": _record,
}


def parser() -> argparse.ArgumentParser:
    """The top level, for --help and --version; each command parses its own arguments."""
    from clustergate.record.outputs import Parser  # one line and a "did you mean" for a mistyped command

    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} {clustergate.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands (each has its own --help)")
    for name, text in SUMMARIES.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


ATTESTED = ("merge", "signoff", "render", "calibrate", "record")
"""The commands that decide, sign or keep a verdict outside a run: each checks the code it runs first (``run``'s
ranks check their own, into the record)."""


def own_code_refusal(name: str) -> str | None:
    """The line that refuses command ``name`` where the suite's modules loaded so far (the package's ``__init__``
    and the importer, which load before any check can, among them) are not their attested source; None where they
    are. Every module imported later is compiled from its attested bytes (``clustergate.trust.source_import``)."""
    from clustergate.trust.attestation import own_code_problem

    problem = own_code_problem()
    # Exit 4, could not run: neither the command line nor its inputs are at fault but the code it would run with.
    return None if problem is None else f"{PROG} {name}: refused, nothing read or written: {problem}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        if argv[0] in ATTESTED and (refusal := own_code_refusal(argv[0])):
            print(refusal, file=sys.stderr)
            return int(Exit.COULD_NOT_RUN)
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


def command() -> NoReturn:
    """The ``clustergate`` command: ``main``'s status is the process's exit status. Where torch was imported
    (``run``: torchrun runs in this process) the interpreter's own teardown is skipped: Python's exit handlers
    run and the output is flushed, then the process leaves, without tearing torch's modules down one by one
    (0.3-0.4 s of every ``clustergate run`` on a 2-core machine)."""
    status = main()
    if "torch" not in sys.modules:
        sys.exit(status)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    command()
