"""`clustergate render` of a huge results.json is never minutes of silence: the file's size and the cap a results file
is held to are said at once, then each stage as it starts; a file over the cap is refused at once, naming it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from clustergate import render
from clustergate.common.inputfile import MAX_BYTES, MiB


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:  # no bytes written: the size alone is what is judged before any read
        f.truncate(size)
    return path


def test_a_large_results_file_is_said_at_once_with_its_size_and_the_cap(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    small = _sparse(tmp_path / "small.json", render.LARGE_BYTES)
    render.progress(small)("judging")
    assert capsys.readouterr().err == ""
    large = _sparse(tmp_path / "large.json", 200 * MiB)
    say = render.progress(large)
    first = capsys.readouterr().err
    assert first == f"clustergate render: {large} is 200 MiB (at most {MAX_BYTES['results'] // MiB} MiB are read); " \
                    "reading it\n"
    say("read and checked against the schema; judging its verdict again")
    assert capsys.readouterr().err.startswith("clustergate render: read and checked against the schema; judging")


def test_a_results_file_over_the_cap_is_refused_at_once_naming_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    huge = _sparse(tmp_path / "results.json", MAX_BYTES["results"] + 1)
    t0 = time.monotonic()
    assert render.main([str(huge), "-o", str(tmp_path / "out.html")]) == 2
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert f"more than the {MAX_BYTES['results'] // MiB} MiB a results file may be: it is refused" in err
    assert f"{MAX_BYTES['results'] + 1} bytes, more than a results file can be" in err
    assert not (tmp_path / "out.html").exists() and os.path.getsize(huge) == MAX_BYTES["results"] + 1
