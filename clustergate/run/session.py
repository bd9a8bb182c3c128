"""One acceptance run on one rank: its world, profile, outputs, tests and how it ends.

The hooks in ``clustergate.run.plugin`` call into this object. results.json says "running" from the
session's start; ``conclude`` agrees the exit status with every rank and decides the verdict, and
``seal`` writes it once every output is written and every rank has agreed: only then can the file say
"accept". The early endings (a peer lost or gone elsewhere, a test past its time, a signal, a failed
write) are ``clustergate.run.endings``. Three threads may touch the record: the main one, the watchdog
and the signal watcher; one lock guards it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import clustergate
from clustergate.identity import RankIdentity, environment, rank_identity
from clustergate.judge import Where
from clustergate.outcomes import PhaseOutcome, PhaseVerdict, expect, merge
from clustergate.redact import Scrubber, scrub_file
from clustergate.results import RunRecord, nodes_from_identities, write_json
from clustergate.run import control
from clustergate.run.control import Step, within
from clustergate.run.endings import BLOCKED_S, EXIT_LOST, Endings
from clustergate.run.interrupts import SignalWatcher, die_with_parent
from clustergate.run.peers import Peers
from clustergate.run.progress import Progress
from clustergate.run.watchdog import Watchdog
from clustergate.run.world import World
from clustergate.thresholds import Profile
from clustergate.verdict import missing_tests

STARTUP_S = 45.0
"""How long a rank waits at a start-up exchange (report directory, identities, collection) for the others.
Every rank has passed torchrun's rendezvous and the process groups' creation before the first, so they
arrive within seconds of each other; a rank this much later than the first to arrive is stuck (its
collection, a conftest, a hook) and is named."""
EXCHANGE_GRACE_S = 60.0
"""A phase's exchange waits until the test's own limit and this much more (the watchdog, at the limit,
says more about where every rank was)."""
POISONED_WAIT_S = BLOCKED_S + 5.0
"""A rank whose own collective timed out or lost a peer waits this long at the phase's exchange for the
others: a rank that does not come by then never joined the collective (asleep, stuck in the test)."""
SESSION_END_S = 30.0
"""Every rank reaches the end of the session within seconds of the others (the last test's exchanges
keep them together); one that does not is stuck in its session finish and is named."""
REPORT_S = 45.0
"""Rank 0's time from the verdict to the final barrier: report.html with its figures, junit.xml and other
plugins' session finish. Past it rank 0's watchdog ends the run, naming rank 0."""
FINAL_S = 30.0
"""How long rank 0, its outputs written, waits at the final barrier for the others (they have nothing to
write, so they are there already; one that is not is stuck after the verdict and is named)."""
LEAVING_S = 20.0
"""A rank that leaves early waits this long for the others at the end, then goes: they may be blocked
in a collective that needs it, and torchrun stops them once it has gone."""
PYTEST_STOPPED = (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR)


class ClusterGate(Endings):
    def __init__(self, world: World, profile: Profile, level: str, report_dir: Path,
                 test_timeout_s: float, selection: dict[str, Any]) -> None:
        self.world = world
        self.profile = profile
        self.level = level
        self.report_dir = report_dir
        self.test_timeout_s = test_timeout_s
        self._lock = threading.RLock()
        self.run = RunRecord(profile=profile.name, level=level, world_size=world.world_size,
                             sign_off=profile.sign_off, selection=selection)
        self.current: str | None = None
        self.phase: str | None = None
        self.left: str | None = None
        """Why this rank left the run before its end (told to the other ranks at the end)."""
        self.poisoned: str | None = None
        self.lost = False
        self.status: int | None = None
        """The exit status every rank agreed at the end of the session."""
        self.decided: dict[str, Any] | None = None
        """The final record (report.html and the terminal show it); results.json gets it in ``seal``."""
        self._decided_error: str | None = None
        self.finished_status: int | None = None
        """Set once the final results are written; a later SIGTERM must not overwrite them."""
        self.started = False
        self._last_write = -1e9
        self._interrupted = False
        self._blocked: tuple[str, str, float] | None = None
        self._signalled: str | None = None
        self._parent = os.getppid()
        self._ending = threading.Lock()
        self.identity: RankIdentity = rank_identity(world.rank, world.local_rank, world.node_rank, world.device)
        gpu = self.identity.gpu
        self.where = Where(rank=world.rank, host=self.identity.host, node_rank=world.node_rank,
                           gpu_index=gpu.index if gpu else None, gpu_serial=gpu.serial if gpu else None,
                           gpu_uuid=gpu.uuid if gpu else None)
        """This rank's part, stamped on every metric it records."""
        self.peers = Peers(world)
        self.progress = Progress(None)
        """progress.jsonl, opened when the session starts (nothing is written before: a usage error leaves none)."""
        self.version = {"version": clustergate.__version__, "code_digest": code_digest(),
                        "thresholds_digest": profile.run_digest}
        """What this rank runs: compared across ranks at collection, recorded in results.json."""
        self.run.extra["clustergate"] = dict(self.version)
        step = Step(None, "identities", within(STARTUP_S))
        self.identities: list[dict[str, Any]] = self._exchange(step, lambda: control.all_gather(
            world, self.identity.as_dict(), step, check=_identity))
        self.peers.hosts = [i["host"] for i in self.identities]
        self.node_count = len({i["node_rank"] for i in self.identities})
        self.run.nodes = nodes_from_identities(self.identities)
        self.run.environment = environment()
        self.watchdog = Watchdog(self._on_timeout, on_poll=self._check_blocked)
        self.signals = SignalWatcher(self._on_signal)
        if world.launched:
            # A rank dies with its launcher: SIGTERM records why (the watcher), SIGKILL where none watches.
            die_with_parent(signal.SIGTERM if self.signals.handles_sigterm else signal.SIGKILL)
            if os.getppid() != self._parent:  # the launcher died before that was set
                self._on_signal(signal.SIGTERM)

    # ---- outputs -------------------------------------------------------------------------
    def start(self) -> None:
        """The session starts: results.json exists from now on and says "running"."""
        if self.world.is_leader:
            try:
                self.progress = Progress(self.report_dir / "progress.jsonl")
            except OSError as exc:
                self._die(f"could not write {self.report_dir / 'progress.jsonl'} on {self.who}: {exc}", EXIT_LOST)
        self._event("session_start", profile=self.profile.name, level=self.level, world_size=self.world.world_size)
        self.write_results()
        self.started = True

    def write_results(self, at_most_every_s: float = 0.0) -> None:
        """Rank 0 rewrites results.json; ``at_most_every_s`` bounds the cost when tests are short.
        A write that fails (a full disk) ends the run: a record that cannot be kept is no record."""
        if not self.world.is_leader:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._last_write < at_most_every_s:
                return
            try:
                write_json(self.results_path, self.run.as_json())
            except (OSError, ValueError) as exc:
                self._die(f"could not write {self.results_path} on {self.who}: {exc}; the run stops "
                          "(free space under --report-dir, or choose another)", EXIT_LOST)
            self._last_write = now

    def _event(self, event: str, **fields: Any) -> None:
        try:
            self.progress.event(event, **fields)
        except OSError as exc:
            self._die(f"could not write {self.progress.path} on {self.who}: {exc}; the run stops", EXIT_LOST)

    def gpu_label(self) -> str:
        """'gpu N serial S' for failure headers ("" on a CPU rank)."""
        w = self.where
        if w.gpu_index is None:
            return ""
        return f"gpu {w.gpu_index}" + (f" serial {w.gpu_serial}" if w.gpu_serial else "")

    # ---- per test --------------------------------------------------------------------------
    def start_test(self, nodeid: str, limit_s: float) -> None:
        with self._lock:
            self.current, self.phase = nodeid, "setup"
        self._event("test_start", nodeid=nodeid)
        self.peers.mark(0, nodeid)
        self.watchdog.arm(nodeid, limit_s)

    def end_test(self, nodeid: str, aborted: bool = False) -> None:
        """``aborted``: the test was left by an exception that ends the session (pytest.exit,
        KeyboardInterrupt, an internal error): the session's end says where it happened."""
        self.watchdog.disarm()
        entry = self.run.tests.get(nodeid)
        outcome = "aborted" if aborted else entry.outcome if entry else "unknown"
        self._event("test_end", nodeid=nodeid, outcome=outcome)
        if aborted:
            with self._lock:
                if entry is None or entry.outcome in ("passed", "skipped"):
                    entry = self.run.test(nodeid)
                    entry.outcome = "interrupted"
                    entry.note(f"interrupted during [{self.phase}] on {self.who}: the test did not finish")
            return
        with self._lock:
            self.current = self.phase = None
        # progress.jsonl already says where a dead run was; results.json follows within a second.
        self.write_results(at_most_every_s=1.0)

    def merge_phase(self, nodeid: str, when: str, mine: PhaseOutcome, declared: tuple[str, ...],
                    duration_s: float) -> PhaseVerdict:
        """Gather this phase from every rank, merge and judge on rank 0, and share the verdict."""
        self.peers.mark(("setup", "call", "teardown").index(when) + 1, nodeid)
        limit = self.watchdog.deadline or time.monotonic() + self.test_timeout_s
        step = Step(nodeid, when, limit + EXCHANGE_GRACE_S)
        if mine.poisoned:  # the others cannot be in that collective any more, or never joined it
            first = next((line for line in mine.message.splitlines() if line.startswith("E ")), "")[1:].strip()
            step = Step(nodeid, when, min(step.deadline or 0.0, within(POISONED_WAIT_S)),
                        note=f"after its collective failed: {first[:200]}")
        if mine.outcome != "passed":
            self.peers.arrived_early(step.tag, mine.outcome, mine.message)
        # Fast path: one small all_reduce says whether any rank has anything to report. Most
        # phases pass everywhere with nothing to judge; only the others pay for a JSON message.
        plain = (mine.outcome == "passed" and not mine.records and not mine.details
                 and not (when == "call" and declared))
        if self._exchange(step, lambda: control.max_int(self.world, 0 if plain else 1, step)) == 0:
            verdict = PhaseVerdict(outcome="passed", message="", failed_ranks=[])
        else:
            gathered = self._exchange(step, lambda: control.gather_to_leader(
                self.world, mine.as_message(), step, check=PhaseOutcome.from_message))
            merged = merge(gathered, self.profile, when, declared).as_message() if gathered is not None else None
            verdict = self._exchange(step, lambda: control.broadcast_from_leader(
                self.world, merged, step, check=PhaseVerdict.from_message))
        with self._lock:
            self.run.test(nodeid).apply(when, verdict, duration_s)
            if when == "teardown":
                self.phase = "after teardown"  # until the next test starts: "between tests"
            if verdict.poisoned and self.poisoned is None:
                self.poisoned = (f"{nodeid} lost a collective ({when}): the workloads' process group can no "
                                 "longer be trusted, so the run stops here")
                self.run.fail(self.poisoned)
        return verdict

    def check_collection(self, nodeids: list[str]) -> str | None:
        """None when every rank collected the same tests under the same profile; else why not."""
        digest = hashlib.sha256("\n".join(nodeids).encode()).hexdigest()[:16]
        v = self.version
        mine = [digest, len(nodeids), self.profile.name, v["thresholds_digest"], self.level, v["version"],
                v["code_digest"]]
        step = Step(None, "collection", within(STARTUP_S))
        everyone = self._exchange(step, lambda: control.all_gather(self.world, mine, step, check=_collection))
        differing = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
        if not differing:
            return None
        if self.run.error is None:  # the caller records the message below as the run's error
            self.run.extra["error_ranks"] = differing
        what = [name for i, name in ((0, "the tests"), (2, "the profile"), (3, "the thresholds"), (4, "the level"),
                                     (5, "the clustergate version"), (6, "the clustergate code"))
                if any(everyone[r][i] != everyone[0][i] for r in differing)]
        ranks = ", ".join(map(str, differing))
        lines = [f"ranks disagree about what to run ({', '.join(what)}): ranks {ranks} differ from rank 0; "
                 "refusing to start (every node needs the same checkout of clustergate, thresholds.yaml and tests, "
                 "and the same --profile/--level):"]
        for r in [0, *differing[:8]]:
            d, n, prof, tdig, lvl, ver, code = everyone[r]
            lines.append(f"  rank {r} ({self.identities[r]['host']}): clustergate {ver} (code {code}), {n} tests "
                         f"(hash {d}), profile {prof} (thresholds {tdig}), level {lvl}")
        return "\n".join(lines)

    # ---- endings ---------------------------------------------------------------------------
    def conclude(self, status: int, *, collect_only: bool) -> int:
        """The session is over on this rank: agree the exit status with every rank and decide the verdict."""
        self.watchdog.disarm()
        if status in PYTEST_STOPPED and self.run.error is None:
            name = pytest.ExitCode(status).name
            self.leave(f"pytest stopped the session with exit status {status} ({name}) on {self.who}")
        note = self.left or ""
        step = Step(None, "session end", within(LEAVING_S if self.left else SESSION_END_S), note=note)
        everyone = self._exchange(step, lambda: control.all_gather(self.world, [status, self.run.error], step,
                                                                   check=_ending))
        status = max(s for s, _ in everyone)
        with self._lock:
            for _, error in everyone:
                if error:
                    self.run.fail(error)  # this rank's own error stays first; then by rank
            problem = None if self.run.error else self._incomplete(collect_only)
            if problem:
                self.run.fail(problem)
            self.run.finished = True
            if status == 0 and self.run.verdict != "accept":
                status = 1
            if status != 0 and self.run.verdict == "accept":
                self.run.fail(f"a rank ended with exit status {status}")
            self.status = status
            self.decided = self.run.as_json()
            self._decided_error = self.run.error
        if self.decided["verdict"] != "accept":
            self.write_results()  # final already: nothing later can make it better
        if self.world.is_leader:  # rank 0 writes the outputs next: bounded, naming rank 0 if it hangs there
            self.watchdog.arm("the end of the session", REPORT_S, on_expiry=self._stuck_at_the_end)
        return status

    def _stuck_at_the_end(self, label: str, limit_s: float) -> None:
        self._record_ending(f"{self.who} did not get from the verdict to the final barrier within {limit_s:.0f} s: "
                            "stuck in the end of the session (writing report.html or junit.xml, or another "
                            "plugin's session finish or unconfigure); the run stops", [self.world.rank])

    def _incomplete(self, collect_only: bool) -> str | None:
        """Why the run did not run every selected test, or None."""
        sel = self.run.selection
        selected, deselected, ran = sel.get("selected"), sel.get("deselected") or 0, len(self.run.tests)
        if collect_only:
            return (f"--collect-only: {selected} tests collected, none run; nothing was measured, so nothing "
                    "can be signed off")
        return missing_tests(selected, deselected, ran)

    def seal(self, outputs: list[Path]) -> int:
        """Every output written (rank 0 checks and scrubs them), the final record written, every rank
        agreed: the exit status every rank leaves with."""
        status = self.status if self.status is not None else EXIT_LOST
        final: dict[str, Any] | None = None
        if self.world.is_leader:
            scrub = Scrubber.from_environment()
            for path in outputs:
                try:
                    if not path.is_file() or path.stat().st_size == 0:
                        raise OSError(f"{path} was not written")
                    scrub_file(path, scrub)
                except OSError as exc:
                    with self._lock:
                        self.run.fail(f"an output is missing on {self.who}: {exc}")
            with self._lock:
                # The decided record (the one report.html shows), unless something failed since.
                unchanged = self.decided is not None and self.run.error == self._decided_error
                final = self.decided if unchanged else self.run.as_json()
                if final["verdict"] != "accept":
                    status = status or 1
                    try:
                        write_json(self.results_path, final)
                    except (OSError, ValueError) as exc:
                        self._say(f"could not write {self.results_path}: {exc}")
                        status = max(status, EXIT_LOST)
                # An accept waits for the final barrier: until every rank has passed it the file says "running".
        if not (self.poisoned or self.lost):
            # Rank 0 arrives last (it wrote the outputs); the others wait for it as long as it may take.
            wait = FINAL_S if self.world.is_leader else REPORT_S + FINAL_S
            step = Step(None, "final barrier", within(wait))
            status = self._exchange(step, lambda: control.max_int(self.world, status, step))
        self.watchdog.disarm()
        if self.world.is_leader and final is not None and final["verdict"] == "accept":
            if status != 0:
                with self._lock:
                    self._fail(f"a rank failed at the very end (exit status {status})", [])
                self._try(self._write_now)
            else:
                try:
                    write_json(self.results_path, final)
                except (OSError, ValueError) as exc:
                    self._say(f"could not write {self.results_path}: {exc}; it does not say accept")
                    status = EXIT_LOST
        self.finished_status = status
        self._try(lambda: self.progress.event("session_end", verdict=self.run.verdict, exit_status=status))
        self.progress.close()
        return status

    def abandon(self) -> int:
        """The session ended without deciding its verdict (a crash at its end): record it, never accept."""
        self._record_ending(f"the end of the session did not run on {self.who} (see the error above)")
        return EXIT_LOST


