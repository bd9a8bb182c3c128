"""The results store (clustergate.store) on real SQLite files: recording, history, first accepted figures,
schema versions, refusals of what is not a store, and many processes recording at once."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fleet_data import GPU_METRICS, HOST, NODE_METRIC, SERIALS, figure, later, merged_docs, parts, real_run, write

from clustergate.record.resultsfile import ResultsFileError
from clustergate.store import Store, StoreBusy, StoreError, store_path
from clustergate.store.lock import StoreLock, holder_line
from clustergate.store.schema import MIGRATIONS, VERSION, Migration

from torchrun_job import ROOT, job_env

T1, T2, T3 = "2027-01-01T00:00:00+00:00", "2027-04-01T00:00:00+00:00", "2027-07-01T00:00:00+00:00"
"""Later than the real run (2026-11-25)."""


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "fleet.db", timeout_s=5)


def test_store_path_prefers_the_option_then_the_environment() -> None:
    env = {"CLUSTERGATE_STORE": "/shared/env.db"}
    assert store_path("/shared/opt.db", env) == Path("/shared/opt.db")
    assert store_path(None, env) == Path("/shared/env.db")
    assert store_path("", env) is None  # --store '' turns the environment's store off
    assert store_path(None, {}) is None and store_path(None, {"CLUSTERGATE_STORE": " "}) is None


def test_recording_is_idempotent_by_content(store: Store, tmp_path: Path) -> None:
    run = real_run()
    first = store.record(run, "run", "a/results.json")
    assert first.new and first.run == 1 and first.kind == "run"
    # the same document again, and the same content in a file written with other indentation
    assert store.record(run) == first.__class__(1, False, "run")
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(run, separators=(",", ":")))
    assert store.record_file(compact).run == 1
    assert store.count() == {"run": 1, "cluster": 0, "signoff": 0}
    assert store.document(1) == run  # kept whole
    assert store.version() == VERSION


def test_history_by_host_serial_uuid_and_metric(store: Store) -> None:
    run = real_run()
    store.record(run)
    store.record(later(run, T2))
    rows = store.history(HOST)
    assert len(rows) == 2 * parts(run)  # two runs: every figure of each (2 GPUs x 2 metrics + the node's, and more)
    assert [r.time for r in rows] == sorted(r.time for r in rows)  # oldest run first
    assert {r.verdict for r in rows if r.metric in (*GPU_METRICS, NODE_METRIC)} == {"pass"}
    assert {r.verdict for r in rows} <= {"pass", "unjudged"} and {r.run_verdict for r in rows} == {"accept"}
    gpu1 = store.history(SERIALS[1])
    assert {(r.run, r.metric) for r in gpu1} >= {(n, m) for n in (1, 2) for m in GPU_METRICS}
    assert len(gpu1) == 2 * parts(run, SERIALS[1])
    assert all(r.serial == SERIALS[1] and r.gpu_index == 1 for r in gpu1)
    assert store.history(gpu1[0].uuid) == gpu1
    node = store.history(HOST, NODE_METRIC)
    assert [(r.scope, r.gpu_index, r.serial) for r in node] == [("node", None, None)] * 2
    assert node[0].value == figure(run, NODE_METRIC)
    assert store.history("no-such-host") == []


def test_a_gpu_moved_to_another_host_keeps_its_history(store: Store) -> None:
    run = real_run()
    store.record(run)
    store.record(later(run, T2, host="gpu-node-12"))
    rows = store.history(SERIALS[0], "matmul_bf16_tflops")
    assert [r.host for r in rows] == [HOST, "gpu-node-12"]


def test_first_accepted_is_the_earliest_accepted_figure(store: Store) -> None:
    run = real_run()
    metric, serial = "matmul_bf16_tflops", SERIALS[0]
    # run 1 rejected (GPU 0's figure below its minimum), run 2 accepted, run 3 accepted and lower
    store.record(later(run, T1, scale={(metric, serial): 1e-4}))
    store.record(later(run, T2))
    store.record(later(run, T3, scale={(metric, serial): 0.5}))
    first = store.first_accepted(serial, metric, level="quick")
    assert first is not None and first.time == T2 and first.run == 2 and first.value == figure(run, metric, serial)
    assert store.first_accepted(serial, metric, level="standard") is None  # another level measures otherwise
    assert store.first_accepted(serial, metric, before=T2) is None  # nothing accepted before run 2 started
    node = store.first_accepted_node(HOST, NODE_METRIC)
    assert node is not None and node.run == 2
    assert store.first_accepted("no-such-serial", metric) is None


def test_refused_documents(store: Store) -> None:
    run = real_run()
    with pytest.raises(StoreError, match="still says 'running'.*finished runs only"):
        store.record({**run, "verdict": "running"}, path="r/results.json")
    with pytest.raises(ResultsFileError, match=r'r/results.json: not a valid results.json.*"tests" is a required'):
        store.record({k: v for k, v in run.items() if k != "tests"}, path="r/results.json")
    with pytest.raises(StoreError, match="recorded as kind 'cluster' but the document is a 'run'"):
        store.record(run, "cluster")
    store.record(run, path="r/results.json")
    rejudged = later(run, run["started"])
    rejudged["environment"]["TORCHELASTIC_RUN_ID"] = run["environment"]["TORCHELASTIC_RUN_ID"]
    rejudged["rejudged"] = {"thresholds": "site.yaml", "profile": "cpu", "original_profile": "cpu",
                            "original_verdict": "accept"}
    with pytest.raises(StoreError, match=r"already holds this run as #1 \(from r/results.json\) with other content"):
        store.record(rejudged, path="r2/results.json")
    assert store.count()["run"] == 1


def test_merges_and_signoffs_record_their_decisions(store: Store, tmp_path_factory: pytest.TempPathFactory) -> None:
    cluster, signoff, _ = merged_docs(tmp_path_factory)
    assert store.record(cluster, "cluster", "run/results.json").kind == "cluster"
    assert store.record(signoff).kind == "signoff"
    assert store.history() == []  # a merge's samples are its node runs' figures: not stored twice
    decided = {(d.kind, d.host): d for d in store.decisions()}
    assert decided["cluster", "m1"].status == "accepted" and decided["cluster", "m1"].reasons == []
    bad = decided["cluster", "m3"]
    assert bad.status == "excluded" and bad.phase == "node" and "matmul_bf16_tflops" in bad.reasons[0]
    assert decided["cluster", "m2"].status == "excluded" and "hbm_bandwidth_tbps" in decided["cluster", "m2"].reasons[0]
    assert decided["signoff", "solo"].status == "accepted"
    assert [d.host for d in store.decisions("m3")] == ["m3"]


# ---- the file: versions, and what is not a store ---------------------------------------------------
def test_a_store_newer_than_the_code_is_refused(store: Store) -> None:
    store.record(real_run())
    with sqlite3.connect(store.path) as conn:
        conn.execute(f"PRAGMA user_version = {VERSION + 3}")
    for call in (lambda: store.history(), lambda: store.record(later(real_run(), T2))):
        with pytest.raises(StoreError, match=rf"{store.path}: the store is at schema version {VERSION + 3}, newer "
                                             rf"than this clustergate knows \(version {VERSION}\)"):
            call()


def test_an_older_store_is_migrated_by_the_next_write(store: Store) -> None:
    store.record(real_run())
    newer = MIGRATIONS + (Migration("a note per run", ("ALTER TABLE runs ADD COLUMN note TEXT",
                                                        "UPDATE runs SET note = 'migrated'")),)
    upgraded = Store(store.path, timeout_s=5, migrations=newer)
    with pytest.raises(StoreError, match=f"schema version {VERSION} and this clustergate reads version {VERSION + 1}"):
        upgraded.history()  # reading never changes the file
    assert upgraded.record(later(real_run(), T2)).run == 2
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSION + 1
        assert conn.execute("SELECT id, note FROM runs ORDER BY id").fetchall() == [(1, "migrated"), (2, None)]
    assert len(upgraded.history(SERIALS[0])) == 2 * parts(real_run(), SERIALS[0])


def test_what_is_not_a_store_is_refused_with_one_error(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE songs (title TEXT)")
    cases = {
        text: "not a clustergate store (not an SQLite database: it starts with b'hello",
        other: "an SQLite database of another program (application_id 0, tables songs)",
        tmp_path: "a directory; --store names the store's file",
        tmp_path / "none.db": "no store there (nothing has been recorded into it)",
        tmp_path / "no-dir" / "x.db": f"its directory {tmp_path / 'no-dir'} does not exist",
    }
    for path, said in cases.items():
        with pytest.raises(StoreError) as caught:
            Store(path).history()
        assert str(caught.value).startswith(f"{path}: ") and said in str(caught.value), caught.value
    with pytest.raises(StoreError, match="another program"):
        Store(other).record(real_run())
    assert other.read_bytes()[:16] == b"SQLite format 3\x00"  # left as it was


def test_a_damaged_store_is_refused_with_one_error(store: Store) -> None:
    for i in range(6):
        store.record(later(real_run(), f"2026-01-0{i + 1}T00:00:00+00:00"))
    data = bytearray(store.path.read_bytes())
    page = 4096
    data[page:len(data)] = b"\xff" * (len(data) - page)  # every page after the header: garbage
    store.path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=rf"{store.path}: not a usable clustergate store \(SQLite: .*\); if it was "
                                         "one, it is damaged: restore it"):
        store.history(SERIALS[0])


# ---- the lock ---------------------------------------------------------------------------------------
def test_a_stale_lock_of_a_dead_process_here_is_taken_over(store: Store) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    line = holder_line().replace(f"pid {os.getpid()} ", f"pid {gone.stdout.strip()} ")
    lock = StoreLock(store.path, 1)
    lock.path.write_text(line)
    time.sleep(0.01)
    with lock:
        assert lock.took_over == line.strip()
    assert not lock.path.exists()
    assert store.record(real_run()).new


def test_a_lock_held_on_another_host_is_refused_naming_it(store: Store) -> None:
    lock = StoreLock(store.path, 1)
    lock.path.write_text(f"pid 4242 on other-{socket.gethostname()} boot x pidns y since 2026-01-01T00:00:00+00:00\n")
    busy = Store(store.path, timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(StoreBusy) as caught:
        busy.record(real_run())
    assert 0.3 <= time.monotonic() - t0 < 5
    said = str(caught.value)
    assert f"pid 4242 on other-{socket.gethostname()} since 2026-01-01T00:00:00+00:00" in said
    assert f"if that process is gone (a host that crashed while recording), remove {lock.path}" in said
    assert lock.path.exists()  # never taken from a holder that cannot be judged from here


def test_a_lock_file_planted_as_a_link_is_not_followed(store: Store, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    StoreLock(store.path, 1).path.symlink_to(victim)
    with pytest.raises(StoreError, match="its lock file .* is a symbolic link; remove it"):
        store.record(real_run())
    assert victim.read_text() == "keep\n"


WRITER = """
import sys
from pathlib import Path
from clustergate.store import Store
store = Store(Path(sys.argv[1]))
for name in sys.argv[2:]:
    store.record_file(Path(name))
