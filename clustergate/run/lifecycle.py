"""One acceptance run on one rank: the one owner of its state, from its start to the status every rank agrees.

A run goes through its ``Stage``s in order; the pytest hooks (``clustergate.run.plugin``) move it on and three
threads besides the main one may end it (the watchdog, the signal watcher, the SIGINT timer): every write of
its state, by any of them, takes the run's one lock. results.json says "running" from the session's start;
``decide`` agrees the exit status with every rank and decides the verdict, ``final_barrier`` writes it once every
output is written and every rank has passed the final barrier: only then can the file say "accept".

An early ending is one ``Ending`` value (``clustergate.run.ending``), built by a detector
(``clustergate.run.detectors``) and handed to ``end``, the one way down: it records the ending (results.json on
rank 0, progress.jsonl, the rendezvous store for the other ranks, stderr) and ends the process with the
ending's status; from an ending pytest unwinds from (pytest.exit, KeyboardInterrupt, an internal error) the rank
goes on to the session's end, where every rank agrees the status.
"""

from __future__ import annotations

import hashlib
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

import clustergate
from clustergate.common.exit_codes import Exit
from clustergate.common.files import write_atomic
from clustergate.common.parts import gpu_part
from clustergate.common.places import shown_path
from clustergate.criteria.against_shipped import weakenings
from clustergate.criteria.baseline import DEFAULT_TOLERANCE, compare
from clustergate.criteria.thresholds import Profile
from clustergate.record.judge import Where
from clustergate.record.outcomes import PhaseOutcome, PhaseVerdict, expect, merge
from clustergate.record.reportdir import scrub_file
from clustergate.record.results import RunRecord, nodes_from_identities, signed
from clustergate.record.verdict import missing_tests
from clustergate.report import junit, openmetrics
from clustergate.run import detectors, startclock
from clustergate.run.durations import DurationsError, Healthy, Key, Shape, reference
from clustergate.run.ending import Ending, Kind, first_cause
from clustergate.run.hang.hang_judge import Finding, FindingKind, Position
from clustergate.run.keeper import state as process_state
from clustergate.run.launch import errorfile
from clustergate.run.limits import (
    EXCHANGE_GRACE_S,
    EXIT_EARLY,
    FINAL_S,
    LEAVING_S,
    POISONED_WAIT_S,
    REPORT_S,
    SESSION_END_S,
    SIGINT_GRACE_S,
    SIGNAL_GRACE_S,
    STARTUP_S,
    STORE_WAIT_S,
    exit_status,
    slowest_bandwidth_gbps,
)
from clustergate.run.options import Options
from clustergate.run.outside import Outside
from clustergate.run.plugins import foreign
from clustergate.run.progress import Progress
from clustergate.run.ranks import control
from clustergate.run.ranks.control import Step
from clustergate.run.ranks.world import World
from clustergate.run.store_session import Memory
from clustergate.run.testlimit import TimeLimit, choose
from clustergate.secrets.redact import Scrubber
from clustergate.store.db import TIMEOUT_S as STORE_TIMEOUT_S
from clustergate.trust import attestation
from clustergate.trust.identity import RankIdentity
from clustergate.trust.suitefiles import suite_root

PYTEST_STOPPED = (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR)


class Stage(Enum):
    """Where a run is, in the order it gets there."""

    CONFIGURING = "configuring"
    """Options, thresholds, process groups, the report directory, every rank's identity."""
    STARTING = "starting"
    """The session starts: progress.jsonl and results.json ("running") are made."""
    COLLECTING = "collecting"
    """pytest collects; every rank must collect the same tests."""
    TESTING = "testing"
    """In a test (``Run.test``, ``Run.phase``) or between two."""
    CONCLUDING = "concluding"
    """The session's end: every rank agrees the exit status; the verdict is decided."""
    WRITING = "writing outputs"
    """Rank 0 writes report.html and junit.xml (bounded by REPORT_S)."""
    FINAL_BARRIER = "final barrier"
    """Every output written; every rank waits for the others before rank 0 may write "accept"."""
    ENDED = "ended"
    """The record is final; the process leaves with the agreed status."""


