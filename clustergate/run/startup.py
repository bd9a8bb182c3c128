"""What the run sets up before any test: the report directory on every rank (usable, held by this run alone,
cleared of an earlier run's outputs), the thresholds, the process groups, and the ``Run`` itself. Each
problem is one pytest.UsageError naming the option or path and what to do, raised alike on every rank.

Order matters: ``claim_report_dir`` runs first, before any check that can stop the run, and holds --report-dir
(its lock) but moves nothing: a run refused for a broken thresholds.yaml, an unknown profile or a bad option
changes nothing there, and its error ends with ``stale_note``, saying the results.json there is an earlier run's,
left as it was. Only once every check has passed and the run is about to write its own record does
``prepare_report_dir`` move the earlier outputs to earlier/<time>/, saying where in one line. Where they cannot
be moved (a read-only directory), every error of the run ends with ``stale_note`` too.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from clustergate.criteria import baseline as baseline_file
from clustergate.criteria.profile_choice import choose_profile
from clustergate.criteria.thresholds import Profile, ThresholdsError, expects_gpus, load
from clustergate.record import reportdir
from clustergate.record.results import RunRecord, write_json
from clustergate.run import plugins, startclock
from clustergate.run.launch import command_note
from clustergate.run.lifecycle import Outside, Run
from clustergate.run.limits import CONTROL_MARGIN_S, STARTUP_S
from clustergate.run.options import Options
from clustergate.run.ranks import control
from clustergate.run.ranks.control import Step, within
from clustergate.run.ranks.peers import Peers
from clustergate.run.ranks.world import (
    StartupLost,
    StartupRefused,
    World,
    WorldError,
    init_world,
    launch_from_env,
    meet_at_start,
    rendezvous,
)
from clustergate.secrets.redact import ScrubbingStream, keep
from clustergate.store import store_problem
from clustergate.trust import attestation
from clustergate.trust.identity import environment, gpu_model, gpu_node_problem, rank_identity, visible_gpus
from workloads.common import PlacementError, rank_device
from workloads.node import gpu_presence
from workloads.node.discovery import host_root
from workloads.node.name import NodeNameError, node_name

LOCK = pytest.StashKey[reportdir.RunLock]()
"""The report directory's lock, held by rank 0 until the run ends."""
MOVED = pytest.StashKey[dict[Path, Path]]()
"""Where this run moved each earlier output (rank 0)."""
NOT_MOVED = pytest.StashKey["tuple[Path, str | None] | None"]()
"""Set once rank 0 has tried to claim the directory: None, or (directory, why its earlier outputs stay; None: not
yet moved, as a run refused before it writes leaves them)."""
GPU_NODE_PROBLEM = pytest.StashKey[str]()
"""Why this rank, on a GPU node, cannot run the suite (its torch sees no CUDA): a reject said at collection, once
the run's record exists."""
REAL_STDOUT = pytest.StashKey[Any]()
"""A rank other than 0: its own stdout, while pytest's terminal reporter writes to a sink."""


class CouldNotRun(pytest.UsageError):
    """The run could not start: a rank never came, the process groups could not form, no report directory.
    Exit status 4 (clustergate.common.exit_codes), where any other usage error is 2."""

    def __init__(self, message: str, missing: list[int] | None = None) -> None:
        super().__init__(message)
        self.missing = missing or []
        """The ranks that never came: the first rank present says why (clustergate.run.launch.refusal)."""


