"""Every bound of a run and every exit status a rank leaves with: one table, read here and nowhere else.

A deadline is how long one rank waits for something (the others at an exchange, a peer's word, pytest to
unwind) before it ends the run naming what did not come. Each says why it is as long as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from clustergate.common.exit_codes import Exit

if TYPE_CHECKING:
    from clustergate.criteria.thresholds import Profile

# ---- waiting for the other ranks ------------------------------------------------------------------------------
STARTUP_S = 45.0
"""How long a rank waits at a start-up exchange (report directory, identities, collection) for the others.
Every rank has passed torchrun's rendezvous and the process groups' creation before the first, so they
arrive within seconds of each other; a rank this much later than the first to arrive is stuck (its
collection, a conftest, a hook) and is named."""
EXCHANGE_GRACE_S = 60.0
"""A phase's exchange waits until the test's own limit and this much more (the watchdog, at the limit,
says more about where every rank was)."""
BLOCKED_S = 10.0
"""A main thread this long in a collective while a peer has failed the phase and waits at its exchange:
that collective can never complete."""
POISONED_WAIT_S = BLOCKED_S + 5.0
"""A rank whose own collective timed out or lost a peer waits this long at the phase's exchange for the
others: a rank that does not come by then never joined the collective (asleep, stuck in the test)."""
SESSION_END_S = 30.0
"""Every rank reaches the end of the session within seconds of the others (the last test's exchanges
keep them together); one that does not is stuck in its session finish and is named."""
LEAVING_S = 20.0
"""A rank that leaves early waits this long for the others at the end, then goes: they may be blocked
in a collective that needs it, and torchrun stops them once it has gone."""
REPORT_S = 45.0
"""Rank 0's time from the verdict to the final barrier: report.html with its figures, junit.xml and other
plugins' session finish. Past it rank 0's watchdog ends the run, naming rank 0."""
FINAL_S = 30.0
"""How long rank 0, its outputs written, waits at the final barrier for the others (they have nothing to
write, so they are there already; one that is not is stuck after the verdict and is named)."""
STORE_WAIT_S = 20.0
"""How long rank 0 waits for the results store (--store) while the other ranks wait for it: reading the first
accepted figures as the session starts (they wait at the collection exchange, STARTUP_S) and recording a run that
is not accepted before the final barrier (inside REPORT_S). A write takes milliseconds; a store held longer by
other writers costs this run its drift judgement or its record (said, and recorded later with clustergate
record), never the run. An accepted run is recorded after the final barrier, where nobody waits for it, within
the store's own wait (clustergate.store.db.TIMEOUT_S)."""
CONTROL_MARGIN_S = 120.0
"""The control group's own timeout is the test limit and this much more: it waits for the slowest rank of a
test, so it must outlast the test limit (every exchange has a shorter deadline of its own)."""

# ---- signals and the ranks' word ------------------------------------------------------------------------------
SIGNAL_GRACE_S = 2.0
"""How long a rank that saw a peer go (or got SIGTERM) waits for every peer's word in the store before it
names the cause: torchrun signals every rank at once, and each says so within milliseconds; a rank that
says nothing by then died without a word (kill -9, a crash, a hard exit)."""
SIGNAL_SKEW_S = 1.0
"""torchrun forwards a signal to every rank within milliseconds. A peer's signal this much earlier than a rank's
own reached that peer alone (a kill of one rank): torchrun signalled the rank once that peer had gone, and the
peer's signal is the cause."""
STOP_GRACE_S = SIGNAL_GRACE_S + 3.0
"""A stuck rank that another rank of its node stops (SIGCONT, SIGTERM) gets this long to record its ending and go
(its signal watcher waits SIGNAL_GRACE_S for the others' word) before that rank kills it."""
CHILDREN_GRACE_S = 2.0
"""A process a test left running (``clustergate.run.children``) gets this long after SIGTERM, at the run's end, to
go by itself before it is killed: a process that cleans up on SIGTERM does so in milliseconds."""
SIGINT_GRACE_S = 20.0
"""After SIGINT pytest unwinds and writes what it can; a main thread blocked in C++ cannot, and the
process ends after this (torchrun's SIGKILL follows its SIGINT after 30 s)."""
POLL_S = 5.0
"""The watchdog looks this often, while a test runs, for a collective that can never complete."""
AGENT_STOP_S = 30.0
"""A run that ends not accepted or refused is told to torchrun by its node's first rank
(clustergate.run.launch.errorfile); each other rank of the node waits this long for torchrun's SIGTERM, which comes
within a second of that rank's exit (torchrun polls its ranks every 0.1 s). One still here after this found that
rank stuck, and leaves on its own."""

