"""Writers never replace what is not theirs: every command that writes a named file refuses a name that exists as
a FIFO, a character device, a socket or a directory, with one line naming it and exit status 2, and leaves it as
it was (the same kind of file, the same device numbers), as root too.

The devices are real: made with ``mknod`` in a temporary folder (a character device with /dev/null's numbers),
where this user may make one; elsewhere those cases skip, saying why.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_runs import fabric_results, node_results, write_fabric, write_node
from health_node import GpuNode

from clustergate.common import files
from clustergate.record import reportdir

from torchrun_job import ROOT, job_env

NULL_DEVICE = os.makedev(1, 3)  # /dev/null's numbers: writing to it would lose everything, as intended by no one


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # A hang guard only: each refusal comes before the command reads or draws anything heavy.
    return subprocess.run([sys.executable, "-m", "clustergate", *args], cwd=ROOT, env=job_env(), text=True,
                          capture_output=True, timeout=180)


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def device(path: Path) -> Path:
    """A character device made with mknod (skipped where this user may not make one)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, NULL_DEVICE)
    except PermissionError as exc:
        pytest.skip(f"mknod is not permitted here ({exc.strerror}): no character device can be planted")
    return path


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "socket"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        yield path


def kind(path: Path) -> tuple[int, int]:
    """What a name is: its file type and device numbers, read without following it."""
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_rdev