def open_run(config: pytest.Config, options: Options) -> Run:
    """The run of this rank: its profile, its process groups, its report directory, every rank's identity.

    Every rank first comes to the start through the rendezvous store, saying whatever keeps it from taking part
    (its thresholds, its device, its node's name): one rank's problem stops every rank at once with its words,
    and a rank that never comes is named after STARTUP_S (``meet_at_start``)."""
    try:
        launch = launch_from_env()
    except WorldError as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        store = rendezvous(launch, STARTUP_S)
    except Exception as exc:  # torch's store errors: the agent's store cannot be reached
        raise CouldNotRun(f"the run could not start: the rendezvous store cannot be reached ({exc})") from None
    startclock.mark("rendezvous store")
    problem, profile, host = None, None, None
    found = gpu_presence.find(host_root())
    try:
        thresholds = load(options.thresholds)
        profile = choose_profile(thresholds, options.profile, found, model_of=gpu_model, visible=visible_gpus())
        device = rank_device(launch.local_rank, want_cuda=profile.name != thresholds.cpu_profile)
        host = node_name()
    except (ThresholdsError, PlacementError, NodeNameError) as exc:
        problem = str(exc)
    if problem is None:
        problem = plugins.disabled(config.pluginmanager) or attestation.profile_problem(
            not expects_gpus(profile.setting("gpus_per_node", None)), found, options.dry_run)
    if problem is None and launch.rank == 0:  # the store is rank 0's alone: its path must be usable there
        problem = store_problem(options.store)
    if store is not None:
        try:
            meet_at_start(store, launch, host, STARTUP_S, problem)
        except StartupLost as exc:
            if launch.rank == 0 and profile is not None:
                record_refusal(config, options, profile, str(exc), exc.missing)
            raise CouldNotRun(str(exc), exc.missing) from None
        except StartupRefused as exc:
            raise pytest.UsageError(str(exc)) from None
    startclock.mark("every rank came")
    if problem is not None or profile is None or host is None:
        raise pytest.UsageError(problem or "the run could not start")
    world = init_world(launch, store, device, host, options.collective_limit_s(profile),
                       control_timeout_s=options.test_limit_s(profile) + CONTROL_MARGIN_S)
    startclock.mark("process groups")
    # The report directory is named by the run, never scrubbed: a secret that is a part of its path (a PIN that
    # is a year) must not move the outputs to "[redacted]/". Kept on every rank before rank 0 shares the name.
    keep(options.report_dir, str(Path.cwd() / "reports"))
    # Read before the report directory is prepared: a --baseline that cannot be used is refused with the earlier
    # outputs where they were (a refused run changes nothing).
    baseline = read_baseline(world, options.baseline)
    # A listing (--collect-only) writes no outputs: no report directory is made, none is held.
    report_dir = None if options.collect_only else prepare_report_dir(config, world, Path.cwd())
    if report_dir is not None:
        keep(str(report_dir), str(report_dir.resolve()))
    # A --baseline among the earlier outputs moved aside now names their new place (follow_baseline), not the one
    # Options read from the command line.
    if baseline is not None and config.getoption("baseline") != options.baseline:
        baseline["_source"] = str(config.getoption("baseline"))  # read before it moved: it is named where it is
    options = dataclasses.replace(options, baseline=config.getoption("baseline"))
    startclock.mark("report directory")
    # What reaches the terminal is scrubbed of secrets, on every rank. pytest's terminal reporter binds
    # sys.stdout when it configures, after this hook.
    sys.stdout = ScrubbingStream(sys.stdout)
    sys.stderr = ScrubbingStream(sys.stderr)
    identity = rank_identity(world.rank, world.local_rank, world.node_rank, world.device)
    run = Run(world, profile, options, report_dir, identity=identity, outside=Outside(peers=Peers(world)),
              baseline=baseline)
    run.meet(environment())
    startclock.mark("identities")
    if profile.name != thresholds.cpu_profile and (broken := gpu_node_problem(found, world.device)):
        config.stash[GPU_NODE_PROBLEM] = broken  # a reject, said once the run's record exists (collection)
    return run


def read_baseline(world: World, path: str | None) -> dict[str, Any] | None:
    """The earlier run to compare with (--baseline), read on rank 0; its problem stops every rank alike (the file
    may exist only where rank 0 runs)."""
    if path is None:
        return None
    problem, data = None, None
    if world.is_leader:
        try:
            data = baseline_file.load(path)
        except baseline_file.BaselineError as exc:
            problem = str(exc)
    problem = control.broadcast_from_leader(world, problem, Step(None, "baseline check", within(STARTUP_S)))
    if problem:
        raise pytest.UsageError(problem)
    return data