class Run:
    """The run on this rank; the only writer of its state (under ``_lock``)."""

    def __init__(self, world: World, profile: Profile, options: Options, report_dir: Path | None, *,
                 identity: RankIdentity, outside: Outside, baseline: dict[str, Any] | None = None) -> None:
        self.world = world
        self.profile = profile
        self.options = options
        self.level = options.level
        self.report_dir = report_dir
        """Where the outputs go; None under --collect-only (a listing writes none)."""
        self.baseline = baseline
        """The earlier run to compare with (--baseline; rank 0's), compared once the session is over."""
        self.test_timeout_s = options.test_limit_s(profile)
        """The run-wide limit (--test-timeout, the profile's test_timeout_s, else the level's)."""
        self.limits: dict[str, TimeLimit] = {}
        """Each collected test's own limit (``choose_limits``): the watchdog's bound while it runs."""
        self.identity = identity
        self.outside = outside
        self.peers = outside.peers
        self._lock = threading.RLock()
        self.record = RunRecord(profile=profile.name, level=options.level, world_size=world.world_size,
                                sign_off=profile.sign_off, selection=options.selection())
        self.stage = Stage.CONFIGURING
        self.test: str | None = None
        self.phase: str | None = None
        self.ending: Ending | None = None
        """The first ending recorded on this rank (why it leaves the run: told to the others at the end)."""
        self.exiting = False
        """``end`` is under way: the process leaves without tearing anything down."""
        self.poisoned: str | None = None
        self.status: int | None = None
        """The exit status every rank agreed at the end of the session (final once the stage is ENDED)."""
        self.decided: dict[str, Any] | None = None
        """The final record (report.html and the terminal show it); results.json gets it in ``final_barrier``."""
        self.signalled: tuple[str, float] | None = None
        """This rank's own signal, as its ending says it, and when it came (wall clock, as the store's times)."""
        self.written: str | None = None
        """The verdict results.json says (rank 0's last write that succeeded)."""
        self._decided_error: str | None = None
        self._last_write = -1e9
        self._sigints = 0
        self._blocked: tuple[str, str, float] | None = None
        self._phase_since = 0.0
        """When the current test phase began (the run's clock): a freeze after it fails the phase."""
        self._ending_once = threading.Lock()
        gpu = identity.gpu
        self.where = Where(rank=world.rank, host=identity.host, node_rank=world.node_rank,
                           gpu_index=gpu.index if gpu else None, gpu_serial=gpu.serial if gpu else None,
                           gpu_uuid=gpu.uuid if gpu else None)
        """This rank's part, stamped on every metric it records."""
        self.progress = Progress(None)
        """progress.jsonl, opened when the session starts (nothing is written before: a usage error leaves none)."""
        self.version = {"version": clustergate.__version__, "thresholds_digest": profile.run_digest}
        """What this rank runs: compared across ranks at collection (with its suite files), recorded in results.json."""
        # The thresholds file as a page handed on may name it (relative to the suite's root, never absolute), and
        # whether a site key signs the record: the report's identity block shows what judged the run.
        self.record.extra["clustergate"] = {**self.version, "signed": options.key is not None,
                                            "thresholds": shown_path(profile.source, (suite_root(), Path.cwd()))}
        if weaker := weakenings(profile):  # a site profile that asks less than the shipped one, per criterion
            self.record.extra["looser_than_shipped"] = [w.as_json() for w in weaker]
        self.code = attestation.code()
        """This rank's suite files, checked against their reference (clustergate.trust.attestation)."""
        self.plugins_loaded: list[dict[str, Any]] = []
        """Every plugin pytest loaded on this rank (``attest``)."""
        self.record.extra["attestation"] = attestation.section(self.code, [], options.dry_run)
        self.identities: list[dict[str, Any]] = [identity.as_dict()]
        self.node_count = 1
        self.watchdog = outside.watchdog(self.on_time_limit, self.on_poll)
        self.signals: Any = None
        self.liveness: Any = None
        """This rank's beat and the judge of its peers' (``clustergate.run.hang.liveness``), from ``meet`` on."""
        self.memory = Memory.of(options.store, profile) if self.writes else None
        """Rank 0's use of the results store (--store); None without one."""
        self._unwritten_metrics = False

    # ---- views --------------------------------------------------------------------------------------------
    @property
    def who(self) -> str:
        return f"rank {self.world.rank} ({self.world.host})"

    @property
    def results_path(self) -> Path:
        return (self.report_dir or Path()) / "results.json"

    @property
    def writes(self) -> bool:
        """This rank writes the run's outputs: rank 0, unless the run is a listing (--collect-only)."""
        return self.world.is_leader and self.report_dir is not None

    @property
    def started(self) -> bool:
        """The session has started: results.json exists and says "running" at least."""
        return self.stage not in (Stage.CONFIGURING, Stage.STARTING)

    def where_now(self) -> str:
        return f"{self.test} [{self.phase}]" if self.test else "the session"

    @property
    def limit_key(self) -> Key:
        """What the tests' healthy times are measured for: this run's profile, level and shape."""
        return Key(self.profile.name, self.level, Shape.of(self.world.world_size, self.node_count))

    def position(self) -> Position:
        """Where the run is, for its beat (read without the lock: each field is one attribute)."""
        stage = Stage.ENDED if self.exiting else self.stage
        return Position(stage.value, self.test, self.phase)

    def within(self, seconds: float) -> float:
        """A deadline ``seconds`` from now, on the run's clock."""
        return self.outside.clock() + seconds

    def gpu_label(self) -> str:
        """'gpu N serial S' for failure headers ("" on a CPU rank)."""
        return gpu_label({"index": self.where.gpu_index, "serial": self.where.gpu_serial}) or ""

    # ---- configuring ----------------------------------------------------------------------------------------
    def meet(self, environment: dict[str, Any]) -> None:
        """Every rank's identity on every rank; then the signals are watched, and the rank dies with its launcher."""
        step = Step(None, "identities", self.within(STARTUP_S))
        identities = self.exchange(step, lambda: self.outside.exchange.all_gather(
            self.world, self.identity.as_dict(), step, check=_identity))
        with self._lock:
            self.identities = identities
            self.peers.hosts = [i["host"] for i in identities]
            self.peers.gpus = [gpu_label(i.get("gpu")) for i in identities]
            self.node_count = len({i["node_rank"] for i in identities})
            self.record.nodes = nodes_from_identities(identities)
            self.record.environment = environment
        self.signals = self.outside.signals(self.on_signal)
        if self.world.supervised:  # under torchrun's agent, a lone rank included: nothing runs unwatched
            # A rank dies with its launcher: SIGTERM records why (the watcher), SIGKILL where none watches.
            self.outside.launcher.follow(signal.SIGTERM if self.signals.handles_sigterm else signal.SIGKILL)
            if self.outside.launcher.gone(settle=False):  # the launcher died before that was set
                self.on_signal(signal.SIGTERM)
            store = self.peers.store
            if store is not None:  # the store unanswered: its agent is stopped or gone
                store.on_lost = self.on_store_lost
                self.peers.learn_store_host()
            # Progress is watched from here on, whatever the limits: every rank's beat, and its keeper.
            control = self.world.control.group_name if self.world.control is not None else None
            self.liveness = self.outside.liveness(rank=self.world.rank, host=self.identity.host, store=store,
                                                  position=self.position, on_finding=self.on_finding,
                                                  on_report=self.on_report, control=control,
                                                  world_size=self.world.world_size, node=self.world.node_rank,
                                                  launcher=self.outside.launcher.pid,
                                                  bandwidth_gbps=slowest_bandwidth_gbps(self.profile))
            self.outside.keeper()

    # ---- starting -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """The session starts: results.json exists from now on and says "running"."""
        with self._lock:
            self.stage = Stage.STARTING
        if self.writes:
            path = self.results_path.with_name("progress.jsonl")
            try:
                self.progress = Progress(path)
            except OSError as exc:
                self.end(Ending(f"could not write {path} on {self.who}: {exc}"))
        startclock.mark("session")
        startup = startclock.steps()
        with self._lock:  # the start's breakdown in the record too: every record says what its start cost
            self.record.extra["startup"] = startup
        self._event("session_start", profile=self.profile.name, level=self.level, world_size=self.world.world_size,
                    startup=startup)
        self.write_results()
        if self.memory is not None:
            # Once, before any test: the others wait at the collection exchange meanwhile (STORE_WAIT_S, both reads).
            waited = self.within(STORE_WAIT_S)
            said = self.memory.read(self.profile, self.identities, level=self.level, started=self.record.started,
                                    timeout_s=STORE_WAIT_S)
            if said:
                self.outside.say(f"clustergate: {said}\n")
            with self._lock:
                self.record.extra["drift"] = self.memory.section()
            if self.memory.problem is None:  # a store that could not be read a moment ago is not tried again
                said = self.memory.read_durations(self.limit_key, timeout_s=max(1.0, waited - self.outside.clock()))
                if said:
                    self.outside.say(f"clustergate: {said}\n")
        with self._lock:
            self.stage = Stage.COLLECTING

    def write_results(self, at_most_every_s: float = 0.0) -> None:
        """Rank 0 rewrites results.json; ``at_most_every_s`` bounds the cost when tests are short.
        A write that fails (a full disk) ends the run: a record that cannot be kept is no record."""
        if not self.writes:
            return
        with self._lock:
            now = self.outside.clock()
            if now - self._last_write < at_most_every_s:
                return
            try:
                self._write(self.record.as_json())
            except (OSError, ValueError) as exc:
                self.end(Ending(f"could not write {self.results_path} on {self.who}: {exc}; the run stops "
                                "(free space under --report-dir, or choose another)"))
            self._last_write = now

    def _write(self, data: dict[str, Any]) -> None:
        if self.options.key is not None:  # with a site key, every write is signed (clustergate.trust.keyed)
            data = signed(data, self.options.key, self.identity.host)
        self.outside.write(self.results_path, data)
        self.written = data["verdict"]
        self._write_metrics(data)

    def _write_metrics(self, data: dict[str, Any]) -> None:
        """metrics.prom beside results.json, from the same record; one that cannot be written is said once and
        never stops the run (results.json is the record)."""
        path = self.results_path.with_name("metrics.prom")
        try:
            write_atomic(path, openmetrics.render(data))
        except (OSError, ValueError) as exc:
            if not self._unwritten_metrics:
                self._unwritten_metrics = True
                self.outside.say(f"clustergate: {self.who}: could not write {path}: {exc}\n")

    def _event(self, event: str, **fields: Any) -> None:
        try:
            self.progress.event(event, **fields)
        except OSError as exc:
            self.end(Ending(f"could not write {self.progress.path} on {self.who}: {exc}; the run stops"))

    # ---- collecting -----------------------------------------------------------------------------------------
    def fail(self, error: str) -> None:
        """A run-level failure (a usage error, a file that cannot be collected), unless an earlier one explains it."""
        with self._lock:
            self.record.fail(error)

    def select(self, **counts: Any) -> None:
        """What the collection selected: results.json's ``selection`` counts."""
        with self._lock:
            self.record.selection.update(counts)

    def add_section(self, name: str, data: Any) -> None:
        """A top-level section of results.json (rank 0's is kept)."""
        if self.world.is_leader:
            with self._lock:
                self.record.extra[name] = data

    def attest(self, loaded: list[dict[str, Any]]) -> None:
        """The plugins pytest loaded on this rank (``clustergate.run.plugins.listed``), into the attestation; the
        other ranks' that are not the suite's join them at the collection exchange (``collected``)."""
        with self._lock:
            self.plugins_loaded = loaded
            self.record.extra["attestation"] = attestation.section(self.code, loaded, self.options.dry_run)

    def _attest_peers(self, foreign: list[list[dict[str, Any]]]) -> None:
        """Every rank's plugins that are not the suite's, in the record beside this rank's (one node's
        PYTEST_ADDOPTS is that run's as much as rank 0's)."""
        seen = {(p["name"], p["file"], p["version"]) for p in self.plugins_loaded}
        added = []
        for entry in (p for theirs in foreign for p in theirs):
            key = (entry["name"], entry["file"], entry["version"])
            if key not in seen:
                seen.add(key)
                added.append(entry)
        if added:
            with self._lock:
                self.record.extra["attestation"] = attestation.section(self.code, [*self.plugins_loaded, *added],
                                                                       self.options.dry_run)

    def collected(self, nodeids: list[str]) -> str | None:
        """None when every rank collected the same tests under the same profile, from the same suite files; else
        why not. Every rank's plugins that are not the suite's are recorded too."""
        digest = hashlib.sha256("\n".join(nodeids).encode()).hexdigest()[:16]
        v = self.version
        mine = [digest, len(nodeids), self.profile.name, v["thresholds_digest"], self.level, v["version"],
                self.code.digest, foreign(self.plugins_loaded)]
        step = Step(None, "collection", self.within(STARTUP_S))
        everyone = self.exchange(step, lambda: self.outside.exchange.all_gather(self.world, mine, step,
                                                                                check=_collection))
        self._attest_peers([theirs[7] for theirs in everyone])
        differing = [r for r, theirs in enumerate(everyone) if theirs[:7] != everyone[0][:7]]
        if not differing:
            return None
        with self._lock:
            if self.record.error is None:  # the caller records the message below as the run's error
                self.record.extra["error_ranks"] = differing
        what = [name for i, name in ((0, "the tests"), (2, "the profile"), (3, "the thresholds"), (4, "the level"),
                                     (5, "the clustergate version"), (6, "the suite's files"))
                if any(everyone[r][i] != everyone[0][i] for r in differing)]
        ranks = ", ".join(map(str, differing))
        lines = [f"ranks disagree about what to run ({', '.join(what)}): ranks {ranks} differ from rank 0; "
                 "refusing to start (every node needs the same checkout of clustergate, thresholds.yaml and tests, "
                 "and the same --profile/--level):"]
        for r in [0, *differing[:8]]:
            d, n, prof, tdig, lvl, ver, code, _ = everyone[r]
            lines.append(f"  rank {r} ({self.identities[r]['host']}): clustergate {ver} (suite {code[:23]}), {n} "
                         f"tests (hash {d}), profile {prof} (thresholds {tdig}), level {lvl}")
        return "\n".join(lines)

    def choose_limits(self, markers: dict[str, float | None]) -> str | None:
        """Each collected test's limit (``markers``: its own @pytest.mark.time_limit at this level, or None), alike on
        every rank: where the run has a store, rank 0's reading of it is shared first. None, or why the limits cannot
        be chosen (the reference file cannot be read)."""
        key = self.limit_key
        try:
            known = reference(key)
        except DurationsError as exc:
            return str(exc)
        site = self.memory.durations if self.memory is not None else {}
        if self.options.store is not None and not self.options.collect_only:
            step = Step(None, "site durations", self.within(STARTUP_S))
            shared = {nodeid: site[nodeid].as_message() for nodeid in markers if nodeid in site}
            site = self.exchange(step, lambda: self.outside.exchange.broadcast_from_leader(
                self.world, shared, step, check=_site_durations))
        option_s, profile_s = self.options.test_timeout_s, self.profile.settings.get("test_timeout_s")
        limits = {nodeid: choose(key=key, marker_s=marker_s, option_s=option_s, profile_s=profile_s,
                                 reference=known.get(nodeid), site=site.get(nodeid))
                  for nodeid, marker_s in markers.items()}
        with self._lock:
            self.limits = limits
            self.record.limits = {nodeid: limit.as_json() for nodeid, limit in limits.items()}
        return None

    def limit_of(self, nodeid: str) -> float:
        """The test's limit in seconds (the run-wide one for a test that was not collected: none is run)."""
        limit = self.limits.get(nodeid)
        return limit.seconds if limit is not None else self.test_timeout_s

    # ---- testing --------------------------------------------------------------------------------------------
    def start_test(self, nodeid: str, limit_s: float) -> None:
        with self._lock:
            self.stage = Stage.TESTING
            self.test, self.phase = nodeid, "setup"
            self._phase_since = self.outside.clock()
        self._event("test_start", nodeid=nodeid)
        self.peers.mark(0, nodeid)
        self.watchdog.arm(nodeid, limit_s)

    def enter(self, phase: str) -> None:
        """The test enters ``phase`` (setup, call, teardown)."""
        with self._lock:
            self.phase = phase
            self._phase_since = self.outside.clock()

    def end_test(self, nodeid: str, aborted: bool = False) -> None:
        """``aborted``: the test was left by an exception that ends the session (pytest.exit,
        KeyboardInterrupt, an internal error): the session's end says where it happened."""
        self.watchdog.disarm()
        with self._lock:
            entry = self.record.tests.get(nodeid)
            outcome = "aborted" if aborted else entry.outcome if entry else "unknown"
        self._event("test_end", nodeid=nodeid, outcome=outcome)
        if aborted:
            with self._lock:
                if entry is None or entry.outcome in ("passed", "skipped"):
                    entry = self.record.test(nodeid)
                    entry.outcome = "interrupted"
                    entry.note(f"interrupted during [{self.phase}] on {self.who}: the test did not finish")
            return
        with self._lock:
            self.test = self.phase = None
        # progress.jsonl already says where a dead run was; results.json follows within a second.
        self.write_results(at_most_every_s=1.0)

    def merge_phase(self, nodeid: str, when: str, mine: PhaseOutcome, declared: tuple[str, ...],
                    duration_s: float) -> PhaseVerdict:
        """Gather this phase from every rank, merge and judge on rank 0, and share the verdict."""
        self.peers.mark(("setup", "call", "teardown").index(when) + 1, nodeid)
        frozen = self.liveness.frozen_since(self._phase_since) if self.liveness is not None else None
        if frozen is not None:  # a measurement that spans a freeze does not count
            said = detectors.frozen_measurement(self, frozen)
            mine = replace(mine, outcome="failed", message=said if not mine.message else f"{said}\n{mine.message}",
                           said=said, records=[])
        limit = self.watchdog.deadline or self.within(self.test_timeout_s)
        step = Step(nodeid, when, limit + EXCHANGE_GRACE_S)
        if mine.poisoned:  # the others cannot be in that collective any more, or never joined it
            step = Step(nodeid, when, min(step.deadline or 0.0, self.within(POISONED_WAIT_S)),
                        note=f"after its collective failed: {mine.said[:200]}")
        if mine.outcome != "passed":
            self.peers.arrived_early(step.tag, mine.outcome, mine.said)
        # Fast path: one small all_reduce says whether any rank has anything to report. Most
        # phases pass everywhere with nothing to judge; only the others pay for a JSON message.
        plain = (mine.outcome == "passed" and not mine.records and not mine.details
                 and not (when == "call" and declared))
        exchange = self.outside.exchange
        if self.exchange(step, lambda: exchange.max_int(self.world, 0 if plain else 1, step)) == 0:
            verdict = PhaseVerdict(outcome="passed", message="", failed_ranks=[])
        else:
            gathered = self.exchange(step, lambda: exchange.gather_to_leader(
                self.world, mine.as_message(), step, check=PhaseOutcome.from_message))
            merged = None
            if gathered is not None:
                judged = merge(gathered, self.profile, when, declared)
                if self.memory is not None and when == "call":
                    judged = self.memory.judge(nodeid, judged, self.record.nodes)
                merged = judged.as_message()
            verdict = self.exchange(step, lambda: exchange.broadcast_from_leader(
                self.world, merged, step, check=PhaseVerdict.from_message))
        with self._lock:
            self.record.test(nodeid).apply(when, verdict, duration_s)
            if self.memory is not None and when == "call":
                self.record.extra["drift"] = self.memory.section()
            if when == "teardown":
                self.phase = "after teardown"  # until the next test starts: "between tests"
            if verdict.poisoned and self.poisoned is None:
                self.poisoned = (f"{nodeid} lost a collective ({when}): the workloads' process group can no "
                                 "longer be trusted, so the run stops here")
                self.record.fail(self.poisoned)
        return verdict

    def blocked_for(self, nodeid: str | None, phase: str | None, call: str | None) -> float | None:
        """Seconds the main thread has been in a collective (``call``) in this test and phase; None when it is not."""
        with self._lock:
            if call is None or nodeid is None or phase is None:
                self._blocked = None
                return None
            if self._blocked is None or self._blocked[:2] != (nodeid, phase):
                self._blocked = (nodeid, phase, self.outside.clock())
                return 0.0
            return self.outside.clock() - self._blocked[2]

    # ---- concluding -----------------------------------------------------------------------------------------
    def decide(self, status: int) -> int:
        """The session is over on this rank (pytest's ``status``): agree the exit status with every rank, as the
        exit-status table says it (``exit_status``), and decide the verdict."""
        self.watchdog.disarm()
        with self._lock:
            self.stage = Stage.CONCLUDING
        if status in PYTEST_STOPPED and self.record.error is None:
            name = pytest.ExitCode(status).name
            self.end(Ending(f"pytest stopped the session with exit status {status} ({name}) on {self.who}",
                            culprits=(self.world.rank,), unwinds=True))
        note = self.ending.cause if self.ending else ""
        step = Step(None, "session end", self.within(LEAVING_S if self.ending else SESSION_END_S), note=note)
        mine = int(exit_status(status))
        everyone = self.exchange(step, lambda: self.outside.exchange.all_gather(
            self.world, [mine, self.record.error], step, check=_session_end))
        status = max(s for s, _ in everyone)
        if self.report_dir is None:  # --collect-only: a listing, with no verdict and no outputs
            with self._lock:
                self.status = status
            return status
        if self.liveness is not None and self.writes:
            self.add_section("liveness", self.liveness.summary(self.world.world_size))
        if self.baseline is not None:
            tolerance = float(self.profile.settings.get("baseline_tolerance", DEFAULT_TOLERANCE))
            self.add_section("baseline", compare(self.record.as_json(), self.baseline, tolerance))
        with self._lock:
            if self.world.is_leader:  # what the tests imported since collection (transformers, peft) is checked too
                said = self.record.extra["attestation"]
                self.record.extra["attestation"] = attestation.section(self.code, said["plugins"],
                                                                       self.options.dry_run)
            for _, error in everyone:
                if error:
                    self.record.fail(error)  # this rank's own error stays first; then by rank
            problem = None if self.record.error else self._incomplete()
            if problem:
                self.record.fail(problem)
            self.record.finished = True
            if status == Exit.ACCEPT and self.record.verdict != "accept":
                status = Exit.NOT_ACCEPTED
            if status != 0 and self.record.verdict == "accept":
                self.record.fail(f"a rank ended with exit status {status}")
            self.status = status
            self.decided = self.record.as_json()
            self._decided_error = self.record.error
        if self.decided["verdict"] != "accept":
            self.write_results()  # final already: nothing later can make it better
        if self.writes:  # rank 0 writes the outputs next: bounded, naming rank 0 if it hangs there
            with self._lock:
                self.stage = Stage.WRITING
            self.watchdog.arm("the end of the session", REPORT_S, on_expiry=self.on_stuck_after_verdict)
        return status

    def _incomplete(self) -> str | None:
        """Why the run did not run every selected test, or None."""
        sel = self.record.selection
        return missing_tests(sel.get("selected"), sel.get("deselected") or 0, len(self.record.tests))

    def final_barrier(self, outputs: list[Path], junit_xml: Path | None = None) -> int:
        """Every output written (rank 0 checks and scrubs them), the final record written, every rank
        agreed: the exit status every rank leaves with. ``junit_xml`` (one of the outputs) is rewritten to say the
        verdict (``stamp_junit``): an accept only once every rank has passed the barrier, as results.json."""
        status = self.status if self.status is not None else EXIT_EARLY
        final: dict[str, Any] | None = None
        stamped = status
        if self.world.is_leader and self.report_dir is not None:
            scrub = Scrubber.from_environment()
            for path in outputs:
                try:
                    if not path.is_file() or path.stat().st_size == 0:
                        raise OSError(f"{path} was not written")
                    scrub_file(path, scrub)
                except OSError as exc:
                    self.fail(f"an output is missing on {self.who}: {exc}")
            if junit_xml is not None and junit_xml.is_file():
                decided = self._final_record()
                held = decided["verdict"] == "accept"
                stamped = status or (Exit.ACCEPT if held else Exit.NOT_ACCEPTED)
                self.stamp_junit(junit_xml, decided, stamped, held=held)
            with self._lock:
                final = self._final_record()
                final_now = final["verdict"] != "accept"
                if final_now:
                    status = status or Exit.NOT_ACCEPTED
                    try:
                        self._write(final)
                    except (OSError, ValueError) as exc:
                        self.outside.say(f"clustergate: {self.who}: could not write {self.results_path}: {exc}\n")
                        status = max(status, EXIT_EARLY)
                        final_now = False
                # An accept waits for the final barrier: until every rank has passed it the file says "running".
            if final_now:
                # Before the barrier: a run that is not accepted ends on every rank right after it.
                self.remember(STORE_WAIT_S)
        if not (self.poisoned or self.exiting):
            with self._lock:
                self.stage = Stage.FINAL_BARRIER
            # Rank 0 is at the barrier: from here it waits for the others, whom the barrier's deadline names.
            self.watchdog.disarm()
            # Rank 0 arrives last (it wrote the outputs); the others wait for it as long as it may take.
            wait = FINAL_S if self.world.is_leader else REPORT_S + FINAL_S
            step = Step(None, "final barrier", self.within(wait))
            status = self.exchange(step, lambda: self.outside.exchange.max_int(self.world, status, step))
        self.watchdog.disarm()
        if self.world.is_leader and final is not None and final["verdict"] == "accept":
            junit_here = junit_xml is not None and junit_xml.is_file()
            if status == 0 and junit_here and not self.stamp_junit(junit_xml, final, 0):
                status = EXIT_EARLY  # junit.xml still holds the accept back: results.json must not say it either
            if status != 0:
                with self._lock:
                    self._fail(f"a rank failed at the very end (exit status {status})", ())
                self._try(self._write_now)
                if junit_here:
                    self.stamp_junit(junit_xml, self.record.as_json(), status)
                self.remember()
            else:
                try:
                    self._write(final)
                except (OSError, ValueError) as exc:
                    what = f"could not write {self.results_path} on {self.who}: {exc}; it does not say accept"
                    self.outside.say(f"clustergate: {self.who}: {what}\n")
                    self.fail(what)
                    status = EXIT_EARLY
                    if junit_here:  # it said accept a moment ago: no longer
                        self.stamp_junit(junit_xml, self.record.as_json(), status)
                else:
                    self.remember()  # every rank has passed the barrier: nobody waits for this
        elif self.world.is_leader and final is not None and junit_xml is not None and junit_xml.is_file() \
                and status != stamped:
            self.stamp_junit(junit_xml, final, status)  # the barrier raised the status (a rank that could not run)
        with self._lock:
            self.status = status
            self.stage = Stage.ENDED
        self._try(lambda: self.progress.event("session_end", verdict=self.record.verdict, exit_status=status))
        self.progress.close()
        return status

    def _final_record(self) -> dict[str, Any]:
        """The decided record (the one report.html shows), unless something failed since."""
        with self._lock:
            unchanged = self.decided is not None and self.record.error == self._decided_error
            return self.decided if unchanged and self.decided is not None else self.record.as_json()

    def stamp_junit(self, path: Path, results: dict[str, Any], status: int, *, held: bool = False) -> bool:
        """junit.xml says ``results``' verdict (``clustergate.report.junit``); False, with the run failed, where it
        cannot: a gate reading it must never see less than the run decided."""
        try:
            junit.stamp(path, results, status, held=held, scrub=Scrubber.from_environment())
        except (OSError, ValueError) as exc:
            self.fail(f"could not write the verdict into {path} on {self.who}: {exc}")
            return False
        return True

    def remember(self, timeout_s: float = STORE_TIMEOUT_S) -> None:
        """Record the final results.json into the results store (--store), saying what became of it; never a
        failure of the run."""
        if self.memory is not None:
            self.outside.say(f"clustergate: {self.memory.record(self.results_path, timeout_s=timeout_s)}\n")

    def final_ending(self) -> Ending:
        """The ending of a run that reached its end: what results.json says, and the status every rank agreed."""
        with self._lock:
            decision = self.record.decision
            return Ending(cause=self.record.error or decision.reason or "", exit_code=int(self.status or 0),
                          culprits=tuple(self.record.extra.get("error_ranks", ())), verdict=decision.verdict)

    # ---- ending -----------------------------------------------------------------------------------------------
    def end(self, ending: Ending, *, stacks: bool = False) -> None:
        """The one way down: record ``ending`` (unless the record is final already), then end the process with its
        exit status. An ending pytest unwinds from (``ending.unwinds``: pytest.exit, KeyboardInterrupt, an internal
        error, the first SIGINT) is recorded and the rank goes on to the session's end, where every rank agrees the
        status. ``stacks``: every thread's stack to stderr first (a test past its limit)."""
        if ending.unwinds:
            self._record(ending)
            return
        if not self._ending_once.acquire(blocking=False):
            self.outside.park()
        with self._lock:
            self.exiting = True
            final = self.stage is Stage.ENDED
        if not final:
            self._record(ending)
            # torchrun's own failure summary (plain torchrun) names what ended the run, as its Root Cause: the words
            # said on stderr may have gone into pytest's capture, the rank's error file is torchrun's to show.
            self._try(lambda: errorfile.write(f"clustergate: {self.who}: {ending.cause.splitlines()[0]}"))
        if ending.stuck:  # the record is written: the ranks it names as stuck need not wait for torchrun
            self._try(lambda: self.outside.stop(self.peers.siblings(ending.stuck)))
        if stacks:
            self._try(self.outside.dump_stacks)
        self.outside.exit(ending.exit_code)

    def _record(self, ending: Ending) -> None:
        culprits = tuple(sorted(set(ending.culprits)))
        hang = ending.evidence
        if self.writes and self.liveness is not None:  # a hang another rank found: its report, with later stacks
            hang = self.liveness.report() or hang
        with self._lock:
            if hang is not None and "hang" not in self.record.extra:
                self.record.extra["hang"] = hang
            self._fail(ending.cause, culprits)
            if ending.interrupted and not culprits and self.record.error == ending.cause:
                # No rank caused it (Ctrl-C, a signal from outside, the launcher killed): run again, not a node's fault
                self.record.extra["interrupted"] = True
            if self.test and (ending.interrupted or not ending.unwinds):
                self._mark_test(ending.cause, culprits, ending.interrupted)
            recorded = replace(ending, culprits=culprits, test=self.test,
                               hosts=tuple(self.peers.hosts[r] for r in culprits if 0 <= r < len(self.peers.hosts)))
            first = self.ending is None
            if first:
                self.ending = recorded
        self.peers.departed(ending.cause.splitlines()[0], ending.kind.value, list(culprits), ending.interrupted)
        self.outside.say(f"clustergate: {self.who}: {ending.cause}\n")
        self._try(lambda: self.progress.event("run_error", nodeid=recorded.test, message=ending.cause))
        self._try(self._write_now)
        if first:
            with self._lock:
                self.ending = replace(recorded, verdict=self.written)

    def _fail(self, error: str, culprits: tuple[int, ...]) -> None:
        """The run-level error, with the ranks that caused it, unless an earlier one explains the ending."""
        if self.record.error is None:
            self.record.extra["error_ranks"] = sorted(set(culprits))
        self.record.fail(error)

    def _mark_test(self, message: str, culprits: tuple[int, ...], interrupted: bool) -> None:
        entry = self.record.test(self.test)  # type: ignore[arg-type]
        if entry.outcome not in ("failed", "error", "interrupted"):
            entry.outcome = "interrupted" if interrupted else "failed"
        entry.note(message)
        if culprits and not entry.failed_ranks:
            entry.failed_ranks = sorted(set(culprits))

    def _write_now(self) -> None:
        if self.writes:
            with self._lock:
                self._write(self.record.as_json())

    def _try(self, fn: Callable[[], None]) -> None:
        """Writing the record of an ending must not hide the ending itself."""
        try:
            fn()
        except Exception as exc:
            self.outside.say(f"clustergate: {self.who}: could not record the ending: {exc}\n")

    def blamed(self, observed: Ending, *, grace_s: float = SIGNAL_GRACE_S, vanished: bool = False) -> Ending:
        """``observed`` with its first cause first: this rank waits up to ``grace_s`` for every peer's word in the
        store (``first_cause`` says what the words mean)."""
        me, size = self.world.rank, self.world.world_size
        deadline = self.within(grace_s)
        while True:
            known = self.peers.departures()
            said = {r: d for r, d in (known or {}).items() if r != me}
            silent = [r for r in range(size) if r != me and r not in said] if known is not None else []
            signals = [d for d in said.values() if d.get("kind") == Kind.SIGNAL]
            waiting_for_own = signals and self.signalled is None
            if (not silent and not waiting_for_own) or self.outside.clock() >= deadline:
                break
            self.outside.sleep(0.1)
        described = self.peers.describe(self.test) if vanished and silent else ""
        return first_cause(observed, said=said, silent=silent, own_signal=self.signalled, vanished=vanished,
                           who=self.peers.who, where=self.where_now(), described=described)

    def exchange(self, step: Step, fn: Callable[[], Any]) -> Any:
        """A control exchange: its result, or the run's end naming who was not there and why."""
        self.peers.at(str(step.tag))
        try:
            return fn()
        except control.ControlLost as exc:
            self.end(detectors.exchange_failed(self, step, exc))

    # ---- the detectors' entry points (their threads) ----------------------------------------------------------
    def on_time_limit(self, nodeid: str, limit_s: float) -> None:
        """The watchdog: the test is past its limit."""
        self.end(detectors.time_limit(self, nodeid, limit_s), stacks=True)

    def on_poll(self) -> None:
        """The watchdog, every few seconds while a test runs: a collective that can never complete."""
        ending = detectors.blocked_collective(self)
        if ending is not None:
            self.end(ending)

    def on_finding(self, finding: Finding) -> None:
        """The liveness thread: a rank stopped making progress (a peer this rank waits for, or this rank itself).
        The evidence first (every live rank's stack, the collective, who joined it), then the ending, published for
        every other rank before this one ends the run."""
        liveness = self.liveness
        if finding.kind == FindingKind.LAUNCHER_STOPPED:  # the store may be its agent's: no evidence is asked of anyone
            culprits = self.node_ranks(self.world.node_rank)
            self.end(detectors.agent_lost(self, launcher_stopped_s=finding.waited_s, store_lost=None,
                                          store_host=self.peers.store_host, culprits=culprits))
        if finding.kind == FindingKind.SKIPPED and finding.culprits == (self.world.rank,) and self.test and self.phase:
            early = self.peers.waiting_after_failure(Step(self.test, self.phase).tag)
            if early is not None and early.get("rank") == self.world.rank:
                return  # it failed the phase and said so: the rank blocked in the collective names it, with why
        evidence = liveness.evidence(finding, self.world.world_size, self.peers.beside(finding.culprits))
        observed = detectors.no_progress(self, finding, liveness.describe(finding, self.where_now()), evidence)
        ending = replace(self.blamed(observed, grace_s=0.0), evidence=evidence)
        liveness.publish({**evidence, "cause": ending.cause, "error_ranks": list(ending.culprits)})
        self.end(ending)

    def on_store_lost(self, why: str) -> None:
        """The rendezvous store did not answer (``peers.RendezvousStore``, from whichever thread called it): torchrun's
        agent that serves it is stopped or gone, this rank's own or another node's. Unless the run ends already."""
        with self._lock:
            if self.exiting:
                return
        host = self.peers.store_host
        mine = self.outside.launcher.pid
        stopped = process_state(mine) == "T"
        node = self.world.node_rank if stopped else host.get("node") if host else None
        self.end(detectors.agent_lost(self, launcher_stopped_s=0.0 if stopped else None, store_lost=why,
                                      store_host=host, culprits=self.node_ranks(node)))

    def node_ranks(self, node: int | None) -> tuple[int, ...]:
        """The ranks of node ``node`` (torchrun's GROUP_RANK), from every rank's identity; () for None."""
        return tuple(i["rank"] for i in self.identities if node is not None and i.get("node_rank") == node)

    def on_report(self, report: dict[str, Any]) -> None:
        """The liveness thread: another rank found a hang and ends the run; this rank ends with its words."""
        culprits = tuple(int(r) for r in report.get("error_ranks") or report.get("culprits") or ())
        self.end(Ending(str(report.get("cause") or "another rank found a hang"), culprits=culprits,
                        kind=Kind.CONSEQUENCE, evidence=report))

    def on_stuck_after_verdict(self, label: str, limit_s: float) -> None:
        """The watchdog: rank 0 did not get from the verdict to the final barrier in time."""
        self.end(detectors.stuck_after_verdict(self, limit_s), stacks=True)

    def on_signal(self, signum: int) -> None:
        """The signal watcher, even while the main thread is blocked in a collective."""
        came = self.outside.wall()
        with self._lock:
            ended = self.stage is Stage.ENDED
        if ended:
            # A peer exited first and torchrun is stopping the rest: the record is already final.
            self.end(self.final_ending())
        if signum == signal.SIGTERM:
            gone = self.outside.launcher.gone()
            ending = detectors.sigterm(self, launcher_gone=gone)
            with self._lock:
                self.signalled = (ending.cause, came)
            if gone:  # every rank got it from the kernel; the store went with the launcher
                self.end(ending)
            self.peers.departed(ending.cause, Kind.SIGNAL.value, [], interrupted=True)
            self.end(self.blamed(ending, vanished=True))
        with self._lock:
            self._sigints += 1
            first = self._sigints == 1
        if not first:
            self.end(detectors.second_sigint(self))
        ending = detectors.sigint(self)
        with self._lock:
            self.signalled = (ending.cause, came)
        self.end(ending)
        self.outside.timer(SIGINT_GRACE_S, lambda: self.end(detectors.still_running_after_sigint(self)))


