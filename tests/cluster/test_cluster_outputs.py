"""The cluster commands never destroy or write through: merge, signoff, calibrate and the re-render.

Each writes like the run does (whole files through a private temporary file renamed into place, never
through a planted link), refuses an output that is or holds one of its inputs, and keeps every earlier
decision: an earlier merge's or sign-off's outputs move to earlier/<UTC time>/ before anything is written
(a refused one changes nothing: tests/cluster/test_cluster_refusals.py), so a merge or sign-off that rejects
leaves no earlier accepted host list behind as its own, and an earlier accepted sign-off is never replaced.
A reader that closes the pipe early cuts the output short, and nothing more.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_runs import fabric_results, node_results, write_fabric, write_node

from torchrun_job import ROOT, clustergate_args, job_env


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # A hang guard only: each command reads a few files and draws one page.
    return subprocess.run(clustergate_args(*args), cwd=ROOT, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)


def _run(tmp_path: Path, hosts: tuple[str, ...] = ("gpu1", "gpu2")) -> Path:
    run = tmp_path / "run-1"
    for i, host in enumerate(hosts):
        write_node(run / "nodes", host, node_results(host, i + 1))
    return run


def _merge(run: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("merge", *sorted(str(p) for p in (run / "nodes").iterdir()), "-o", str(run), *extra)


def test_the_rerender_never_writes_over_its_input(tmp_path: Path) -> None:
    results = write_node(tmp_path / "run" / "nodes", "gpu1", node_results("gpu1", 1)) / "results.json"
    before = results.read_bytes()
    for args in (["-o", str(results)], ["--json-out", str(results)], ["--baseline", str(results), "-o", str(results)],
                 ["-o", str(results.parent / "x.html"), "--json-out", str(results.parent / "x.html")]):
        proc = cli(str(results), *args)
        assert proc.returncode == 2 and len(proc.stdout.strip().splitlines()) == 1, proc.stdout
        assert "Traceback" not in proc.stdout
    assert results.read_bytes() == before
    link = results.parent / "linked.json"
    link.symlink_to(results)
    proc = cli(str(results), "--json-out", str(link))  # a link to the input is the input
    assert proc.returncode == 2 and "that is an input" in proc.stdout, proc.stdout
    assert results.read_bytes() == before


def test_the_rerender_replaces_a_planted_link_never_writes_through_it(tmp_path: Path) -> None:
    results = write_node(tmp_path / "run" / "nodes", "gpu1", node_results("gpu1", 1)) / "results.json"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "report.html"
    out.symlink_to(victim)
    proc = cli(str(results), "-o", str(out))
    assert proc.returncode == 0, proc.stdout
    assert victim.read_text() == "keep me" and not out.is_symlink() and "<html" in out.read_text()[:300].lower()


def test_a_merge_keeps_the_earlier_merge_and_a_failed_one_leaves_no_accepted_list(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert _merge(run).returncode == 0
    first = (run / "accepted-hosts.txt").read_text()
    proc = cli("merge", str(run / "nodes" / "gpu1"), "-o", str(run), "--expect-hosts", "gpu[1-")  # unusable input
    assert proc.returncode == 2 and len(proc.stdout.strip().splitlines()) == 1, proc.stdout
    assert (run / "accepted-hosts.txt").read_text() == first and not (run / "earlier").exists()  # refused: as it was
    proc = cli("merge", str(run / "nodes" / "gpu1"), "-o", str(run), "--expect-hosts", "gpu[1-2]")  # gpu2 missing
    assert proc.returncode == 1, proc.stdout
    assert not (run / "accepted-hosts.txt").exists() or (run / "accepted-hosts.txt").read_text() == "gpu1\n"
    assert json.loads((run / "results.json").read_text())["verdict"] == "reject"
    [kept] = (run / "earlier").iterdir()
    assert (kept / "accepted-hosts.txt").read_text() == first == "gpu1\ngpu2\n"
    assert json.loads((kept / "results.json").read_text())["verdict"] == "accept"


def test_a_link_planted_among_the_merges_outputs_is_refused(tmp_path: Path) -> None:
    run = _run(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (run / "accepted-hosts.txt").symlink_to(victim)
    proc = _merge(run)
    assert proc.returncode == 2 and "accepted-hosts.txt (a link to" in proc.stdout, proc.stdout
    assert victim.read_text() == "keep me"


def test_an_accepted_signoff_is_kept_and_a_rejecting_one_lists_no_accepted_host(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert _merge(run).returncode == 0
    write_fabric(run, fabric_results(["gpu1", "gpu2"], run.name))
    assert cli("signoff", str(run)).returncode == 0
    accepted = (run / "signoff-accepted-hosts.txt").read_text()
    assert accepted == "gpu1\ngpu2\n"
    write_fabric(run, fabric_results(["gpu1", "gpu2"], "run-other"))  # a fabric run of another run
    proc = cli("signoff", str(run))
    assert proc.returncode == 1, proc.stdout
    assert json.loads((run / "signoff.json").read_text())["verdict"] == "reject"
    assert not (run / "signoff-accepted-hosts.txt").exists() and not (run / "signoff-accepted-hostlist.txt").exists()
    [kept] = (run / "earlier").iterdir()
    assert json.loads((kept / "signoff.json").read_text())["verdict"] == "accept"
    assert (kept / "signoff-accepted-hosts.txt").read_text() == accepted


def test_calibrate_writes_whole_files_and_never_over_an_input(tmp_path: Path) -> None:
    node = write_node(tmp_path / "run" / "nodes", "gpu1", node_results("gpu1", 1)) / "results.json"
    before = node.read_bytes()
    base = ["--extends", "h100-sxm-80gb", "--min-samples", "1"]
    for out in (str(node), str(tmp_path)):
        proc = cli("calibrate", str(node), *base, "-o", out, "--force")
        assert proc.returncode == 2 and len(proc.stdout.strip().splitlines()) == 1, proc.stdout
    assert node.read_bytes() == before
    victim = tmp_path / "victim.yaml"
    victim.write_text("keep me")
    out = tmp_path / "site.yaml"
    out.symlink_to(victim)
    proc = cli("calibrate", str(node), *base, "-o", str(out), "--force")
    assert proc.returncode == 0, proc.stdout
    assert victim.read_text() == "keep me" and not out.is_symlink() and "h100-sxm-80gb-site" in out.read_text()


def test_a_reader_that_closes_the_pipe_early_ends_the_output_quietly(tmp_path: Path) -> None:
    """As a pipeline expects (`| head`): no message and no traceback; the exit status is the merge's own verdict
    (its files are written before it prints)."""
    run = _run(tmp_path, tuple(f"gpu{i}" for i in range(1, 9)))
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command prints anything (as `| head -0`)
    proc = subprocess.run([sys.executable, "-m", "clustergate", "merge",
                           *sorted(str(p) for p in (run / "nodes").iterdir()), "-o", str(run)],
                          cwd=ROOT, env=job_env(), stdout=write, stderr=subprocess.PIPE, text=True, timeout=180)
    os.close(write)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert (run / "accepted-hosts.txt").read_text().count("\n") == 8


@contextlib.contextmanager
def _small_tmpfs(where: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs at ``where``: a disk that fills at merge's first outputs (root only; skipped elsewhere)."""
    where.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(where)], capture_output=True,
                                 text=True, timeout=30)
    except OSError as exc:
        pytest.skip(f"no mount command here ({exc})")
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, timeout=30)