# ---- progress: a rank that stops making progress (clustergate.run.hang.liveness) ------------------------------------
# Every bound below is independent of the test's limit and the collectives' timeout (300 s and minutes under the
# GPU profiles): a stuck rank ends the run within 60 s of the fault. From the fault: the judge first looks after
# BEAT_S of waiting, sees it after its bound (+ up to BEAT_S, the beat it reads is that old), gathers the evidence
# (EVIDENCE_S), ends; torchrun then stops the rest (a second or two).
BEAT_S = 2.0
"""How often every rank publishes its beat (two small writes to the rendezvous store) and, while it waits in a
collective, reads its peers' beats."""
SILENT_S = 15.0
"""A peer whose beat has not changed for this long while this rank waits for it is frozen (stopped, its process
unable to run, its host gone). A beat thread is held up only by the interpreter's lock held in C (torch's ops
release it) or by a machine too loaded to run it for seconds (2 busy cores in CI); this is 7 missed beats. The
SIGSTOPped rank of a job is named 17-20 s after the fault (sees it at BEAT_S, then this; fault table)."""
NO_PROGRESS_S = 30.0
"""How long a rank waits in a collective of a test for a live peer that has not entered it (stuck in its own code:
a syscall that never returns, a long C++ call) or has not started it on its GPU (a kernel that spins) before it
names that peer. The suite's healthy waits are far shorter. Every run measures its longest (results.json
``liveness``, to a beat): the whole acceptance suite on 2 CPU ranks, quick and standard, had no wait in a collective
of a test that lasted a beat (2 s); waits outside a test are bounded by their own exchange (rank 1 waited 2 s at
the final barrier while rank 0 wrote its report). On a GPU the longest are a host-link turn (0.65 s on 2 H200s;
a rank of a node of 8 waits one turn of one GPU at a time) and one rank's compile while the others wait at their
first collective: the ranks compile at once from the same cache, so the skew is a part of one compile (the whole
model's was 32 s on 2 H200s; quick compiles one block) unless one rank found it cached and another did not. 30 s
is ten times the longest measured, and ends the fault within 60 s (30 + a beat + EVIDENCE_S + the teardown)."""
EVIDENCE_S = BEAT_S + 1.0
"""How long the rank that found a hang waits for every live rank's stack: each gives it at its next beat."""
STOPPED_S = 30.0
"""How long a rank's keeper (clustergate.run.keeper) lets it stay stopped before it continues it: past the time
its peers take to name it (SILENT_S after they first look, + EVIDENCE_S), so the rank ends on their report; a
rank stopped while nobody waited for it then finds itself frozen and says so."""
KEEPER_GRACE_S = 2 * STOP_GRACE_S
"""A rank its keeper continued has this long to record its ending and go (its evidence, EVIDENCE_S; a pending
SIGTERM's grace, SIGNAL_GRACE_S) before the keeper kills it."""
FREEZE_S = 5.0
"""A rank whose own beat thread could not run for this long past its interval (measured between the end of one beat
and the start of the next: the beat's own store calls are not counted) was frozen: stopped and continued, or its
process unable to run. A beat thread waits for nothing but its 2 s sleep and the interpreter's lock, which a running
main thread hands over every 5 ms: every run records its latest beat (results.json ``liveness.longest_late_s``): 0.02
s in a quick run on 2 CPU ranks, 0.2 s in a lone rank's 849 s fine-tune, on a 2-core machine at a load average of
10-23. A measurement that spans a freeze does not count: the test phase it fell in fails, saying when and for how long
(a freeze of SILENT_S or more ends the run)."""

