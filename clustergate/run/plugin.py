"""The pytest plugin: pytest on every torchrun rank, one verdict for all of them.

Only where asked for (clustergate.optin): the checkout's root conftest.py or acceptance/conftest.py,
``-p clustergate``, ``--clustergate`` or the ini key ``clustergate = true``. Hooks stay thin and hand
off to ``ClusterGate``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from clustergate.identity import gpu_model_name
from clustergate.outcomes import PhaseOutcome, poisons
from clustergate.redact import Scrubber, ScrubbingStream, scrub_strings
from clustergate.run.recorder import Recorder
from clustergate.run.session import ClusterGate
from clustergate.run.startup import (
    LOCK,
    check_seconds,
    claim_report_dir,
    given_or,
    prepare_report_dir,
    seconds,
    stale_note,
)
from clustergate.run.stops import STATUS, SessionEvents
from clustergate.run.world import WorldError, init_world, shutdown
from clustergate.thresholds import ThresholdsError, load, shipped_thresholds
from workloads.common import LEVELS
from workloads.node.name import NodeNameError, node_name

GATE = pytest.StashKey[ClusterGate]()
RECORDER = pytest.StashKey[Recorder]()
REAL_STDOUT = pytest.StashKey[Any]()
DESELECTED = pytest.StashKey[int]()
DESELECTED_MULTINODE = pytest.StashKey[int]()
ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = ROOT if (ROOT / "pyproject.toml").is_file() else None
"""The source checkout this module runs from; None when installed from a wheel."""

DEFAULT_TEST_TIMEOUT_S = 900.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
DEFAULT_LEVEL = "standard"

INI_KEYS: dict[str, tuple[str, str]] = {
    "thresholds": ("paths", "pass criteria per profile (--thresholds), relative to this file"),
    "profile": ("string", "profile in the thresholds file (--profile)"),
    "report_dir": ("paths", "where the outputs go (--report-dir), relative to this file"),
    "level": ("string", "quick, standard or extended (--level)"),
    "shared_dir": ("paths", "a directory every node mounts (--shared-dir)"),
    "test_timeout": ("string", "per-test limit in seconds (--test-timeout)"),
    "collective_timeout": ("string", "timeout of the workloads' process group in seconds (--collective-timeout)"),
}
"""Each option that may also be set as the ini key clustergate_<name> (the command line wins)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("clustergate", "cluster acceptance (clustergate)")
    group.addoption("--thresholds", default=None, metavar="FILE",
                    help="pass criteria per profile (default: ini clustergate_thresholds, else the thresholds.yaml "
                         "shipped with clustergate)")
    group.addoption("--profile", default=None, metavar="NAME",
                    help="profile in the thresholds file (default: chosen from the GPU model NVML "
                         "reports; 'cpu' where there is no GPU)")
    group.addoption("--report-dir", default=None, metavar="DIR",
                    help="where results.json, report.html, junit.xml and progress.jsonl go "
                         "(default: reports/<UTC time>/ in the checkout, else in the current directory)")
    # No argparse choices: a wrong level is refused in pytest_configure, after the report directory is claimed.
    group.addoption("--level", default=None, metavar="|".join(LEVELS),
                    help="how long and how large workloads run: quick (about a minute a node), "
                         "standard (default), extended (burn-in)")
    group.addoption("--shared-dir", default=None, metavar="DIR",
                    help="a directory every node mounts, for the shared-filesystem test (default: "
                         "$CLUSTERGATE_SHARED_DIR, else the profile's shared_dir setting)")
    group.addoption("--test-timeout", type=seconds, default=None, metavar="SECONDS",
                    help="per-test limit; a test past it ends the run on every rank "
                         "(default: the profile's test_timeout_s)")
    group.addoption("--collective-timeout", type=seconds, default=None, metavar="SECONDS",
                    help="timeout of the workloads' process group (default: the profile's "
                         "collective_timeout_s)")
    for name, (kind, text) in INI_KEYS.items():
        parser.addini(f"clustergate_{name}", type=kind, default=[] if kind == "paths" else None,
                      help=f"clustergate: {text}")


