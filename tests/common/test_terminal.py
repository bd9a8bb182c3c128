"""What reaches a terminal (clustergate.common.terminal): control characters shown as escapes by one rule, an OSError in
words, and a reader that closes the pipe early (``| head``) ends a command's output quietly, with the command's
own exit status: the commands as a user runs them, on real files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fleet_data import merged_docs

from clustergate.common.terminal import error_text, printable, printable_lines
from clustergate.criteria.thresholds import shipped_thresholds

from torchrun_job import ROOT, job_env

ESCAPES = "\x1b]0;owned\x07\x1b[2J\r\u202e"
"""A retitle, a clear screen, a carriage return and a right-to-left override."""


def test_control_characters_are_shown_as_escapes_by_one_rule() -> None:
    assert printable("gpu-node-07 ok") == "gpu-node-07 ok"
    assert printable(f"host{ESCAPES}") == "host\\x1b]0;owned\\x07\\x1b[2J\\r\\u202e"
    assert printable_lines(f"a\tb\nc{ESCAPES}\n") == "a\tb\nc\\x1b]0;owned\\x07\\x1b[2J\\r\\u202e\n"
    assert printable("a\nb") == "a\\nb"  # one line stays one line


def test_an_oserror_is_said_in_words() -> None:
    assert error_text(FileExistsError(17, "File exists", "/dev/null")) == "/dev/null: File exists"
    assert error_text(OSError(18, "Invalid cross-device link", "a", None, "b")) == "a -> b: Invalid cross-device link"
    assert error_text(ValueError("bad value")) == "bad value"


def closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """The command with its stdout a pipe whose reader is gone before anything is printed (``| head -0``)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "clustergate", *args], cwd=ROOT, env=job_env(), stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # a hang guard only
    finally:
        os.close(write)


def test_history_and_list_into_a_closed_pipe_end_quietly_with_their_own_status(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    _, _, base = merged_docs(tmp_path_factory)
    db = tmp_path / "fleet.db"
    recorded = subprocess.run([sys.executable, "-m", "clustergate", "record", "--store", str(db),
                               str(base / "nodes" / "m1"), str(base / "run")], cwd=ROOT, env=job_env(), text=True,
                              capture_output=True, timeout=120)
    assert recorded.returncode == 0, recorded.stderr
    for args in (["history", "--store", str(db)], ["history", "--json", "--store", str(db)],
                 ["list", "--profile", "h100-sxm-80gb"], ["record", "--store", str(db), str(base / "run")]):
        proc = closed_pipe(*args)
        assert (proc.returncode, proc.stderr) == (0, ""), (args, proc.stderr)
    # the command's own status, not one made up for the pipe: a store that cannot be used is still 2, and says so
    proc = closed_pipe("history", "--store", str(tmp_path / "missing.db"))
    assert proc.returncode == 2 and proc.stderr.startswith("clustergate history: ") and "Traceback" not in proc.stderr


def test_text_from_a_file_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    """A thresholds file whose criterion description carries terminal escapes: ``clustergate list`` prints it
    escaped; its JSON stays JSON (json.dumps escapes every control character itself)."""
    data = yaml.safe_load(shipped_thresholds().read_text())
    data["profiles"]["cpu"]["metrics"]["matmul_bf16_tflops"]["description"] = f"dense matmul{ESCAPES}"
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    args = [sys.executable, "-m", "clustergate", "list", "--thresholds", str(tmp_path / "t.yaml"), "--profile", "cpu"]
    proc = subprocess.run(args, cwd=ROOT, env=job_env(), text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout and "\u202e" not in proc.stdout
    assert "dense matmul\\x1b]0;owned\\x07\\x1b[2J\\r\\u202e" in proc.stdout
    listed = subprocess.run([*args, "--json"], cwd=ROOT, env=job_env(), text=True, capture_output=True, timeout=120)
    assert "dense matmul\\u001b]0;owned\\u0007\\u001b[2J\\r\\u202e" in listed.stdout