def refused(proc: subprocess.CompletedProcess[str], target: Path, what: str) -> None:
    """Exit 2, one line naming the target and what it is, no traceback, no errno."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert str(target) in line and f"is {what}" in line, line
    assert "[Errno" not in line and "Traceback" not in proc.stderr


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return write_node(tmp_path / "run" / "nodes", "gpu1", node_results("gpu1", 1)) / "results.json"


TARGETS = [("fifo", "a FIFO (named pipe)"), ("device", "a character device")]


@pytest.mark.parametrize(("make", "what"), TARGETS)
@pytest.mark.parametrize("option", ["-o", "--json-out"])
def test_render_refuses_a_fifo_or_a_device_as_its_output(node: Path, tmp_path: Path, option: str, make: str,
                                                         what: str) -> None:
    target = (fifo if make == "fifo" else device)(tmp_path / "target")
    before = kind(target)
    extra = ["-o", str(tmp_path / "report.html")] if option == "--json-out" else []
    proc = cli("render", str(node), option, str(target), *extra)
    refused(proc, target, what)
    assert kind(target) == before
    assert not (tmp_path / "report.html").exists()  # refused before anything was written


def test_render_refuses_a_socket_and_a_directory(node: Path, tmp_path: Path, unix_socket: Path) -> None:
    for target, what in ((unix_socket, "a socket"), (tmp_path, "a directory")):
        before = kind(target)
        refused(cli("render", str(node), "-o", str(target)), target, what)
        assert kind(target) == before


def test_merge_refuses_a_device_as_its_directory_and_a_fifo_among_its_outputs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for i, host in enumerate(("gpu1", "gpu2")):
        write_node(run / "nodes", host, node_results(host, i + 1))
    nodes = sorted(str(p) for p in (run / "nodes").iterdir())
    target = device(tmp_path / "out")
    proc = cli("merge", *nodes, "-o", str(target))
    refused(proc, target, "a character device")
    assert "not a directory" in proc.stderr and kind(target) == (stat.S_IFCHR, NULL_DEVICE)
    planted = fifo(run / "accepted-hosts.txt")
    proc = cli("merge", *nodes, "-o", str(run))
    refused(proc, planted, "a FIFO (named pipe)")
    assert stat.S_ISFIFO(os.lstat(planted).st_mode) and not (run / "results.json").exists()


def test_signoff_refuses_a_device_among_its_outputs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for i, host in enumerate(("gpu1", "gpu2")):
        write_node(run / "nodes", host, node_results(host, i + 1))
    assert cli("merge", *sorted(str(p) for p in (run / "nodes").iterdir()), "-o", str(run)).returncode == 0
    write_fabric(run, fabric_results(["gpu1", "gpu2"], run.name))
    planted = device(run / "signoff.json")
    refused(cli("signoff", str(run)), planted, "a character device")
    assert kind(planted) == (stat.S_IFCHR, NULL_DEVICE)


def test_calibrate_refuses_a_fifo_even_with_force(node: Path, tmp_path: Path) -> None:
    target = fifo(tmp_path / "site.yaml")
    proc = cli("calibrate", str(node), "--extends", "h100-sxm-80gb", "--min-samples", "1", "-o", str(target),
               "--force")
    refused(proc, target, "a FIFO (named pipe)")
    assert stat.S_ISFIFO(os.lstat(target).st_mode)


def test_health_refuses_a_fifo_as_its_report(tmp_path: Path) -> None:
    report = tmp_path / "r"
    report.mkdir()
    planted = fifo(report / "health.json")
    proc = GpuNode(tmp_path / "host").run("--report-dir", str(report))
    refused(proc, planted, "a FIFO (named pipe)")
    assert stat.S_ISFIFO(os.lstat(planted).st_mode)


@pytest.mark.parametrize(("make", "what"), TARGETS)
def test_the_one_writer_replaces_a_file_or_a_link_and_nothing_else(tmp_path: Path, make: str, what: str) -> None:
    """files.write_atomic, under every output of the suite (results.json, merge's and sign-off's files, the
    evidence bundles, health's report): a regular file and a link's name are replaced (a link's target never
    written), a FIFO or a device is refused as it is, the temporary file gone."""
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "file").write_text("old")
    for name in ("link", "file"):
        files.write_atomic(tmp_path / name, "new")
        assert (tmp_path / name).read_text() == "new" and not (tmp_path / name).is_symlink()
    assert victim.read_text() == "keep me"
    target = (fifo if make == "fifo" else device)(tmp_path / "target")
    with pytest.raises(files.NotAFile) as refusal:
        files.write_atomic(target, "new")
    assert str(refusal.value).startswith(f"{target} is {what}, not a regular file")
    assert stat.S_IFMT(os.lstat(target).st_mode) in (stat.S_IFIFO, stat.S_IFCHR)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "link", "target", "victim"]


def test_a_report_dir_holding_a_fifo_under_an_output_name_is_refused_before_the_run(tmp_path: Path) -> None:
    """The run's own directory: a FIFO named results.json is neither moved aside as an earlier run's output nor
    replaced; the run is refused before any test, naming it."""
    report = tmp_path / "report"
    report.mkdir()
    planted = fifo(report / "results.json")
    why = reportdir.problem(report)
    assert why == (f"{planted} is a FIFO (named pipe) there, not a regular file; clustergate never replaces one "
                   "under an output's name: remove it, or choose another --report-dir"), why
    assert reportdir.stale_note(report, "it is a FIFO") is None  # no earlier run's record
    with pytest.raises(files.NotAFile):
        reportdir.move_aside(report)
    assert stat.S_ISFIFO(os.lstat(planted).st_mode) and not (report / "earlier").exists()
    device_dir = device(tmp_path / "device-dir")
    assert reportdir.problem(device_dir) == ("it is a character device, not a directory; name a directory (it is "
                                             "made where it does not exist)")


def test_a_bare_errno_never_reaches_the_user(node: Path, tmp_path: Path) -> None:
    """An OSError a command meets is said as 'PATH: what', naming the file asked for (not a temporary one)."""
    missing = tmp_path / "no-such-dir" / "out.json"
    proc = cli("render", str(node), "--json-out", str(missing), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"clustergate render: {missing}: No such file or directory\n"
    assert json.loads(node.read_text())  # the input is as it was
    site = tmp_path / "no-such-dir" / "site.yaml"  # calibrate checks its profile in a private file beside -o
    proc = cli("calibrate", str(node), "--extends", "h100-sxm-80gb", "--min-samples", "1", "-o", str(site))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"clustergate calibrate: {site}: No such file or directory\n"