# ---- a hang nobody waits for: a lone rank, the whole group, the launcher ---------------------------------------
# A rank makes progress while its main thread moves: its stack changes (another frame, another instruction), it
# wakes from a wait (a voluntary context switch: a loop that polls), or a collective of its groups is entered,
# started or completed. A rank that waits in a collective for a peer has the judge above; these bounds are for the
# hangs where no rank waits for another that still works: a rank alone, every rank stuck alike, every rank waiting
# in an operation none of them will complete, and the agent itself.
STILL_S = NO_PROGRESS_S
"""How long every live rank (a lone rank: itself) must have made no progress, in a test and outside any control
exchange or bounded work of its own (``workloads.common.working_alone``), before the lowest of them ends the run
naming them: the same bound as a peer that does not enter a collective, for the same reasons (far above the suite's
healthy waits, and it ends the fault within 60 s). A rank waiting in a collective is given COLLECTIVE_SLACK times what
its bytes (torch's flight recorder says them) take at the profile's bandwidth on top; a point-to-point operation,
whose size gloo does not record, is given STILL_S."""
COLLECTIVE_SLACK = 4.0
"""A collective every rank started and none completed is hung, not slow, once it has taken this many times what its
bytes (both directions: twice its input) take at the profile's slowest collective bandwidth criterion, on top of
STILL_S: the criterion is the least bandwidth a node may show and pass, so this is a quarter of the slowest
bandwidth that fails (4 GiB on the H100 profile's 35 GB/s alltoall floor: 0.98 s more)."""
DEFAULT_BANDWIDTH_GBPS = 1.0
"""The bandwidth a profile with no collective bandwidth criterion is given for COLLECTIVE_SLACK (GB/s): gloo on
loopback TCP, the slowest transport the suite runs."""
STORE_CALL_S = 10.0
"""How long a call to the rendezvous store (a beat, a rank's word) may go unanswered: torchrun's agent serves it in
a thread of its own within milliseconds, so past this the agent is stopped or gone. torch's store client has no
timeout of its own for a server that stops answering (its check, get and add wait as long as it is stopped): each
call runs in a thread of its own and is given up on after this. The store is then lost for the run: the rank ends,
naming the node whose agent serves it."""
AGENT_STOPPED_S = SILENT_S
"""How long a rank's own launcher (torchrun's agent) may be stopped (SIGSTOP, state T in /proc) before the rank ends
the run: a stopped agent watches nothing (a rank that exits is never reaped, the job never ends) and, where it
serves the rendezvous store, answers nothing; the store then names it within STORE_CALL_S already."""


def slowest_bandwidth_gbps(profile: Profile) -> float:
    """The least bandwidth (GB/s) the profile lets a collective or a transfer between GPUs show and pass: the lowest
    floor of its ``*busbw_gbps`` and ``*_bw_gbps`` criteria (all_reduce to sendrecv, in a node and across nodes);
    DEFAULT_BANDWIDTH_GBPS where it judges none."""
    floors = [floor for name, criterion in profile.metrics.items() if name.endswith(("busbw_gbps", "_bw_gbps"))
              for bound in criterion.bounds if (floor := bound.floor(None)) is not None and floor > 0]
    return min(floors, default=DEFAULT_BANDWIDTH_GBPS)


def waiting_bound_s(nbytes: int, gbps: float) -> float:
    """How long a collective of ``nbytes`` (its input, as torch's flight recorder gives it) may stay started and not
    completed on every rank before it is hung: STILL_S, and COLLECTIVE_SLACK times what twice its bytes take at
    ``gbps``."""
    return STILL_S + COLLECTIVE_SLACK * 2 * max(nbytes, 0) / (gbps * 1e9)


