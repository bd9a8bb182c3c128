"""``clustergate history`` and ``clustergate record`` (clustergate.store.history_cli, record_cli): the
commands as a user runs them, on real store files and results files."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from complete_runs import without_gpus
from fleet_data import HOST, SERIALS, later, merged_docs, parts, real_run, write

from clustergate.store import Store
from clustergate.store.lock import StoreLock

from torchrun_job import ROOT, job_env

T2 = "2027-04-01T00:00:00+00:00"


def cli(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"clustergate.store.{module}", *args], cwd=ROOT,
                          env=job_env(env), text=True, capture_output=True, timeout=60)


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The store, and two runs of the node as report directories (the second after a GPU swap: GPU 0's card
    now in slot 1 and 1's in 0)."""
    first = write(tmp_path / "reports" / "r1", real_run()).parent
    second = write(tmp_path / "reports" / "r2", later(real_run(), T2, swap_serials=True)).parent
    return tmp_path / "fleet.db", first, second


def test_record_then_history_shows_both_runs(two_runs: tuple[Path, Path, Path]) -> None:
    db, first, second = two_runs
    done = cli("record_cli", "--store", str(db), str(first), str(second / "results.json"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{first / 'results.json'}: recorded as run #1 in {db}",
                                        f"{second / 'results.json'}: recorded as run #2 in {db}"]
    again = cli("record_cli", str(first), env={"CLUSTERGATE_STORE": str(db)})
    assert again.returncode == 0 and again.stdout == f"{first / 'results.json'}: already stored as run #1 in {db}\n"
    shown = cli("history_cli", SERIALS[0], "--metric", "matmul_bf16_tflops", "--store", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[:2] == [f"store: {db}", f"2 figures from 2 runs ({SERIALS[0]} metric matmul_bf16_tflops)"]
    assert lines[2].split() == ["TIME", "RUN", "HOST", "GPU", "SERIAL", "METRIC", "VALUE", "UNIT", "VERDICT"]
    rows = [line.split() for line in lines[3:]]
    # the card followed by its serial: in slot 0 in the first run, in slot 1 after the swap
    assert [(r[1], r[2], r[3], r[4], r[5], r[7], r[8]) for r in rows] == [
        ("#1", HOST, "0", SERIALS[0], "matmul_bf16_tflops", "TFLOPS", "pass"),
        ("#2", HOST, "1", SERIALS[0], "matmul_bf16_tflops", "TFLOPS", "pass")]
    assert rows[0][0] == real_run()["started"] and rows[1][0] == T2


def test_history_as_json(two_runs: tuple[Path, Path, Path]) -> None:
    db, first, second = two_runs
    Store(db).record_file(first / "results.json")
    Store(db).record_file(second / "results.json")
    shown = cli("history_cli", HOST, "--json", env={"CLUSTERGATE_STORE": str(db)})
    data = json.loads(shown.stdout)
    assert data["store"] == str(db) and data["query"] == {"who": HOST, "metric": None}
    assert len(data["figures"]) == 2 * parts(real_run()) and {f["run"] for f in data["figures"]} == {1, 2}
    assert set(data["figures"][0]) == {"time", "run", "path", "run_verdict", "level", "profile", "test", "metric",
                                       "scope", "host", "gpu_index", "serial", "uuid", "value", "unit", "verdict",
                                       "rank"}
    assert data["decisions"] == []


def test_a_cpu_runs_ranks_are_told_apart(tmp_path: Path) -> None:
    """A CPU run has no GPU index: its per-rank figures are named by rank in the GPU column (as metrics.prom's gpu
    label names them), so rank 0's figure is not taken for rank 1's."""
    db = tmp_path / "fleet.db"
    Store(db).record_file(write(tmp_path / "reports" / "r1", without_gpus(real_run())))
    shown = cli("history_cli", HOST, "--metric", "matmul_bf16_tflops", "--store", str(db))
    assert shown.returncode == 0, shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines()[3:]]
    assert [(r[2], r[3], r[4]) for r in rows] == [(HOST, "rank", "0"), (HOST, "rank", "1")], shown.stdout


def test_a_host_history_lists_merge_decisions(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    _, _, base = merged_docs(tmp_path_factory)
    db = tmp_path / "fleet.db"
    assert cli("record_cli", "--store", str(db), str(base / "nodes" / "m3"), str(base / "run")).returncode == 0
    shown = cli("history_cli", "m3", "--store", str(db))
    assert shown.returncode == 0, shown.stderr
    assert "merges and sign-offs:" in shown.stdout
    decided = shown.stdout.split("merges and sign-offs:\n")[1]
    assert "#2  cluster: m3 excluded (node phase): " in decided and "matmul_bf16_tflops" in decided
    assert " m3 " in shown.stdout.splitlines()[3] and "fail" in shown.stdout  # its own failing figure, GPU 3


def test_history_refusals_exit_as_the_table_says(tmp_path: Path) -> None:
    none = cli("history_cli", env={"CLUSTERGATE_STORE": ""})
    assert none.returncode == 2 and none.stderr == ("clustergate history: no store: pass --store PATH or set "
                                                    "CLUSTERGATE_STORE\n")
    text = tmp_path / "x.db"
    text.write_text("not a database\n")
    bad = cli("history_cli", "--store", str(text))
    assert bad.returncode == 2 and bad.stderr.startswith(f"clustergate history: {text}: not a clustergate store")
    assert "Traceback" not in bad.stderr
    empty = cli("history_cli", "nobody", "--store", str(tmp_path / "missing.db"))
    assert empty.returncode == 2 and "no store there" in empty.stderr
    db = tmp_path / "fleet.db"
    Store(db).record(real_run())
    assert cli("history_cli", "nobody", "--store", str(db)).stdout.endswith("no figures recorded for nobody\n")
    StoreLock(db, 1).path.write_text(f"pid 1 on other-{socket.gethostname()} boot b pidns p since 2026-01-01\n")
    # held from another host past the wait: the store could not be read (4), and the holder is named
    busy = cli("history_cli", "--store", str(db), "--wait", "0.3")
    assert busy.returncode == 4 and "another process held the store for 0.3 s (pid 1 on other-" in busy.stderr


@pytest.mark.parametrize(("table", "column", "bad"), [
    ("figures", "value", "fast"),  # a text where a number belongs (SQLite keeps it: the column is REAL, not STRICT)
    ("figures", "gpu_index", "zero"),
    ("decisions", "reasons", "not json"),
])
def test_history_of_a_store_with_a_bad_value_is_one_line_and_exit_2(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, table: str, column: str, bad: str) -> None:
    """A store changed by another program or by hand: one line naming the store, the row and the value, exit 2
    (a store that cannot be used), never a traceback."""
    _, _, base = merged_docs(tmp_path_factory)
    db = tmp_path / "fleet.db"
    assert cli("record_cli", "--store", str(db), str(base / "nodes" / "m3"), str(base / "run")).returncode == 0
    with sqlite3.connect(db) as conn:
        first_of_m3 = f"SELECT min(rowid) FROM {table} WHERE host = 'm3'"
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ({first_of_m3})", (bad,))
    shown = cli("history_cli", "m3", "--store", str(db))
    assert shown.returncode == 2, shown.stdout + shown.stderr
    [line] = shown.stderr.splitlines()
    assert line.startswith(f"clustergate history: {db}: run #") and f"holds {bad!r} as its {column}" in line, line
    assert "restore it from a backup" in line and shown.stdout == ""


def test_record_refusals(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    running = write(tmp_path / "running", {**real_run(), "verdict": "running"})
    done = cli("record_cli", "--store", str(db), str(running), str(tmp_path / "nothing.json"), str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"clustergate record: {running}: the run still says 'running' (under way, or killed before it ended); the "
        "store keeps finished runs only",
        f"clustergate record: {tmp_path / 'nothing.json'}: file not found",
        f"clustergate record: {tmp_path}: a directory without results.json or signoff.json: not a report directory"]


def test_record_into_a_damaged_store_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """A store with garbage in pages a new record does not touch once took it ("recorded as run #7", exit 0),
    though every reader refused the file as malformed: the write checks the whole file first."""
    db = tmp_path / "fleet.db"
    store = Store(db)
    for day in range(1, 7):
        store.record(later(real_run(), f"2026-01-0{day}T00:00:00+00:00"))
    data = bytearray(db.read_bytes())
    third = len(data) // 4096 // 3
    data[third * 4096:(third + 3) * 4096] = b"\xff" * 3 * 4096  # three pages of the middle, not the last ones
    db.write_bytes(bytes(data))
    run = write(tmp_path / "reports" / "r9", later(real_run(), T2)).parent
    done = cli("record_cli", "--store", str(db), str(run))
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr == (f"clustergate record: {db}: not a usable clustergate store (SQLite: database disk image is "
                           "malformed); if it was one, it is damaged: restore it from a backup, or choose another "
                           "--store\n"), done.stderr
    assert db.read_bytes() == bytes(data)  # byte for byte as it was
