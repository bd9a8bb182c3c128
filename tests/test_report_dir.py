"""The report directory: checked by writing there, held by one run, and cleared of an earlier run's outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clustergate.reportdir import MIN_FREE_BYTES, RunLock, move_aside, problem


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
    monkeypatch.setattr("clustergate.reportdir.MIN_FREE_BYTES", 2**62)  # more than any disk has
    assert "MiB free there; the outputs need" in problem(tmp_path)
    assert MIN_FREE_BYTES == 64 * 2**20


def test_one_run_holds_the_directory(tmp_path: Path) -> None:
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    assert first.acquire() is None
    held_by = second.acquire()  # a second open file: flock refuses it as it would another process
    assert held_by is not None and held_by.startswith(f"pid {os.getpid()} on ")
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