def record_refusal(config: pytest.Config, options: Options, profile: Profile, error: str, culprits: list[int]) -> None:
    """Rank 0, where the run could not start: results.json says why and names the ranks (no other rank can be
    asked where the outputs go: rank 0 alone chooses, as it always does)."""
    path = Path(options.report_dir) if options.report_dir else default_report_dir(Path.cwd())
    if reportdir.problem(path) is not None or hold(config, path) is not None:
        return  # nowhere to write: the error says it all
    command_note.tell(report_dir=path)
    record = RunRecord(profile=profile.name, level=options.level, world_size=int(os.environ.get("WORLD_SIZE", "1")),
                       sign_off=profile.sign_off, selection=options.selection())
    record.fail(error)
    record.extra["error_ranks"] = culprits
    try:
        write_json(path / "results.json", record.as_json())
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"clustergate: could not write {path / 'results.json'}: {exc}\n")


def route_outputs(config: pytest.Config, run: Run) -> None:
    """Exactly one report: rank 0 writes report.html (self-contained) and junit.xml into the report directory;
    the other ranks write neither, and only global rank 0 talks to the terminal (torchrun prints every node's
    local rank 0). A listing (--collect-only) writes neither."""
    if run.world.is_leader:
        if run.report_dir is None:
            config.option.htmlpath = config.option.xmlpath = None
            return
        if not config.getoption("htmlpath", None):
            config.option.htmlpath = str(run.report_dir / "report.html")
        config.option.self_contained_html = True
        if not config.option.xmlpath:
            config.option.xmlpath = str(run.report_dir / "junit.xml")
        return
    # pytest's terminal reporter binds sys.stdout when it configures, after this hook: hand it a sink (it must
    # stay registered: assertion rewriting asks it for a terminal writer). The session's start gives stdout back.
    config.option.htmlpath = None
    config.option.xmlpath = None
    config.stash[REAL_STDOUT] = sys.stdout
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the session


def show_tests_from_rootdir(config: pytest.Config) -> None:
    """Where the command was started outside the suite's root (``clustergate run`` of an installed suite, from any
    directory), tests are shown as their ids say them, "acceptance/test_world.py", not as a climb from there
    ("../../usr/lib/python3/site-packages/acceptance/test_world.py")."""
    if config.rootpath in (config.invocation_params.dir, *config.invocation_params.dir.parents):
        return
    config.invocation_params = dataclasses.replace(config.invocation_params, dir=config.rootpath)
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        terminal.startpath = config.rootpath


def restore_stdout(config: pytest.Config) -> None:
    real = config.stash.get(REAL_STDOUT, None)
    if real is not None:
        sys.stdout = real  # the terminal reporter already holds the sink


def claim_report_dir(config: pytest.Config, report_dir: str | None) -> None:
    """Rank 0, first thing: hold --report-dir, before any check that can stop the run; its earlier outputs stay
    until the run writes (``prepare_report_dir``): a refused run changes nothing, and says the results.json there
    is not its own (``stale_note``). Nothing is raised here: the other ranks learn of a
    problem in ``prepare_report_dir``, after the same checks, so every rank stops with the same words.
    Without --report-dir the directory is new (reports/<UTC time>/): nothing there can be stale; a listing
    (--collect-only) writes nothing there, so it leaves the directory as it is."""
    if NOT_MOVED in config.stash:
        return
    config.stash[NOT_MOVED] = None
    listing = bool(getattr(config.known_args_namespace, "collectonly", False))
    if report_dir is None or listing or os.environ.get("RANK", "0") != "0" or not Path(report_dir).is_dir():
        return
    path = Path(report_dir)
    lock = reportdir.RunLock(path)
    refusal = lock.acquire()
    if refusal is None:
        config.stash[LOCK] = lock
        config.stash[NOT_MOVED] = (path, None)
    elif lock.holder is None:  # another run's outputs are that run's, not stale
        config.stash[NOT_MOVED] = (path, f"the directory {refusal}")


def stale_note(config: pytest.Config) -> str | None:
    """The line every error must end with while an earlier run's results.json stays in --report-dir."""
    not_moved = config.stash.get(NOT_MOVED, None)
    return reportdir.stale_note(*not_moved) if not_moved else None