def gpu_label(gpu: dict[str, Any] | None) -> str | None:
    """A rank's GPU as messages name it, from its identity's ``gpu``: 'gpu N serial S'; None without one."""
    if not gpu or gpu.get("index") is None:
        return None
    return gpu_part(gpu["index"], gpu.get("serial"))


# ---- the shapes of the control messages (clustergate.run.ranks.control checks every one it receives) ------------
def _identity(message: Any) -> dict[str, Any]:
    expect(message, dict, "an identity")
    for key, kind in (("rank", int), ("local_rank", int), ("node_rank", int), ("host", str)):
        expect(message.get(key), kind, f"identity.{key}")
    expect(message.get("gpu"), (dict, type(None)), "identity.gpu")
    return message


def _collection(message: Any) -> list[Any]:
    expect(message, list, "a collection summary")
    if len(message) != 8:
        raise ValueError(f"a collection summary has 8 fields, not {len(message)}")
    for i, kind in enumerate((str, int, str, str, str, str, str, list)):
        expect(message[i], kind, f"collection[{i}]")
    for plugin in message[7]:
        expect(plugin, dict, "a plugin")
        for key, kinds in (("name", str), ("version", (str, type(None))), ("file", (str, type(None))),
                           ("suite", bool)):
            expect(plugin.get(key), kinds, f"plugin.{key}")
    return message


def _site_durations(message: Any) -> dict[str, Healthy]:
    expect(message, dict, "the site's durations")
    return {expect(nodeid, str, "a test's node id"): Healthy.from_message(seen) for nodeid, seen in message.items()}


def _session_end(message: Any) -> tuple[int, str | None]:
    expect(message, list, "a session end")
    if len(message) != 2:
        raise ValueError(f"a session end has 2 fields, not {len(message)}")
    return expect(message[0], int, "status"), expect(message[1], (str, type(None)), "error")
