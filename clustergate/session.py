"""One acceptance run on one rank: its world, profile, outputs and the exits it may take.

The hooks in ``clustergate.plugin`` call into this object; it owns every way the run can end
early (a lost peer, a test past its time, SIGTERM from torchrun) so that each one leaves
progress.jsonl and results.json saying what happened, and exits with one known code.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from clustergate import control
from clustergate.identity import RankIdentity, environment, rank_identity
from clustergate.judge import Where
from clustergate.outcomes import PhaseOutcome, PhaseVerdict, merge
from clustergate.progress import Progress
from clustergate.results import RunRecord, nodes_from_identities, write_json
from clustergate.thresholds import Profile
from clustergate.watchdog import EXIT_TIMEOUT, Watchdog
from clustergate.world import World

EXIT_LOST = EXIT_TIMEOUT
"""Exit status of every surviving rank when a peer is lost: the same as a test past its time."""


class ClusterGate:
    def __init__(self, world: World, profile: Profile, level: str, report_dir: Path,
                 test_timeout_s: float) -> None:
        self.world = world
        self.profile = profile
        self.level = level
        self.report_dir = report_dir
        self.test_timeout_s = test_timeout_s
        self.identity: RankIdentity = rank_identity(world.rank, world.local_rank, world.node_rank, world.device)
        gpu = self.identity.gpu
        self.where = Where(rank=world.rank, host=self.identity.host, node_rank=world.node_rank,
                           gpu_index=gpu.index if gpu else None, gpu_serial=gpu.serial if gpu else None,
                           gpu_uuid=gpu.uuid if gpu else None)
        """This rank's part, stamped on every metric it records."""
        self.identities: list[dict[str, Any]] = control.all_gather(world, self.identity.as_dict(), "identities")
        self.node_count = len({i["node_rank"] for i in self.identities})
        self.run = RunRecord(profile=profile.name, level=level, world_size=world.world_size,
                             sign_off=profile.sign_off)
        self.run.nodes = nodes_from_identities(self.identities)
        self.run.environment = environment()
        self.progress = Progress(report_dir / "progress.jsonl" if world.is_leader else None)
        self.current: str | None = None
        self._last_write = -1e9
        self.finished_status: int | None = None
        """Set once the final results are written; a later SIGTERM must not overwrite them."""
        self.poisoned: str | None = None
        self.lost = False
        self.watchdog = Watchdog(self._on_timeout)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.progress.event("session_start", profile=profile.name, level=level, world_size=world.world_size)

    # ---- outputs -------------------------------------------------------------------------
    @property
    def results_path(self) -> Path:
        return self.report_dir / "results.json"

    def write_results(self, at_most_every_s: float = 0.0) -> None:
        """Rank 0 rewrites results.json; ``at_most_every_s`` bounds the cost when tests are short."""
        now = time.monotonic()
        if self.world.is_leader and now - self._last_write >= at_most_every_s:
            write_json(self.results_path, self.run.as_json())
            self._last_write = now

    def gpu_label(self) -> str:
        """'gpu N serial S' for failure headers ("" on a CPU rank)."""
        w = self.where
        if w.gpu_index is None:
            return ""
        return f"gpu {w.gpu_index}" + (f" serial {w.gpu_serial}" if w.gpu_serial else "")

    # ---- per test --------------------------------------------------------------------------
    def start_test(self, nodeid: str, limit_s: float) -> None:
        self.current = nodeid
        self.progress.event("test_start", nodeid=nodeid)
        self._mark("started", nodeid)
        self.watchdog.arm(nodeid, limit_s)

    def end_test(self, nodeid: str) -> None:
        self.watchdog.disarm()
        entry = self.run.tests.get(nodeid)
        self.progress.event("test_end", nodeid=nodeid, outcome=entry.outcome if entry else "unknown")
        self.current = None
        # progress.jsonl already says where a dead run was; results.json follows within a second.
        self.write_results(at_most_every_s=1.0)

    def merge_phase(self, nodeid: str, when: str, mine: PhaseOutcome, declared: tuple[str, ...],
                    duration_s: float) -> PhaseVerdict:
        """Gather this phase from every rank, merge and judge on rank 0, and share the verdict."""
        self._mark(f"finished {when} of", nodeid)
        # Fast path: one small all_reduce says whether any rank has anything to report. Most
        # phases pass everywhere with nothing to judge; only the others pay for pickled objects.
        plain = (mine.outcome == "passed" and not mine.records and not mine.details
                 and not (when == "call" and declared))
        if self._exchange(lambda: control.max_int(self.world, 0 if plain else 1, f"{nodeid} {when}")) == 0:
            verdict = PhaseVerdict(outcome="passed", message="", failed_ranks=[])
        else:
            gathered = self._exchange(lambda: control.gather_to_leader(self.world, mine, f"{nodeid} {when}"))
            verdict = merge(gathered, self.profile, when, declared) if gathered is not None else None
            verdict = self._exchange(lambda: control.broadcast_from_leader(self.world, verdict, f"{nodeid} verdict"))
        self.run.test(nodeid).apply(when, verdict, duration_s)
        if verdict.poisoned and self.poisoned is None:
            self.poisoned = (f"{nodeid} lost a collective ({when}): the workloads' process group can no "
                             "longer be trusted, so the run stops here")
            self.run.error = self.poisoned
        return verdict

    def check_collection(self, nodeids: list[str]) -> str | None:
        """None when every rank collected the same tests under the same profile; else why not."""
        digest = hashlib.sha256("\n".join(nodeids).encode()).hexdigest()[:16]
        mine = (digest, len(nodeids), self.profile.name, self.profile.digest, self.level)
        everyone = self._exchange(lambda: control.all_gather(self.world, mine, "collection"))
        differing = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
        if not differing:
            return None
        lines = ["ranks disagree about what to run; refusing to start (fix the checkout or options "
                 "so every node has the same tests, thresholds.yaml and --profile/--level):"]
        for r in [0, *differing[:8]]:
            d, n, prof, pdig, lvl = everyone[r]
            lines.append(f"  rank {r} ({self.identities[r]['host']}): {n} tests (hash {d}), profile {prof} "
                         f"(thresholds {pdig}), level {lvl}")
        return "\n".join(lines)

    # ---- endings ---------------------------------------------------------------------------
    def exit_status(self, status: int) -> int:
        if status == 0 and self.run.verdict != "accept":
            status = 1
        return self._exchange(lambda: control.max_int(self.world, status, "exit status"))

    def finish(self, status: int) -> None:
        """Write the final record (rank 0); ``final_barrier`` then holds every rank until all is written."""
        self.watchdog.disarm()
        self.progress.event("session_end", verdict=self.run.verdict, exit_status=status)
        self.write_results()
        self.progress.close()
        self.finished_status = status

    def final_barrier(self) -> None:
        """Wait for every rank after every output is written (pytest-html and JUnit write theirs in
        their own sessionfinish): once one rank exits non-zero, torchrun stops the rest."""
        self._exchange(lambda: control.max_int(self.world, 0, "final barrier"))

    def _mark(self, state: str, nodeid: str) -> None:
        """Leave this rank's state in the rendezvous store, so a timed-out rank 0 can say who hung."""
        store = _store()
        if store is not None and self.world.launched:
            # The store is a diagnostic aid; never let it break a run.
            with contextlib.suppress(Exception):
                store.set(f"clustergate/state/{self.world.rank}", f"{state} {nodeid}")

    def _peer_states(self) -> list[str]:
        store = _store()
        if store is None or not self.world.launched:
            return []
        states = []
        for r in range(self.world.world_size):
            try:
                value = store.get(f"clustergate/state/{r}").decode()
            except Exception:
                value = "unknown"
            states.append(f"rank {r} ({self.identities[r]['host']}) last {value}")
        return states

    def _exchange(self, fn: Any) -> Any:
        try:
            return fn()
        except control.ControlLost as exc:
            self._die(f"{exc} during {self.current or 'the session'}; "
                      "torchrun's summary names the first rank that failed", EXIT_LOST)

    def _on_timeout(self, nodeid: str, limit_s: float) -> None:
        states = self._peer_states()
        msg = (f"{nodeid} did not finish within {limit_s:.0f} s on rank {self.world.rank} "
               f"({self.identity.host}); the run stops (raise the limit with --test-timeout "
               "or @pytest.mark.time_limit if the workload is just slow)")
        if states:
            msg += ("\n  each rank's last step (a rank that finished setup but not call is stuck in the test "
                    "body): " + "; ".join(states))
        self._record_ending(msg)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.finished_status is not None:
            # A peer exited first and torchrun is stopping the rest: the record is already final.
            os._exit(self.finished_status)
        self._die(f"terminated by SIGTERM during {self.current or 'the session'} (torchrun stops every rank "
                  "when one fails: its summary names the first failure)", 128 + signal.SIGTERM)

    def _record_ending(self, message: str) -> None:
        self.lost = True
        self.run.error = message
        if self.current:
            entry = self.run.test(self.current)
            entry.outcome = "failed"
            entry.note(message)
        sys.stderr.write(f"clustergate: rank {self.world.rank} ({self.identity.host}): {message}\n")
        try:
            self.progress.event("run_error", nodeid=self.current, message=message)
            self.write_results()
        except Exception as exc:  # writing the record must not hide the original ending
            sys.stderr.write(f"clustergate: could not write results: {exc}\n")

    def _die(self, message: str, status: int) -> None:
        self._record_ending(message)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(status)


def _store() -> Any:
    if not dist.is_initialized():
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None