def prepare_report_dir(config: pytest.Config, world: World, root: Path) -> Path:
    """Rank 0 names the directory (its clock) and every rank uses that name. Every rank must be able to
    write there; rank 0 then holds it for this run and moves an earlier run's outputs aside."""
    try:
        path = _prepare(config, world, root)
        follow_baseline(config)
        command_note.tell(report_dir=path)
        return path
    except control.ControlLost as exc:  # a rank died during start-up: one clear line, not a traceback
        raise CouldNotRun(f"the run could not start: {exc}") from None


def default_report_dir(root: Path) -> Path:
    """reports/<UTC time>/ under ``root``: new, so nothing there can be stale."""
    return root / "reports" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _prepare(config: pytest.Config, world: World, root: Path) -> Path:
    chosen = config.getoption("report_dir")
    if chosen is None and world.is_leader:
        chosen = str(default_report_dir(root))
    chosen = control.broadcast_from_leader(world, chosen, Step(None, "report directory", within(STARTUP_S)))
    # Absolute, from where this rank started: pytest goes back to its start directory as the session ends, and
    # show_tests_from_rootdir makes that the suite's root, so a relative --report-dir would then name another
    # folder and the run's last writes (the verdict, the report) would fail.
    path = Path(chosen).absolute()
    problems = control.all_gather(world, (world.host, reportdir.problem(path)),
                                  Step(None, "report directory check", within(STARTUP_S)))
    bad = [(r, host, why) for r, (host, why) in enumerate(problems) if why]
    if bad:
        r, host, why = bad[0]
        where = f" on rank {r} ({host})" + (f" and {len(bad) - 1} other ranks" if len(bad) > 1 else "") \
            if world.launched else ""
        raise CouldNotRun(f"--report-dir {path}: {why}{where}; choose a directory every rank can write to "
                          "(--report-dir DIR)")
    refusal = hold(config, path) if world.is_leader else None
    refusal = control.broadcast_from_leader(world, refusal, Step(None, "report directory lock", within(STARTUP_S)))
    if refusal:
        raise CouldNotRun(f"--report-dir {path} {refusal}")
    return path


def hold(config: pytest.Config, path: Path) -> str | None:
    """Rank 0 holds ``path`` for this run and moves an earlier run's outputs aside; why not, or None."""
    lock = config.stash.get(LOCK, None) or reportdir.RunLock(path)  # claimed at start-up, where it existed
    refusal = None if lock.held else lock.acquire()
    if refusal is not None:
        return refusal
    config.stash[LOCK] = lock
    if lock.no_flock:
        sys.stderr.write(f"clustergate: flock does not work on the file system of {path} ({lock.no_flock}); "
                         f"this run holds it through {lock.owner_path} instead" +
                         (f", replacing the stale one of {lock.took_over}" if lock.took_over else "") + "\n")
    try:
        move_earlier_outputs(config, path)
    except OSError as exc:  # problem() found the directory writable on every rank: unexpected
        return f"cannot take the earlier run's outputs aside ({exc.strerror or exc})"
    return None


def move_earlier_outputs(config: pytest.Config, path: Path) -> None:
    """No report of an earlier run may be read as this run's (``follow_baseline`` then points a --baseline
    among them at its new place)."""
    moved = reportdir.move_aside(path)
    config.stash[NOT_MOVED] = None
    if not moved:
        return
    config.stash[MOVED] = {**config.stash.get(MOVED, {}), **moved}
    sys.stderr.write(f"clustergate: an earlier run's outputs in {path} were moved to "
                     f"{next(iter(moved.values())).parent}\n")


def follow_baseline(config: pytest.Config) -> None:
    """A --baseline among the moved outputs follows them. Only once the whole command line is parsed:
    the claim may move them before pytest has read --baseline."""
    moved = config.stash.get(MOVED, {})
    baseline = config.getoption("baseline", None)
    if not moved or not baseline:
        return
    source = Path(baseline) / "results.json" if Path(baseline).is_dir() else Path(baseline)
    for old, new in moved.items():
        if source.resolve() == old.resolve():
            config.option.baseline = str(new)
