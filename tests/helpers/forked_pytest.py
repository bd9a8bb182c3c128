"""``pytest`` in a fresh process without paying for its imports each time: a pytester subprocess, forked.

A run of the plugin ends its process (``clustergate.run.outside``), so it cannot run inside the test's own
process; a subprocess per run spends most of its seconds importing torch (with torch._dynamo) and matplotlib.
One server per test process imports them once, runs nothing else, and forks a child per run: the child is a
process of its own, as fresh as a new one (it inherits those imports, never state), with the run's
directory, environment and arguments; its stdout and stderr go to files read back as pytester's
``RunResult``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

TIMEOUT_S = 300.0
"""A hang guard: a run here takes a few seconds."""

SERVER = r"""
import json, os, sys, traceback
# The heavy imports of every run, once. Nothing pytest rewrites (a plugin: clustergate, pytest-html,
# hypothesis's): a module imported before the run's pytest marks it would make the run warn.
import pytest, torch, torch.distributed, torch._dynamo, matplotlib.pyplot

requests, replies = sys.stdin, os.fdopen(os.dup(1), "w")
for line in requests:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 4
        try:
            os.close(replies.fileno())  # the server's, not the run's
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            # As `python -m pytest` run there with this environment starts: its directory first, then PYTHONPATH's
            # (the server's own sys.path comes from whichever test started it, whose PYTHONPATH may have differed)
            sys.path[:0] = [job["cwd"], *filter(None, job["env"].get("PYTHONPATH", "").split(os.pathsep))]
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
                out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(out, fd)
                os.close(out)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            status = int(pytest.main(job["args"]))
        except BaseException:
            traceback.print_exc()  # into the run's stderr: the exit below would lose it
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, code = os.waitpid(pid, 0)
    replies.write(json.dumps({"status": os.waitstatus_to_exitcode(code)}) + "\n")
    replies.flush()
"""

_server: subprocess.Popen[str] | None = None


def _started() -> subprocess.Popen[str]:
    global _server
    if _server is None or _server.poll() is not None:
        # A home of its own: matplotlib makes its cache under $HOME when imported, and pytester's HOME is the
        # directory of the test that happens to start the server, which a run must find as it left it.
        home = tempfile.mkdtemp(prefix="forked-pytest-")
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        _server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "HOME": home}, start_new_session=True)
    return _server


def runpytest_forked(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """What ``pytester.runpytest_subprocess(*args)`` gives, from a child of the server: run in pytester's
    directory with this process's environment (pytester's directory first on PYTHONPATH, as pytester puts it)."""
    cwd = Path.cwd()
    own = pytester.path / f"forked-{time.monotonic_ns()}"  # as pytester's runpytest-N: its basetemp, its output
    own.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), env.get("PYTHONPATH", "")]))
    return pytest_forked(cwd, env, [f"--basetemp={own / 'basetemp'}", *args], own)


def pytest_forked(cwd: Path, env: dict[str, str], args: list[str], own: Path) -> pytest.RunResult:
    """``python -m pytest ARGS`` run in ``cwd`` with exactly ``env``, from a child of the server; its stdout and
    stderr kept in ``own`` (a directory that exists)."""
    stdout, stderr = own / "stdout.txt", own / "stderr.txt"
    job = {"cwd": str(cwd), "env": env, "args": args, "stdout": str(stdout), "stderr": str(stderr)}
    server = _started()
    assert server.stdin is not None and server.stdout is not None
    t0 = time.monotonic()
    server.stdin.write(json.dumps(job) + "\n")
    server.stdin.flush()
    ready, _, _ = select.select([server.stdout], [], [], TIMEOUT_S)
    if not ready:
        os.killpg(server.pid, signal.SIGKILL)  # the server and the run it forked
        server.wait()
        pytest.fail(f"pytest {' '.join(args)} did not end within {TIMEOUT_S:.0f} s:\n{stdout.read_text()}")
    reply = server.stdout.readline()
    if not reply:
        pytest.fail(f"the pytest server ended (status {server.wait()}) running pytest {' '.join(args)}")
    status = json.loads(reply)["status"]
    out, err = stdout.read_text().splitlines(), stderr.read_text().splitlines()
    return pytest.RunResult(status, out, err, time.monotonic() - t0)