def _limit_file_size() -> None:
    """tests/faults/disk_fills.py's way: no file of this process grows past 2 KiB (a write fails, EFBIG)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.parametrize("disk", ["tmpfs", "file size limit"])
def test_merge_onto_a_full_disk_names_the_file_and_could_not_run(tmp_path: Path, disk: str) -> None:
    """A full disk read "[Errno 28] No space left on device" with no path, and exit 2 (usage): the write names the
    file it could not write, and the status is 4 (could not run), as for every write the machine fails."""
    run = _run(tmp_path)
    nodes = sorted(str(p) for p in (run / "nodes").iterdir())
    with contextlib.ExitStack() as stack:
        if disk == "tmpfs":
            out, said = stack.enter_context(_small_tmpfs(tmp_path / "full")) / "run-1", "No space left on device"
            proc = cli("merge", *nodes, "-o", str(out))
        else:
            out, said = tmp_path / "out", "File too large"
            proc = subprocess.run(clustergate_args("merge", *nodes, "-o", str(out)), cwd=ROOT, env=job_env(), text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180,
                                  preexec_fn=_limit_file_size)
        assert proc.returncode == 4, proc.stdout
        lines = proc.stdout.splitlines()
        assert len(lines) == 1 and re.fullmatch(rf"clustergate merge: {re.escape(str(out))}/[\w.-]+: {said}",
                                                lines[0]), proc.stdout
        assert not [p.name for p in out.glob(".*.tmp")]  # no temporary file left behind
