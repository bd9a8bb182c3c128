"""The report directory: checked by writing there, held by one run, and cleared of an earlier run's outputs;
no link there is followed (a planted link must not redirect a write); a lock that says what went wrong, and works
without flock (some shared filesystems lack it)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustergate.record.reportdir import LOCK_NAME, MIN_FREE_BYTES, OWNER_NAME, RunLock, move_aside, problem, scrub_file
from clustergate.record.results import write_json
from clustergate.run.progress import Progress

from torchrun_job import ROOT


def test_a_directory_is_made_and_probed(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert problem(target) is None and target.is_dir()
    assert list(target.iterdir()) == []  # the probe file is gone


def test_a_path_under_a_file_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert problem(tmp_path / "file" / "reports").startswith("cannot create it (")


def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o555)
    try:
        if os.access(target, os.W_OK) and os.system(f"chattr +i {target} 2>/dev/null") != 0:
            pytest.skip("root here and chattr +i unavailable: no way to make a read-only directory")
        assert problem(target).startswith("cannot write in it (")
    finally:
        os.system(f"chattr -i {target} 2>/dev/null")
        target.chmod(0o755)


def test_too_little_room_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("clustergate.record.reportdir.MIN_FREE_BYTES", 2**62)  # more than any disk has
    assert "MiB free there; the outputs need" in problem(tmp_path)
    assert MIN_FREE_BYTES == 64 * 2**20


def test_one_run_holds_the_directory(tmp_path: Path) -> None:
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    assert first.acquire() is None
    held_by = second.acquire()  # a second open file: flock refuses it as it would another process
    assert held_by is not None and held_by.startswith(f"is in use by another clustergate run (pid {os.getpid()} on ")
    assert second.holder is not None and second.holder.startswith(f"pid {os.getpid()} on ")
    first.release()
    assert second.acquire() is None  # released (a killed process releases it too: the kernel drops it)
    second.release()


def test_earlier_outputs_move_aside_together(tmp_path: Path) -> None:
    assert move_aside(tmp_path) == {}
    for name in ("results.json", "report.html", "progress.jsonl", "notes.txt"):
        (tmp_path / name).write_text(name)
    moved = move_aside(tmp_path)
    assert {p.name for p in moved} == {"results.json", "report.html", "progress.jsonl"}
    [earlier] = (tmp_path / "earlier").iterdir()
    assert {p.name for p in earlier.iterdir()} == {"results.json", "report.html", "progress.jsonl"}
    assert (tmp_path / "notes.txt").exists()  # not an output: left alone
    (tmp_path / "results.json").write_text("again")
    os.utime(tmp_path / "results.json", (earlier.stat().st_mtime, (earlier / "results.json").stat().st_mtime))
    move_aside(tmp_path)
    assert len(list((tmp_path / "earlier").iterdir())) == 2  # same second: a second folder, nothing overwritten


# ---- no link in the report directory is followed; the lock is the user's alone ------------------------

@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the report directory that a planted link points at."""
    target = tmp_path / "victim.txt"
    target.write_text("not clustergate's\n")
    return target


def test_a_link_planted_as_the_temporary_file_is_never_written_through(tmp_path: Path, victim: Path) -> None:
    report = tmp_path / "report"
    report.mkdir()
    (report / "results.json.tmp").symlink_to(victim)
    write_json(report / "results.json", {"schema": 1, "verdict": "running"})
    assert victim.read_text() == "not clustergate's\n"
    assert json.loads((report / "results.json").read_text())["verdict"] == "running"
    assert sorted(p.name for p in report.iterdir()) == ["results.json", "results.json.tmp"]  # no temporary left
    (report / "results.json").unlink()
    (report / "results.json").symlink_to(victim)  # the name itself a link: the link is replaced, not followed
    write_json(report / "results.json", {"schema": 1, "verdict": "reject"})
    assert victim.read_text() == "not clustergate's\n" and not (report / "results.json").is_symlink()