"""


def test_many_processes_recording_at_once_lose_nothing(tmp_path: Path) -> None:
    """Six writer processes, eight runs each, all at once, into one store: every run stored once, the
    file intact, every figure there."""
    run = real_run()
    writers, per_writer = 6, 8
    files = [[write(tmp_path / f"w{w}" / f"r{i}", later(run, f"2026-02-{w + 1:02d}T{i:02d}:00:00+00:00"))
              for i in range(per_writer)] for w in range(writers)]
    db = tmp_path / "shared.db"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(db), *map(str, mine)], cwd=ROOT, env=job_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for mine in files]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * writers, outputs
    store = Store(db)
    assert store.count()["run"] == writers * per_writer
    assert len(store.history()) == writers * per_writer * parts(run)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(DISTINCT identity) FROM runs").fetchone()[0] == writers * per_writer
    assert not (tmp_path / "shared.db.lock").exists()
    assert not Path(f"{db}-journal").exists()


def test_a_writer_waits_while_another_holds_the_lock(tmp_path: Path) -> None:
    """The store's own lock, not SQLite's, keeps writers apart: while it is held, another process's record
    does not even open the database; once released, it goes through."""
    db = tmp_path / "held.db"
    source = write(tmp_path / "r", real_run())
    with StoreLock(db, 1):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(source)], cwd=ROOT, env=job_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(1.5)
        assert proc.poll() is None and not db.exists()
    assert proc.communicate(timeout=60)[1] is None and proc.returncode == 0
    assert Store(db).count()["run"] == 1


KILLED_WRITER = """
import os, sqlite3, sys
from clustergate.store.lock import StoreLock
lock = StoreLock(__import__("pathlib").Path(sys.argv[1]), 5)
lock.acquire()
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 1")  # spill every changed page into the file before the commit
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE figures SET value = -1")
conn.execute("DELETE FROM runs")
os._exit(9)  # killed mid-transaction: the lock file, a hot journal and half-written pages stay behind
"""


def test_a_writer_killed_mid_transaction_leaves_nothing_half_done(store: Store) -> None:
    run = real_run()
    store.record(run)
    store.record(later(run, T2))
    before = store.history()
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(store.path)], cwd=ROOT, env=job_env(),
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == 9, killed.stderr
    assert Path(f"{store.path}-journal").exists() and StoreLock(store.path, 1).path.exists()
    assert store.history() == before  # the stale lock taken over, the journal rolled back
    assert store.record(later(run, T3)).run == 3
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
