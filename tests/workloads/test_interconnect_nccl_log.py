"""NCCL's own log, replayed: transports, algorithms and the required-transport verdict; the capture."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from workloads.interconnect import nccl_log
from workloads.interconnect.nccl_log import Capture, parse, transport_class, transport_problems

DATA = Path(__file__).parents[1] / "data" / "nccl"
ROOT = Path(__file__).resolve().parents[2]


def summary(name: str) -> dict:
    return parse((DATA / name).read_text()).summary()


@pytest.mark.parametrize(("via", "kind"), [
    ("P2P/CUMEM/read", "P2P"), ("P2P/IPC/read", "P2P"), ("P2P/direct pointer/read", "P2P"), ("P2P/MNNVL", "P2P"),
    ("SHM/direct/direct", "SHM"), ("NET/IB/0/GDRDMA", "NET/IB"), ("NET/IB/1(1)/GDRDMA", "NET/IB"),
    ("NET/IBext_v8/0(1)/GDRDMA/Shared", "NET/IB"), ("NET/Socket/0", "NET/Socket"),
    ("NET/AWS Libfabric/0/GDRDMA", "NET/AWS Libfabric"),
])
def test_transport_class_names_what_a_channel_runs_over(via: str, kind: str) -> None:
    assert transport_class(via) == kind


def test_two_gpus_over_nvlink() -> None:
    log = parse((DATA / "h200x2_p2p.log").read_text())
    assert log.transports() == {"P2P": 4}
    assert log.channels[0] == {"channel": 0, "src": 0, "dst": 1, "direction": "", "via": "P2P/CUMEM/read",
                               "transport": "P2P", "line": "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"}
    assert log.comms == [{"rank": 0, "nranks": 2, "nnodes": 1, "local_ranks": 2, "local_rank": 0}]
    assert log.env == {"NCCL_ALGO": "Ring"}  # the pin was taken
    assert {(a["bytes"], a["algo"], a["proto"]) for a in log.algorithms} == {(8, "RING", "LL"),
                                                                          (1073741824, "RING", "SIMPLE")}
    assert log.summary()["path_types"] == ["NVL/PIX"]
    assert transport_problems("node 0", [log.summary()], "NET/IB") == []  # inside a host P2P is fine


def test_socket_fallback_on_one_host_fails_an_ib_profile() -> None:
    s = summary("h200x2_socket_fallback.log")
    assert s["transports"] == {"NET/Socket": 4}
    assert s["env"]["NCCL_IB_DISABLE"] == "1" and s["networks"] == ["Socket"]
    problems = transport_problems("world whole job (2 ranks)", [s], "NET/IB")
    assert len(problems) == 1
    assert "4 channel connections via NET/Socket, the profile requires NET/IB" in problems[0]
    assert "] via NET/Socket/0'" in problems[0] and "fell back to sockets" in problems[0]
    assert transport_problems("world", [s], "any") == []


def test_infiniband_across_nodes_passes_and_pxn_lines_count() -> None:
    s = summary("h100_2x8_ib_rank0.log")
    assert s["transports"] == {"NET/IB": 6, "P2P": 2}
    assert s["nodes"] == 2
    assert s["networks"] == ["IB"] and s["net_devices"]["IB"].startswith("[0]mlx5_0:1/IB")
    assert ("AllReduce", 8, "TREE", "LL") in s["algorithms"]
    assert s["warnings"] == ["NET/IB : mlx5_3:1 async fatal event: local catastrophic error"]
    assert transport_problems("world", [s], "NET/IB") == []


def test_no_ib_device_and_old_ring_lines() -> None:
    s = summary("aws_no_ib_ring_format.log")
    assert s["ib_no_device"] and s["version"] == "2.4.8+cuda10.0"
    assert s["transports"] == {"NET/Socket": 4}
    (problem,) = transport_problems("net rail 0", [s], "NET/IB")
    assert "NCCL logged 'NET/IB : No device found.'" in problem and "e.g. 'Ring 00 : 1 -> 0 [receive]" in problem


def test_ib_plugin_and_shm_pass() -> None:
    s = summary("hpcx_ibext_shm.log")
    assert s["transports"] == {"NET/IB": 3, "SHM": 2}
    assert transport_problems("world", [s], "NET/IB") == []


def test_a_multi_host_communicator_without_any_ib_channel_fails() -> None:
    s = summary("h100_2x8_ib_rank0.log")
    s["transports"] = {"P2P": 2}  # as if only the NVLink channels had been logged
    (problem,) = transport_problems("world", [s], "NET/IB")
    assert "spans 2 hosts but no channel used NET/IB" in problem


def test_nothing_logged_is_a_problem_when_a_network_is_required() -> None:
    empty = parse("").summary()
    assert transport_problems("world", [empty], "any") == []
    (problem,) = transport_problems("world", [empty], "NET/IB")
    assert "logged no channel connection" in problem


def test_transports_of_several_ranks_add_up() -> None:
    a, b = summary("h200x2_p2p.log"), summary("h200x2_socket_fallback.log")
    (problem,) = transport_problems("node 0", [a, b], "NET/IB")
    assert "4 channel connections via NET/Socket" in problem


@pytest.mark.parametrize(("pattern", "expected"), [
    ("/tmp/nccl.%h.%p.log", "/tmp/nccl.gpu-7.4242.log"), ("/x/%%h-%p", "/x/%h-4242"), ("/x/%q", "/x/%q"),
    ("plain.log", "plain.log"),
])
def test_debug_file_expands_as_nccl_does(pattern: str, expected: str) -> None:
    assert nccl_log.expand_debug_file(pattern, "gpu-7.cluster.example", 4242) == expected


class FakeNccl:
    """NCCL's debug-init semantics: settings read at the first log call after start or a reset; the
    file opened with "w" (truncated) at that point; nothing written below INFO."""

    def __init__(self) -> None:
        self.level: str | None = None
        self.file: str | None = None
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1
        self.level = None

    def log(self, message: str) -> None:
        if self.level is None:
            self.level = os.environ.get("NCCL_DEBUG", "NONE").upper()
            self.file = os.environ.get("NCCL_DEBUG_FILE")
            if self.level == "INFO" and self.file:
                path = nccl_log.expand_debug_file(self.file, "vm", os.getpid())
                self.file = path
                Path(path).write_text("")
        if self.level == "INFO" and self.file:
            with open(self.file, "a") as f:
                f.write(f"vm:{os.getpid()}:1 [0] NCCL INFO {message}\n")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNccl:
    nccl = FakeNccl()
    monkeypatch.setattr(nccl_log, "reset_function", lambda: (nccl.reset, "fake libnccl"))
    for var in (*nccl_log.DEBUG_VARS, "NCCL_ALGO"):
        monkeypatch.delenv(var, raising=False)
    nccl.log("default communicator created")  # NCCL's debug init happened at the plugin's init_process_group
    return nccl


def test_capture_routes_the_log_to_our_file_then_puts_everything_back(fake: FakeNccl) -> None:
    with Capture(enabled=True, env={"NCCL_ALGO": "Ring"}) as cap:
        assert os.environ["NCCL_ALGO"] == "Ring" and os.environ["NCCL_DEBUG"] == "INFO"
        fake.log("NCCL_ALGO set by environment to Ring")
        fake.log("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read")
    assert cap.mode == "ours" and fake.resets == 2
    assert cap.log().transports() == {"P2P": 1} and cap.log().env == {"NCCL_ALGO": "Ring"}
    assert not any(v in os.environ for v in (*nccl_log.DEBUG_VARS, "NCCL_ALGO"))
    fake.log("after the capture")  # re-init with the user's (empty) settings: nowhere
    assert fake.level == "NONE"
    assert cap.path is not None and not Path(cap.path).exists()


def test_capture_reads_a_users_info_file_without_truncating_it(fake: FakeNccl, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl.%h.%p.log"))
    monkeypatch.setattr(nccl_log.socket, "gethostname", lambda: "vm.example")
    fake.reset()
    fake.log("before")
    with Capture(enabled=True) as cap:
        fake.log("Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0")
    assert cap.mode == "user" and fake.resets == 1  # never reset: NCCL would re-open (truncate) the file
    assert cap.log().transports() == {"NET/Socket": 1}
    user_file = tmp_path / f"nccl.vm.{os.getpid()}.log"
    assert "before" in user_file.read_text() and os.environ["NCCL_DEBUG"] == "INFO"


def test_capture_without_libnccl_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_log, "reset_function", lambda: (None, "no libnccl in this process"))
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    with Capture(enabled=True, env={"NCCL_ALGO": "Ring"}) as cap:
        assert os.environ["NCCL_ALGO"] == "Ring"
    assert cap.describe() == {"mode": "off", "reason": "no libnccl in this process", "file": None}
    assert "NCCL_ALGO" not in os.environ and cap.text() == ""


def test_gloo_runs_capture_nothing() -> None:
    with Capture(enabled=False) as cap:
        pass
    assert cap.mode == "off" and "not a CUDA/NCCL run" in cap.reason


LIBNCCL = os.environ.get("CLUSTERGATE_TEST_LIBNCCL")


@pytest.mark.skipif(not LIBNCCL, reason="set CLUSTERGATE_TEST_LIBNCCL to a libnccl.so.2 (e.g. from the "
                                        "nvidia-nccl-cu13 wheel) to check the capture against real NCCL")
def test_capture_with_a_real_libnccl() -> None:
    """Real NCCL, no GPU needed: its debug init happens with NCCL_DEBUG unset (as in a run), then a capture
    must catch what NCCL logs inside it (here the WARN of a failing ncclCommInitRank), and nothing after."""
    script = textwrap.dedent(f"""
        import ctypes, os
        from workloads.interconnect import nccl_log
        lib = ctypes.CDLL({LIBNCCL!r})
        uid, comm = ctypes.create_string_buffer(128), ctypes.c_void_p()
        lib.ncclGetUniqueId(uid)
        lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
        with nccl_log.Capture(enabled=True) as cap:
            lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
        print("MODE", cap.mode, "LINES", len(cap.text().splitlines()), "WARN", bool(cap.log().warnings))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NCCL_DEBUG", None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert "MODE ours" in out.stdout and "WARN True" in out.stdout, out.stdout + out.stderr


def test_log_folders_that_ended_processes_left_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A failed run leaves through os._exit, past the exit handler that removes its folder: the next one removes it.
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = tmp_path / f"clustergate-nccl-{gone.pid}-abc"
    left.mkdir()
    (left / "nccl-1.log").write_text("NCCL INFO ...")
    running = tmp_path / f"clustergate-nccl-{os.getppid()}-def"  # a process that still runs
    running.mkdir()
    unlike = tmp_path / "clustergate-nccl-x-1"
    unlike.mkdir()
    link = tmp_path / f"clustergate-nccl-{gone.pid}-link"
    link.symlink_to(running)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(nccl_log, "_TMP", [])
    mine = Path(nccl_log._tmpdir())
    assert mine.parent == tmp_path and mine.name.startswith(f"clustergate-nccl-{os.getpid()}-")
    assert not left.exists()
    assert running.is_dir() and unlike.is_dir() and link.is_symlink()
