"""Fixtures shared by the suite's own tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import children
import pytest
import torch
import torch.distributed as dist
from torchrun_use import starts_a_command, starts_torchrun
from waited_out_runs import start_early, stop_runner, stop_runners

from workloads.common import ensure_distributed

pytest_plugins = ["pytester", "cpu_log"]

children.adopt()  # every process a test starts ends with this one, however it ends (tests/helpers/children.py)


@pytest.fixture
def gloo_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A one-rank gloo default group in this process, as the plugin (or ensure_distributed() outside
    torchrun) gives the workloads on CPU."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(1)  # the fine-tune tests compare figures bit for bit
    ensure_distributed()
    yield
    dist.destroy_process_group()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """A site key (``--key-file``), readable by this user alone."""
    path = tmp_path / "site.key"
    path.write_bytes(os.urandom(32).hex().encode())
    path.chmod(0o600)
    return path


SHARED_RUNS = ("node_run", "waited_out", "thousand")
"""Session fixtures that make a run of a minute or so once for every xdist worker (``report_runs.shared``, under
a file lock; the waited-out jobs in a runner process). The tests that use one go to one worker (pytest-xdist's
``--dist loadgroup``, tests/pytest.ini), and before the others: spread over both workers, one would sit on the
lock while the other made the run."""


def _shared_run(item: pytest.Item) -> str | None:
    return next((name for name in SHARED_RUNS if name in item.fixturenames), None)


def _order(item: pytest.Item) -> int:
    """Tests of a shared run first, except the waited-out jobs' (tests/helpers/waited_out_runs.py): those start in a
    process of their own at the session's first test, and their tests come last. Between them the longest first:
    the tests that start a torchrun job (several seconds to minutes each), then those that start a clustergate
    command (a second or more), then the unit and pytester tests, so with -n 2 the session ends on short tests that
    even out both workers, not on one worker's torchrun job while the other has nothing left."""
    run = _shared_run(item)
    if run is not None:
        return 4 if run == "waited_out" else 0
    return next((rank for rank, mark in ((1, "slow"), (2, "command")) if item.get_closest_marker(mark)), 3)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (run := _shared_run(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(run))
        # The fast tier, -m "not slow and not command", leaves both out (tests/helpers/torchrun_use.py).
        if starts_torchrun(item, SHARED_RUNS):
            item.add_marker(pytest.mark.slow)
        elif starts_a_command(item):
            item.add_marker(pytest.mark.command)
    items.sort(key=_order)  # stable: the order within each kind is kept


OWN_TESTS = str(Path(__file__).resolve().parent) + os.sep


def _session_environment() -> frozenset[str]:
    from clustergate.trust import distfiles

    return frozenset(f for f in distfiles.imported() if not f.startswith(OWN_TESTS))


SESSION_ENVIRONMENT = _session_environment()
"""The environment files this test session had imported once its conftest loaded (torch, pytest and the rest)."""


@pytest.fixture(autouse=True)
def own_tests_are_not_a_runs_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run driven inside this process (the lifecycle harness, pytester's in-process runs) checks the environment
    files this process imported against their RECORD (clustergate.trust.distfiles). What this session imported
    besides its own start (these tests' helpers from their folder, modules other tests made and imported from their
    temporary folders) is the test session's, not a run's environment: such a run judges the session's start alone.
    The environment check itself is tested in real runs (tests/trust/test_attestation.py)."""
    from clustergate.trust import distfiles

    imported = distfiles.imported
    monkeypatch.setattr(distfiles, "imported",
                        lambda skip=(): [f for f in imported(skip) if f in SESSION_ENVIRONMENT])


@pytest.fixture(scope="session", autouse=True)
def waited_out_started_early(request: pytest.FixtureRequest,
                             tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The waited-out jobs started as the session's first test starts, on whichever worker gets there first."""
    runner = start_early(request.session, tmp_path_factory)
    yield
    if runner is not None and not os.environ.get("PYTEST_XDIST_WORKER"):  # under xdist: the controller's end
        stop_runner(runner)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller's end (every worker has ended): the waited-out runners still going are ended."""
    if session.config.pluginmanager.hasplugin("dsession"):
        stop_runners(session.config._tmp_path_factory.getbasetemp())  # the workers' shared folder