def resolve_options(config: pytest.Config) -> None:
    """Fill each option not given on the command line from its ini key, then from its default.

    Everything after this reads ``config.getoption``, so the ini keys need no other code.
    """
    for name, (kind, _) in INI_KEYS.items():
        if config.getoption(name) is not None:
            continue
        value = config.getini(f"clustergate_{name}")
        if kind == "paths":
            value = str(value[0]) if value else None
        if value in (None, ""):
            continue
        if name in ("test_timeout", "collective_timeout"):
            try:
                value = float(value)
            except ValueError:
                raise pytest.UsageError(f"{config.inipath}: clustergate_{name} = {value!r} is not a number of "
                                        "seconds") from None
        if name == "level" and value not in LEVELS:
            raise pytest.UsageError(f"{config.inipath}: clustergate_level = {value!r}; choose one of "
                                    f"{', '.join(LEVELS)}")
        setattr(config.option, name, value)
    if config.option.thresholds is None:
        config.option.thresholds = str(shipped_thresholds())
    if config.option.level is None:
        config.option.level = DEFAULT_LEVEL


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    gate = config.stash.get(GATE, None)
    if gate is None:
        return None
    return [f"clustergate: profile {gate.profile.name} ({gate.profile.source}), level {gate.level}, "
            f"report directory {gate.report_dir}"]


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Claim --report-dir before pytest parses the rest of the command line: an unknown option ends the
    run there, and must not leave an earlier run's "accept" behind (issue 23). Where the plugin comes
    from the checkout's conftest.py it is not registered yet: pytest_configure claims it then."""
    ns = early_config.known_args_namespace
    if not (getattr(ns, "help", False) or getattr(ns, "version", False)):
        claim_report_dir(early_config, getattr(ns, "report_dir", None))


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Any:
    """A run that stops with a usage error while an earlier run's results.json could not be moved aside
    says so: that file is not this run's result."""
    try:
        return (yield)
    except pytest.UsageError as exc:
        note = stale_note(config)
        if note is None:
            raise
        raise pytest.UsageError(f"{exc}\n{note}") from None