def test_scrubbing_an_output_never_writes_through_a_planted_temporary_link(
        tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SITE_TOKEN", "tok-planted-1234")
    (tmp_path / "junit.xml").write_text("<x>tok-planted-1234</x>")
    (tmp_path / "junit.xml.tmp").symlink_to(victim)
    assert scrub_file(tmp_path / "junit.xml")
    assert victim.read_text() == "not clustergate's\n"
    assert (tmp_path / "junit.xml").read_text() == "<x>[redacted]</x>"


def test_outputs_take_the_umask_and_the_lock_is_always_private(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_json(tmp_path / "private.json", {})
        Progress(tmp_path / "private.jsonl").close()
    finally:
        os.umask(old)
    os.umask(0o022)
    try:
        write_json(tmp_path / "shared.json", {})
        Progress(tmp_path / "shared.jsonl").close()
        lock = RunLock(tmp_path)
        assert lock.acquire() is None
    finally:
        os.umask(old)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert mode == {"private.json": 0o600, "private.jsonl": 0o600, "shared.json": 0o644, "shared.jsonl": 0o644,
                    LOCK_NAME: 0o600}
    lock.release()


def test_progress_refuses_a_link_or_a_file_already_there(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "progress.jsonl").symlink_to(victim)
    with pytest.raises(OSError, match=r"progress.jsonl is a symbolic link \(to .*victim.txt\); clustergate "
                                      "writes no output through a link: remove it"):
        Progress(tmp_path / "progress.jsonl")
    assert victim.read_text() == "not clustergate's\n"
    (tmp_path / "progress.jsonl").unlink()
    (tmp_path / "progress.jsonl").write_text("planted\n")
    with pytest.raises(OSError, match="already exists although this run moved the earlier outputs aside"):
        Progress(tmp_path / "progress.jsonl")


@pytest.mark.parametrize("name", ["progress.jsonl", "report.html", "results.json", "earlier", LOCK_NAME])
def test_an_output_name_that_is_a_link_is_refused_and_never_moved(tmp_path: Path, victim: Path, name: str) -> None:
    (tmp_path / name).symlink_to(victim)
    (tmp_path / "junit.xml").write_text("earlier")
    assert problem(tmp_path) == (f"{name} (a link to {victim}) is a symbolic link there; clustergate writes no "
                                 "output through a link (it could overwrite another file): remove the link")
    with pytest.raises(OSError, match="is a symbolic link there"):
        move_aside(tmp_path)
    assert (tmp_path / "junit.xml").exists() and victim.read_text() == "not clustergate's\n"


def test_a_lock_file_that_is_a_link_is_refused(tmp_path: Path, victim: Path) -> None:
    (tmp_path / LOCK_NAME).symlink_to(victim)
    refusal = RunLock(tmp_path).acquire()
    assert refusal is not None and "is a symbolic link; remove it" in refusal
    assert victim.read_text() == "not clustergate's\n"


def as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """Run Python as the unprivileged user nobody (another user, for real)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                           "-c", code], capture_output=True, text=True, timeout=60)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A report directory every user can reach and write in (/tmp/pytest-of-root is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="clustergate-open-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path)


TAKE_A_READ_LOCK = """
import fcntl, os, sys
try:
    fd = os.open(sys.argv[1] if len(sys.argv) > 1 else {path!r}, os.O_RDONLY)
except OSError as exc:
    print("cannot open:", exc.strerror)
    raise SystemExit(0)
fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
print("read lock taken")
"""


def test_another_user_cannot_open_the_lock_so_cannot_block_a_run(open_dir: Path) -> None:
    (open_dir / "readable").write_text("x")
    (open_dir / "readable").chmod(0o644)
    seen = as_nobody(TAKE_A_READ_LOCK.format(path=str(open_dir / "readable")))
    assert seen.stdout.strip() == "read lock taken", seen  # nobody reaches the directory: the test can fail
    lock = RunLock(open_dir)
    assert lock.acquire() is None
    lock.release()  # between two runs, when a read lock would block the next one
    seen = as_nobody(TAKE_A_READ_LOCK.format(path=str(open_dir / LOCK_NAME)))
    assert seen.stdout.strip() == "cannot open: Permission denied", seen
    assert RunLock(open_dir).acquire() is None


def test_a_lock_file_an_older_run_left_readable_is_made_private(open_dir: Path) -> None:
    (open_dir / LOCK_NAME).write_text("")
    (open_dir / LOCK_NAME).chmod(0o644)
    lock = RunLock(open_dir)
    assert lock.acquire() is None
    assert stat.S_IMODE((open_dir / LOCK_NAME).stat().st_mode) == 0o600
    lock.release()
    seen = as_nobody(TAKE_A_READ_LOCK.format(path=str(open_dir / LOCK_NAME)))
    assert seen.stdout.strip() == "cannot open: Permission denied", seen


def test_a_lock_file_another_user_made_is_refused_naming_them(open_dir: Path) -> None:
    made = as_nobody(f"import os; os.close(os.open({str(open_dir / LOCK_NAME)!r}, os.O_CREAT | os.O_RDWR, 0o644))")
    assert made.returncode == 0, made
    refusal = RunLock(open_dir).acquire()
    assert refusal is not None and refusal.startswith(
        f"cannot be held: its lock file {open_dir / LOCK_NAME} belongs to user nobody (uid 65534), not to this user")


# ---- a lock that says what went wrong; a lock file where flock does not work ----------------------------

def failing_flock(code: int):  # noqa: ANN201
    def flock(fd: int, op: int) -> None:
        raise OSError(code, os.strerror(code))
    return flock


def test_a_flock_error_is_not_called_another_run(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, flock=failing_flock(errno.EIO))
    refusal = lock.acquire()
    assert refusal is not None and "in use" not in refusal and lock.holder is None
    assert refusal.startswith(f"cannot be held: flock on its lock file {tmp_path / LOCK_NAME} failed (EIO: "
                              "Input/output error); this is not another run holding it")


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL])
def test_without_flock_a_lock_file_holds_the_directory(tmp_path: Path, code: int) -> None:
    no_flock = failing_flock(code)
    first, second = RunLock(tmp_path, flock=no_flock), RunLock(tmp_path, flock=no_flock)
    assert first.acquire() is None
    assert first.no_flock == f"{errno.errorcode[code]}: {os.strerror(code)}"
    owner = tmp_path / OWNER_NAME
    assert owner.read_text().startswith(f"pid {os.getpid()} on {socket.gethostname()}, started ")
    assert stat.S_IMODE(owner.stat().st_mode) == 0o600
    refusal = second.acquire()
    assert refusal is not None and refusal.startswith(f"is in use by another clustergate run (pid {os.getpid()} on ")
    assert f"held through the lock file {owner}, as flock does not work on this file system" in refusal
    first.release()
    assert not owner.exists()
    assert second.acquire() is None
    second.release()


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_a_lock_file_of_a_process_gone_from_this_host_is_stale(tmp_path: Path) -> None:
    gone = dead_pid()
    (tmp_path / OWNER_NAME).write_text(f"pid {gone} on {socket.gethostname()}, started 2026-01-01T00:00:00+00:00\n")
    lock = RunLock(tmp_path, flock=failing_flock(errno.ENOLCK))
    assert lock.acquire() is None
    assert lock.took_over.startswith(f"pid {gone} on ")
    assert (tmp_path / OWNER_NAME).read_text().startswith(f"pid {os.getpid()} on ")
    assert [p.name for p in tmp_path.iterdir() if "stale" in p.name] == []
    lock.release()


def test_a_lock_file_whose_pid_was_reused_later_is_stale(tmp_path: Path) -> None:
    owner = tmp_path / OWNER_NAME
    owner.write_text(f"pid 1 on {socket.gethostname()}, started 2026-01-01T00:00:00+00:00\n")
    os.utime(owner, (1.0e9, 1.0e9))  # written in 2001: pid 1 of this boot started after it, so is not its writer
    lock = RunLock(tmp_path, flock=failing_flock(errno.ENOLCK))
    assert lock.acquire() is None and lock.took_over.startswith("pid 1 on ")
    lock.release()


def test_a_lock_file_of_another_host_is_not_taken(tmp_path: Path) -> None:
    (tmp_path / OWNER_NAME).write_text("pid 4242 on node-elsewhere-7, started 2026-01-01T00:00:00+00:00\n")
    refusal = RunLock(tmp_path, flock=failing_flock(errno.ENOLCK)).acquire()
    assert refusal is not None and "(pid 4242 on node-elsewhere-7, started" in refusal
    assert f"cannot tell whether it still runs: if it does not, remove {tmp_path / OWNER_NAME}" in refusal


HOLDER = """
import errno, sys, time
from pathlib import Path
from clustergate.record.reportdir import RunLock

def no_flock(fd, op):
    raise OSError(errno.ENOLCK, "No locks available")

lock = RunLock(Path(sys.argv[1]), **({{"flock": no_flock}} if sys.argv[2] == "no-flock" else {{}}))
print(lock.acquire(), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["flock", "no-flock"])
def test_two_processes_contend_and_a_killed_holder_frees_the_directory(tmp_path: Path, how: str) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(), str(tmp_path), how], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "None"  # it holds the directory
        flock = failing_flock(errno.ENOLCK) if how == "no-flock" else fcntl.flock
        refusal = RunLock(tmp_path, flock=flock).acquire()
        assert refusal is not None and refusal.startswith(f"is in use by another clustergate run (pid {holder.pid} on ")
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(tmp_path, flock=flock)
    assert lock.acquire() is None  # killed: the kernel dropped its flock; its lock file names a pid that is gone
    if how == "no-flock":
        assert lock.took_over.startswith(f"pid {holder.pid} on ")
    lock.release()