# ---- a test's limit (clustergate.run.testlimit: the one rule) -------------------------------------------------
# A test's limit follows its healthy time, measured per profile, level and job shape (nodes x ranks a node): the
# reference runs the package keeps (clustergate/durations.json) refined by the site's own accepted runs (--store).
# What ends a test stuck on every rank alike (one stuck rank is ended by its peers within 60 s: SILENT_S,
# NO_PROGRESS_S). An explicit limit stands over it: @pytest.mark.time_limit, then --test-timeout, then the profile's
# test_timeout_s; a test without a measured time gets the level's (TEST_LIMIT_S).
LIMIT_MULTIPLE = 3.0
"""A measured test's limit is this multiple of its healthy time (the slowest of its healthy readings), or
LIMIT_FLOOR_S: for what scales with the test's own work and is not in its readings. Between machines of one model
the suite's times spread by under 2x (the whole of quick's tests 18.4-30.0 s on H100s, 12.6-13.0 s on H200s); a host
loaded by other work slows a rank by as much again: this repository's cpu readings, taken on 2 cores shared with
other jobs at a load of 8-17, read 7.1, 7.7 and 25.2 s for the GPT test at quick on 2 ranks, 53.4 and 61.8 s for the
LoRA fine-tune at standard. The slowest of a few runs is the healthy time, so one loaded run among them sets it.
Readings apply only to a job of the shape they were measured on, so a test whose time grows with the node's GPUs
(one host-link turn per GPU, a collective across more ranks) or the job's nodes is measured on that shape, or has no
measured time there."""
LIMIT_FLOOR_S = 60.0
"""No measured limit is shorter: the one-off costs a healthy test can pay that its readings need not show, and that
do not scale with its own time. A compile from an empty cache: the GPT test at quick took 15.3 s on one H100 with
an empty compile cache (most of it compiling) and a few seconds warm; the whole model's compile at standard took
32 s on 2 H200s; on a node of 8 GPUs 8 ranks compile at once on the host's cores. A first collective's
communicator set-up on a node of 8. With LIMIT_MULTIPLE 3, a cost C missing from the readings is covered at every
healthy time t as long as C <= max(LIMIT_FLOOR_S - t, 2 t), at least 40 s (at t = 20 s): above every one-off cost
measured."""
SITE_RUNS = 20
"""The store's refinement reads a test's durations from the site's newest this many accepted runs of the same
profile, level and shape: recent enough to follow the site's nodes, enough to hold a cold-cache run among them."""
SITE_READINGS_TO_SET = 3
"""How many of the site's readings of a test its healthy time needs before the site's own time replaces the
reference's, lower (the site's nodes are faster than the reference machine: the limit tightens, never below
LIMIT_FLOOR_S) or higher. One run alone may have been a fast one (a warm cache, an idle host); fewer readings may
only raise the reference's healthy time (a healthy run slower than the reference must not be cut next time), and
without a reference they set none."""

# ---- defaults of the profile's settings -----------------------------------------------------------------------
TEST_LIMIT_S = {"quick": 120.0, "standard": 600.0, "extended": 1800.0}
"""A test's limit at each level where it has no measured time (no reference readings for its profile, level and
shape, too few of the site's) and neither @pytest.mark.time_limit, --test-timeout nor the profile's test_timeout_s
says: a few times the slowest healthy reading of any test of the level. quick: the whole of its tests took 18.4-30.0
s on one H100 (the GPT test 15.3 s of it with an empty compile cache, most of it compiling) and the whole run 47-61 s
on 4 H200s; 120 s is four times the slowest test could take on 8 GPUs. standard: the whole level took 167 s on 2
H200s with DeepSpeed and 214.7 s on one H100, so no test of it takes longer; 600 s is three times that. extended
holds the sustained matmul for burn_in_s under its own limit (acceptance/test_gpu_compute.py), and the DCGM
diagnostics under theirs; its other tests run up to a few times standard's steps: 1800 s."""
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
"""The workloads' process group timeout where neither --collective-timeout nor the profile's
collective_timeout_s says."""

# ---- exit statuses (clustergate.common.exit_codes: 0 accept, 1 not accepted, 2 usage, 4 could not run; never 3) ----
EXIT_EARLY = Exit.NOT_ACCEPTED
"""A rank that ends the run early, whatever ended it (a peer lost, a test past its time, a signal, a failed write):
the run did not finish, so it is not accepted (what ended it is in results.json)."""


def exit_status(pytest_status: int) -> Exit:
    """pytest's exit status as the table says it: a usage error is 2; all passed is 0 (whether that is an accept,
    the verdict decides); anything else (tests failed, interrupted, pytest's internal error 3, no tests collected
    5) is a run that is not accepted."""
    if pytest_status == pytest.ExitCode.OK:
        return Exit.ACCEPT
    return Exit.USAGE if pytest_status == pytest.ExitCode.USAGE_ERROR else Exit.NOT_ACCEPTED