def code_digest() -> str:
    """A digest of the code every rank runs (clustergate and workloads, each file's path and bytes)."""
    root = Path(clustergate.__file__).resolve().parent.parent
    h = hashlib.sha256()
    for package in ("clustergate", "workloads"):
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# ---- the shapes of the control messages (clustergate.run.control checks every one it receives) ------------
def _identity(message: Any) -> dict[str, Any]:
    expect(message, dict, "an identity")
    for key, kind in (("rank", int), ("local_rank", int), ("node_rank", int), ("host", str)):
        expect(message.get(key), kind, f"identity.{key}")
    expect(message.get("gpu"), (dict, type(None)), "identity.gpu")
    return message


def _collection(message: Any) -> list[Any]:
    expect(message, list, "a collection summary")
    if len(message) != 7:
        raise ValueError(f"a collection summary has 7 fields, not {len(message)}")
    for i, kind in enumerate((str, int, str, str, str, str, str)):
        expect(message[i], kind, f"collection[{i}]")
    return message


def _ending(message: Any) -> tuple[int, str | None]:
    expect(message, list, "a session end")
    if len(message) != 2:
        raise ValueError(f"a session end has 2 fields, not {len(message)}")
    return expect(message[0], int, "status"), expect(message[1], (str, type(None)), "error")