def pytest_configure(config: pytest.Config) -> None:
    # First, before any check below can stop the run: no earlier run's outputs may outlive it (issue 23).
    claim_report_dir(config, config.getoption("report_dir"))
    config.addinivalue_line("markers", "metrics(*names): metrics the test records (checked against "
                                       "the profile before the run)")
    config.addinivalue_line("markers", "multinode: needs two or more nodes; skipped on one node")
    config.addinivalue_line("markers", "time_limit(seconds): this test's own limit instead of --test-timeout")
    if config.option.help:  # `pytest --help` configures too: no process group, no report directory, no lock
        return
    resolve_options(config)
    if hasattr(config, "workerinput") or config.getoption("numprocesses", None) or \
            config.getoption("dist", "no") != "no":
        raise pytest.UsageError("clustergate runs one pytest per rank under torchrun: do not combine it "
                                "with pytest-xdist (-n/--dist); use torchrun --nproc-per-node instead")
    if config.pluginmanager.hasplugin("randomly") or config.pluginmanager.hasplugin("random_order"):
        raise pytest.UsageError("a random-order plugin is active: every rank must run tests in the same "
                                "order; add -p no:randomly (or -p no:random_order)")
    for option in ("test_timeout", "collective_timeout"):
        check_seconds(f"--{option.replace('_', '-')}", config.getoption(option))
    if config.getoption("level") not in LEVELS:
        raise pytest.UsageError(f"--level {config.getoption('level')}: invalid choice: {config.getoption('level')!r} "
                                f"(choose from {', '.join(LEVELS)})")
    try:
        thresholds = load(config.getoption("thresholds"))
        name = config.getoption("profile")
        profile = thresholds.profile(name) if name else thresholds.select(gpu_model_name())
        test_timeout = given_or(config.getoption("test_timeout"), profile.settings.get(
            "test_timeout_s", DEFAULT_TEST_TIMEOUT_S))
        collective_timeout = given_or(config.getoption("collective_timeout"), profile.settings.get(
            "collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S))
        # The control group waits for the slowest rank of a test, so it must outlast the test limit.
        world = init_world(collective_timeout, control_timeout_s=test_timeout + 120,
                           want_cuda=profile.name != thresholds.cpu_profile)
    except (ThresholdsError, WorldError, NodeNameError) as exc:
        raise pytest.UsageError(str(exc)) from None
    report_dir = prepare_report_dir(config, world, CHECKOUT or Path.cwd())
    selection = {"k": config.getoption("keyword") or None, "m": config.getoption("markexpr") or None,
                 "level": config.getoption("level"), "selected": None, "deselected": None}
    # What reaches the terminal is scrubbed of secrets, on every rank. pytest's terminal reporter binds
    # sys.stdout when it configures, after this hook.
    sys.stdout = ScrubbingStream(sys.stdout)
    sys.stderr = ScrubbingStream(sys.stderr)
    gate = ClusterGate(world, profile, config.getoption("level"), report_dir, test_timeout, selection)
    config.stash[GATE] = gate
    config.pluginmanager.register(SessionEvents(gate), "clustergate-session-events")
    if world.is_leader:
        if not config.getoption("htmlpath", None):
            config.option.htmlpath = str(report_dir / "report.html")
        config.option.self_contained_html = True
        if not config.option.xmlpath:
            config.option.xmlpath = str(report_dir / "junit.xml")
    else:
        # Exactly one report: ranks other than 0 write neither HTML nor JUnit, and only global
        # rank 0 talks to the terminal (torchrun prints every node's local rank 0). pytest's
        # terminal reporter binds sys.stdout when it configures, after this hook: hand it a sink.
        # (It must stay registered: assertion rewriting asks it for a terminal writer.)
        config.option.htmlpath = None
        config.option.xmlpath = None
        config.stash[REAL_STDOUT] = sys.stdout
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the session


pytest_configure = pytest.hookimpl(tryfirst=True)(pytest_configure)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    real = session.config.stash.get(REAL_STDOUT, None)
    if real is not None:
        sys.stdout = real  # the terminal reporter already holds the sink
    gate = session.config.stash.get(GATE, None)
    if gate is not None:
        gate.start()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        config = items[0].config
        config.stash[DESELECTED] = config.stash.get(DESELECTED, 0) + len(items)
        # The sign-off signs a fabric run only if it left out none of the multinode tests (issue 23.7).
        config.stash[DESELECTED_MULTINODE] = config.stash.get(DESELECTED_MULTINODE, 0) + sum(
            1 for item in items if item.get_closest_marker("multinode"))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    gate = config.stash[GATE]
    for item in items:
        for name in _declared(item):
            if name not in gate.profile.metrics:
                _usage_error(gate, f"{gate.profile.source}: profile {gate.profile.name!r} has no metrics.{name}, "
                                   f"which {item.nodeid} records; add it (an empty mapping {{}} measures without "
                                   "judging)")
        marker = item.get_closest_marker("time_limit")
        if marker is not None:
            limit = marker.args[0] if marker.args else None
            if not isinstance(limit, (int, float)) or not (math.isfinite(limit) and limit > 0):
                _usage_error(gate, f"{item.nodeid}: @pytest.mark.time_limit({limit!r}): a time limit must be a "
                                   "finite number of seconds above 0")
        if item.get_closest_marker("multinode") and gate.node_count < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ nodes; this job has {gate.node_count}"))
    gate.run.selection.update(selected=len(items), deselected=config.stash.get(DESELECTED, 0),
                              multinode=sum(1 for item in items if item.get_closest_marker("multinode")),
                              multinode_deselected=config.stash.get(DESELECTED_MULTINODE, 0))
    problem = gate.check_collection([item.nodeid for item in items])
    if problem:
        gate.run.fail(problem)
        pytest.exit(problem, returncode=pytest.ExitCode.USAGE_ERROR)
    gate.write_results()


pytest_collection_modifyitems = pytest.hookimpl(trylast=True)(pytest_collection_modifyitems)


def _usage_error(gate: ClusterGate, message: str) -> None:
    """Refuse the run, and say why in results.json too (it already exists and says "running")."""
    gate.run.fail(message)
    raise pytest.UsageError(message)


def _declared(item: pytest.Item) -> tuple[str, ...]:
    return tuple(n for m in item.iter_markers("metrics") for n in m.args)


@pytest.fixture
def cg(request: pytest.FixtureRequest) -> Recorder:
    """The run as a test sees it: level, device, profile settings, and ``record``."""
    return request.node.stash[RECORDER]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    gate = item.config.stash[GATE]
    marker = item.get_closest_marker("time_limit")
    limit = float(marker.args[0]) if marker else gate.test_timeout_s
    item.stash[RECORDER] = Recorder(gate, item.nodeid, _declared(item))
    gate.start_test(item.nodeid, limit)
    try:
        result = yield
    except BaseException as exc:
        gate.end_test(item.nodeid, aborted=True)  # pytest.exit, KeyboardInterrupt, an internal error
        _junit_interrupted(item, f"{type(exc).__name__}: {exc}".rstrip(": "))
        raise
    gate.end_test(item.nodeid)
    if gate.poisoned:
        item.session.shouldstop = gate.poisoned
    return result


def _junit_interrupted(item: pytest.Item, what: str) -> None:
    """junit.xml counts a test the run was interrupted in as an error (pytest writes no report for it)."""
    from _pytest import junitxml  # pytest's own writer: its stash key and per-test reporter

    xml = item.config.stash.get(junitxml.xml_key, None)
    if xml is None:
        return
    message = f"interrupted: {what} (the test did not finish)"
    try:
        report = pytest.TestReport(item.nodeid, item.location, {}, "failed", message, "call")
        reporter = xml._opentestcase(report)
        reporter._add_simple("error", message, message)
        xml.finalize(report)
    except Exception as exc:  # a private API: say so rather than lose the run's ending
        sys.stderr.write(f"clustergate: could not add {item.nodeid} to junit.xml as interrupted: {exc}\n")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.config.stash[GATE].phase = "setup"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    item.config.stash[GATE].phase = "call"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    item.config.stash[GATE].phase = "teardown"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    gate = item.config.stash[GATE]
    recorder = item.stash[RECORDER]
    mine = PhaseOutcome(
        rank=gate.world.rank, host=gate.identity.host, outcome=report.outcome,
        message=_message(item, report, call), stop=call.stop,
        records=recorder.records if call.when == "call" else [],
        details=recorder.details if call.when == "call" else {}, gpu_label=gate.gpu_label(),
        poisoned=poisons(call.excinfo.value if call.excinfo else None),
    )
    verdict = gate.merge_phase(item.nodeid, call.when, mine, recorder.declared, call.duration)
    if verdict.outcome == "failed":
        report.outcome = "failed"
        report.longrepr = verdict.message
    elif verdict.outcome == "skipped" and report.outcome != "skipped":
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, verdict.message)
    report.user_properties.append(("failed_ranks", verdict.failed_ranks))
    if call.when == "call":
        report.user_properties.append(("metrics", [m.as_json() for m in verdict.metrics]))
    _scrub_report(report)
    return report


def _scrub_report(report: pytest.TestReport) -> None:
    """What the report carries reaches the terminal, junit.xml and report.html: scrub it at the source."""
    scrub = Scrubber.from_environment()
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        path, line, reason = report.longrepr
        report.longrepr = (path, line, scrub(str(reason)))
    elif report.longrepr is not None:
        text = str(report.longrepr)
        if scrub(text) != text:
            report.longrepr = scrub(text)
    report.sections = [(title, scrub(content)) for title, content in report.sections]
    # Each string, not the JSON text: a short or digits-only secret scrubbed from JSON text would break it.
    report.user_properties = [(name, scrub_strings(json.loads(json.dumps(value, default=str)), scrub))
                              for name, value in report.user_properties]


def _message(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]) -> str:
    """This rank's failure as a short traceback: N ranks' worth of long tracebacks is unreadable.

    Uses the item's own formatter (which drops pytest's and pluggy's frames) in --tb=short style.
    """
    if report.outcome == "passed":
        return ""
    if report.outcome == "failed" and call.excinfo is not None and isinstance(item, pytest.Function):
        try:
            return str(item._repr_failure_py(call.excinfo, style="short"))
        except Exception:  # a private helper: fall back to pytest's own text if it ever changes
            pass
    return report.longreprtext


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Agree the exit status on every rank and decide the verdict, before pytest-html writes the report."""
    gate = session.config.stash.get(GATE, None)
    if gate is None:
        return
    status = gate.conclude(int(exitstatus), collect_only=bool(session.config.option.collectonly))
    session.exitstatus = status
    session.config.stash[STATUS] = status


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    gate = config.stash.get(GATE, None)
    lock = config.stash.get(LOCK, None)
    if gate is None:
        if lock is not None:
            lock.release()  # held from the start, and a check refused the run: a lock file must not stay
        return
    if STATUS not in config.stash:
        if gate.started:  # the session's end failed before the verdict was decided: never accept
            _leave_now(gate.abandon())
        gate.signals.close()
        if lock is not None:
            lock.release()
        return  # configure failed after the groups were made (a usage error): pytest prints it next
    outputs = [Path(p) for p in (config.getoption("htmlpath", None), config.option.xmlpath) if p]
    status = gate.seal(outputs)
    if lock is not None:
        lock.release()
    # A collective stuck or a peer gone: tearing the groups down could hang. A failed run: torchrun
    # stops the other ranks as soon as one exits non-zero, so a rank still tearing NCCL down would
    # die of SIGTERM instead of exiting with the agreed status (seen on 4 and 8 H200s). Every rank has
    # written what it must (the final barrier), so all leave now. A usage error is the exception:
    # pytest prints it after this hook, so that run ends normally.
    if gate.poisoned or gate.lost or status not in (0, pytest.ExitCode.USAGE_ERROR):
        _leave_now(status)
    if status == 0:
        shutdown(gate.world)


def _leave_now(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def pytest_internalerror(excrepr: Any, excinfo: Any) -> None:
    """Name the rank and host on an internal error; ranks other than 0 have no terminal."""
    try:
        host = node_name()
    except NodeNameError:
        host = "a node without a usable name"
    sys.stderr.write(Scrubber.from_environment()(
        f"clustergate: INTERNALERROR on rank {os.environ.get('RANK', '0')} ({host}): "
        f"{excinfo.exconly() if excinfo else excrepr}\n"))
