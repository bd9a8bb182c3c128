"""The pytest plugin: pytest on every torchrun rank, one verdict for all of them.

Only where asked for (clustergate.optin): the checkout's root conftest.py or acceptance/conftest.py,
``-p clustergate``, ``--clustergate`` or the ini key ``clustergate = true``. Each hook forwards to the run
(``clustergate.run.lifecycle.Run``); its order among the other plugins' is declared where it is defined.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from clustergate.common.exit_codes import Exit
from clustergate.common.terminal import printable_lines
from clustergate.report import hooks as report_hooks
from clustergate.run import detectors, plugins, startclock
from clustergate.run import items as pytest_items
from clustergate.run.drawn import Drawn
from clustergate.run.interrupts import stop_processes, stopped_siblings
from clustergate.run.launch import command_line, errorfile, refusal
from clustergate.run.launch.command import verdict_of
from clustergate.run.lifecycle import Run
from clustergate.run.limits import AGENT_STOP_S, STOP_GRACE_S
from clustergate.run.options import Options, add_options
from clustergate.run.outside import end_what_the_tests_left, exit_now
from clustergate.run.recorder import Recorder
from clustergate.run.startup import (
    GPU_NODE_PROBLEM,
    LOCK,
    CouldNotRun,
    claim_report_dir,
    open_run,
    restore_stdout,
    route_outputs,
    show_tests_from_rootdir,
    stale_note,
)
from clustergate.secrets.redact import Scrubber
from clustergate.trust.completeness import suite_prefix
from clustergate.trust.manifest import time_limit
from workloads.node.name import NodeNameError, node_name

startclock.mark("imports")  # the plugin and all it needs (torch above all) are imported by now

RUN = pytest.StashKey[Run]()
RECORDER = pytest.StashKey[Recorder]()
STATUS = pytest.StashKey[int]()
"""The exit status every rank agreed at the end of the session."""
DESELECTED = pytest.StashKey[list[int]]()
"""Tests deselected by -k/-m: [all, multinode]."""


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    run = config.stash.get(RUN, None)
    if run is None:
        return None
    return [f"clustergate: profile {run.profile.name} ({run.profile.source}), level {run.level}, "
            f"report directory {run.report_dir}"]


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> Any:
    """Claim --report-dir before pytest parses the rest of the command line: a refused command line must not
    leave an earlier run's "accept" behind. Then, every conftest's options known, check the command line before
    pytest reads it (clustergate.run.launch.command_line): an unknown option or a suite named where there is none is
    said once and ends the run (2). Where the plugin comes from a conftest.py (not -p clustergate, as the checkout's
    addopts and ``clustergate run`` give it) it is not registered yet: pytest_configure claims the directory then."""
    ns = early_config.known_args_namespace
    asked_for_help = getattr(ns, "help", False) or getattr(ns, "version", False)
    if not asked_for_help:
        # Before pytest's own wrapper starts capturing the conftests' loading (it was registered first, so it runs
        # inside this one): the line that says where an earlier run's outputs went reaches the terminal.
        claim_report_dir(early_config, getattr(ns, "report_dir", None))
    result = yield
    problem = None if asked_for_help else command_line.problem(early_config, parser, args)
    if problem is not None:
        lock = early_config.stash.get(LOCK, None)
        if lock is not None:
            lock.release()
        refusal.leave(refusal.said(problem, stale_note(early_config)), Exit.USAGE)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Any:
    """A run refused before or during its session ends with the exit status the table gives it (2 for a usage
    error, 4 for a run that could not start; pytest's own is 4 for both), saying why once, in pytest's words
    (clustergate.run.launch.refusal); where an earlier run's results.json could not be moved aside, it says so too: that
    file is not this run's result."""
    try:
        return (yield)
    except pytest.UsageError as exc:
        status = Exit.COULD_NOT_RUN if isinstance(exc, CouldNotRun) else Exit.USAGE
        # A rank that never came, or one stopped beside this one, cannot say it: the first rank present does.
        missing = {*getattr(exc, "missing", ()), *(int(r) for r in stopped_siblings().values() if r.isdigit())}
        refusal.tell(refusal.said(str(exc), stale_note(config)), status, missing=missing)
        leave_unstarted(int(status))
        return status


def leave_unstarted(status: int) -> None:
    """A run that ended before it started: stopped sibling ranks are continued and ended (torchrun's SIGTERM would
    wait in them until its SIGKILL 30 s later), and where the process groups exist the rank leaves at once: their
    teardown at the interpreter's exit waits on a collective a stopped peer never joins (the control group's limit,
    minutes). Groups are never destroyed by the run (``world.init_world``). Only under torchrun's agent: pytest
    run in another process (a test's in-process run) goes on as pytest does."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return
    stopped = stopped_siblings()
    if stopped:
        named = ", ".join(f"rank {rank} (pid {pid})" for pid, rank in sorted(stopped.items()))
        sys.stderr.write(f"clustergate: {named} beside this rank stopped (SIGSTOP or a debugger): ended with it\n")
        stop_processes(list(stopped), STOP_GRACE_S)
    if dist.is_available() and dist.is_initialized():
        exit_now(status)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # First, before any check below can stop the run: no earlier run's outputs may outlive it.
    claim_report_dir(config, config.getoption("report_dir"))
    config.addinivalue_line("markers", "metrics(*names): metrics the test records (checked against "
                                       "the profile before the run)")
    config.addinivalue_line("markers", "multinode: needs two or more nodes; skipped on one node")
    config.addinivalue_line("markers", "time_limit(seconds, levels=[...]): this test's own limit (at those levels "
                                       "only), over --test-timeout and its measured time")
    if config.option.help:  # `pytest --help` configures too: no process group, no report directory, no lock
        return
    if config.pluginmanager.is_blocked("clustergate"):  # -p clustergate, then -p no:clustergate: its hooks stay
        raise pytest.UsageError("the acceptance suite runs only under its plugin, clustergate: remove "
                                "-p no:clustergate (on the command line, in PYTEST_ADDOPTS or in addopts)")
    startclock.mark("configure")
    run = open_run(config, Options.from_config(config))
    config.stash[RUN] = run
    config.stash[report_hooks.LIVE] = Drawn(run)  # what the report draws: the run's record, never the run
    config.pluginmanager.register(SessionGuard(run), "clustergate-session-events")
    route_outputs(config, run)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    restore_stdout(session.config)
    run = session.config.stash.get(RUN, None)
    if run is not None:
        run.start()
        show_tests_from_rootdir(session.config)


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        counts = items[0].config.stash.setdefault(DESELECTED, [0, 0])
        counts[0] += len(items)
        # The sign-off signs a fabric run only if it left out none of the multinode tests.
        counts[1] += sum(1 for item in items if item.get_closest_marker("multinode"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash[RUN]
    problem = pytest_items.problem(items, run.profile)
    if problem:
        run.fail(problem)  # results.json already exists and says "running": it says why too
        raise pytest.UsageError(problem)
    problem = pytest_items.one_node_problem(items, run.node_count)
    if problem:
        run.fail(problem)
        raise pytest.UsageError(problem)
    pytest_items.skip_multinode(items, run.node_count)
    deselected, multinode_deselected = config.stash.get(DESELECTED, [0, 0])
    run.select(selected=len(items), deselected=deselected,
               multinode=sum(1 for item in items if item.get_closest_marker("multinode")),
               multinode_deselected=multinode_deselected,
               suite=suite_prefix((item.nodeid, item.path) for item in items))
    run.attest(plugins.listed(config.pluginmanager))  # every conftest is loaded by now
    problem = run.collected([item.nodeid for item in items])
    if problem:
        run.fail(problem)
        raise pytest.UsageError(problem)  # said once (clustergate.run.launch.refusal), as every usage error
    problem = run.choose_limits({item.nodeid: time_limit(item, run.level) for item in items})
    if problem:
        run.fail(problem)
        raise pytest.UsageError(problem)
    broken = config.stash.get(GPU_NODE_PROBLEM, None)
    if broken:
        # A reject, not an interruption: no test runs, and the run's end says why once (the summary, torchrun's).
        run.fail(broken)
        items.clear()
    run.write_results()
    run.outside.tests_begin()


@pytest.fixture
def cg(request: pytest.FixtureRequest) -> Recorder:
    """The run as a test sees it: level, device, profile settings, and ``record``."""
    return request.node.stash[RECORDER]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    run = item.config.stash[RUN]
    item.stash[RECORDER] = Recorder(run, item.nodeid, pytest_items.declared(item))
    run.start_test(item.nodeid, run.limit_of(item.nodeid))
    try:
        result = yield
    except BaseException as exc:
        run.end_test(item.nodeid, aborted=True)  # pytest.exit, KeyboardInterrupt, an internal error
        pytest_items.junit_interrupted(item, f"{type(exc).__name__}: {exc}".rstrip(": "))
        raise
    run.end_test(item.nodeid)
    if run.poisoned:
        item.session.shouldstop = run.poisoned
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.config.stash[RUN].enter("setup")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    item.config.stash[RUN].enter("call")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    item.config.stash[RUN].enter("teardown")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    pytest_items.skip_at_the_test(item, report, call)
    run = item.config.stash[RUN]
    recorder = item.stash[RECORDER]
    mine = pytest_items.phase_outcome(item, report, call, recorder)
    verdict = run.merge_phase(item.nodeid, call.when, mine, recorder.declared, call.duration)
    pytest_items.apply(item, report, verdict, call.when)
    return report


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Agree the exit status on every rank and decide the verdict, before pytest-html writes the report."""
    run = session.config.stash.get(RUN, None)
    if run is None:
        return
    run.outside.tests_over()
    status = run.decide(int(exitstatus))
    session.exitstatus = status
    session.config.stash[STATUS] = status


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(RUN, None)
    lock = config.stash.get(LOCK, None)
    if run is None:
        if lock is not None:
            lock.release()  # held from the start, and a check refused the run: a lock file must not stay
        return
    if STATUS not in config.stash:
        if run.started:  # the session's end failed before the verdict was decided: never accept
            run.end(detectors.end_not_run(run))
        if run.signals is not None:
            run.signals.close()
        if lock is not None:
            lock.release()
        return  # configure failed after the groups were made (a usage error): pytest prints it next
    outputs = [Path(p) for p in (config.getoption("htmlpath", None), config.option.xmlpath) if p]
    status = run.final_barrier(outputs, Path(config.option.xmlpath) if config.option.xmlpath else None)
    if lock is not None:
        lock.release()
    # Every rank has written what it must (the final barrier), so all leave now, through the run's one
    # way out, whatever the verdict. A collective stuck or a peer gone: tearing the groups down could
    # hang. A failed run: torchrun stops the other ranks as soon as one exits non-zero, so a rank still
    # tearing NCCL down would die of SIGTERM instead of exiting with the agreed status (seen on 4 and 8
    # H200s). An accepted run: the interpreter's own teardown (threads joined, modules and process
    # groups, CUDA and NCCL freed) serves nobody, and took 3.8 s of an accepted quick run on one H100,
    # from the final barrier to the command's exit. Its exit handlers still run, as a normal exit's would
    # (a failed run skips them: one could wait on a peer or a child that is gone). A usage error is the
    # exception: pytest prints it after this hook, so that run ends normally.
    if status == Exit.ACCEPT and not (run.poisoned or run.exiting):
        run.outside.exit_handlers()
    if status not in (Exit.ACCEPT, Exit.USAGE) and not run.exiting and run.report_dir is not None:
        tell_launcher(run, status)  # a usage error is told as every refusal is, once pytest has said it
    if run.poisoned or run.exiting or status != Exit.USAGE:
        run.end(run.final_ending())


def tell_launcher(run: Run, status: int) -> None:
    """torchrun's summary of a run that is not accepted names its verdict, as ``clustergate run``'s last line does:
    the node's first rank writes that line into its error file, the node's other ranks wait for torchrun's SIGTERM
    (clustergate.run.launch.errorfile), having ended what their tests left running: that SIGTERM ends them where they
    wait, before their own exit would (a failed run's rank 1 left its tests' daemon behind)."""
    world = run.world
    if errorfile.Place(world.rank, world.local_rank, world.local_world_size, world.world_size).first_of_node():
        errorfile.write(verdict_of(run.record.as_json(), status, run.results_path, prog="clustergate"))
    else:
        end_what_the_tests_left()
        errorfile.wait_for_the_agent(AGENT_STOP_S)


def pytest_internalerror(excrepr: Any, excinfo: Any) -> None:
    """Name the rank and host on an internal error; ranks other than 0 have no terminal."""
    try:
        host = node_name()
    except NodeNameError:
        host = "a node without a usable name"
    sys.stderr.write(printable_lines(Scrubber.from_environment()(
        f"clustergate: INTERNALERROR on rank {os.environ.get('RANK', '0')} ({host}): "
        f"{excinfo.exconly() if excinfo else excrepr}\n")))


class SessionGuard:
    """What stops a session early on this rank, told to the run: pytest.exit, KeyboardInterrupt, an internal
    error, a test file that cannot be collected, a crash in any plugin's end of the session. Registered once
    the run exists."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.run.end(detectors.pytest_stopped(self.run, excinfo.value))

    def pytest_internalerror(self, excrepr: Any, excinfo: Any) -> None:
        what = excinfo.exconly() if excinfo is not None else str(excrepr).splitlines()[-1]
        self.run.end(detectors.internal_error(self.run, what))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            last = next((line for line in report.longreprtext.splitlines()[::-1] if line.strip()), "")
            self.run.fail(f"collecting {report.nodeid or 'the tests'} failed on {self.run.who}: {last}")

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Any:
        # Before pytest's junit.xml writer, which runs before the verdict is decided: junit.xml holds the verdict's
        # testcase as undecided (failing) until the run rewrites it (clustergate.report.junit).
        pytest_items.junit_undecided(session.config)
        try:
            return (yield)
        except Exception as exc:  # e.g. a report that cannot be written: the run must not read as accepted
            what = f"the end of the session failed on {self.run.who}: {type(exc).__name__}: {exc}"
            sys.stderr.write(printable_lines(Scrubber.from_environment()(f"clustergate: {what}\n")))
            self.run.fail(what)
            if self.run.status is None:
                session.config.stash[STATUS] = self.run.decide(pytest.ExitCode.INTERNAL_ERROR)
            return None
