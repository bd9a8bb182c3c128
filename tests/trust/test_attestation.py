"""What a run attests (clustergate.trust.attestation): its code is the shipped suite, only the suite's plugins were
loaded, a cpu run on a GPU node says it is a dry run; and every input is read safely (clustergate.common.inputfile).

The rules on planted suites (a git checkout, an installed wheel's RECORD, neither) and planted records; then runs
under torchrun as a user starts them: README's command 1 (the shared run) attests itself, a plugin through
PYTEST_ADDOPTS, one planted in pytest's or pytest-metadata's folder (of a copy), a file of pytest's changed, and a
gutted copy of the suite on PYTHONPATH each make a run that would accept partial, naming the plugin or the file, and a
FIFO given as an input stops every rank at once. (Bytecode: tests/trust/test_code_from_source.py.)
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from complete_runs import attested
from trust_runs import node_run, recorded  # noqa: F401  (a session fixture: README's command 1, run once)

from clustergate.cluster import node_runs
from clustergate.common import inputfile
from clustergate.criteria import baseline
from clustergate.record.verdict import of_record
from clustergate.trust import attestation, distfiles, suitefiles
from clustergate.trust.completeness import partial
from clustergate.trust.manifest import shipped
from workloads.node.gpu_presence import NvidiaDevices

from torchrun_job import ROOT, job_env, plant, run_job, start_ranks

PACKAGES = suitefiles.PACKAGES


# ---- the suite's files and their reference ------------------------------------------------------------------------
def _suite(root: Path) -> dict[str, Path]:
    """A small suite of the three packages under ``root``, as a checkout lays it out; its package directories."""
    for name in PACKAGES:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f'"""{name}"""\n')
        (root / name / "__pycache__").mkdir()
        (root / name / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0compiled")  # never a suite file
    (root / "acceptance" / "test_world.py").write_text("def test_world():\n    assert 6 * 7 == 42\n")
    (root / "thresholds.yaml").write_text("schema: 1\n")
    (root / "clustergate" / "thresholds.yaml").symlink_to("../thresholds.yaml")
    (root / "conftest.py").write_text('pytest_plugins = ["clustergate"]\n')
    return {name: root / name for name in PACKAGES}


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=root, check=True,
                   capture_output=True)


def _checkout(root: Path) -> dict[str, Path]:
    dirs = _suite(root)
    (root / ".gitignore").write_text("__pycache__/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "the suite")
    return dirs


def _bounded(fn: Any, seconds: float = 30) -> Any:
    """``fn()`` (its result, or its exception raised here), failing the test rather than hanging it where it does not
    end within ``seconds`` (a hang guard: reading a FIFO would wait forever)."""
    out: list[Any] = []

    def call() -> None:
        try:
            out.append((fn(), None))
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            out.append((None, exc))
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"did not end within {seconds} s"
    result, exc = out[0]
    if exc is not None:
        raise exc
    return result


def test_a_clean_checkout_is_attested_against_its_git_tree(tmp_path: Path) -> None:
    dirs = _checkout(tmp_path)
    checked = suitefiles.check(dirs)
    assert (checked.reference, checked.modified, checked.extra, checked.missing) == ("git", (), (), ())
    assert checked.digest.startswith("sha256:") and len(checked.digest) == 71
    assert suitefiles.check(dirs).digest == checked.digest
    files = suitefiles.find(dirs, checkout=tmp_path)
    assert "conftest.py" in files and "thresholds.yaml" in files and "clustergate/thresholds.yaml" in files
    assert not any("__pycache__" in rel for rel in files)


def test_a_modified_an_extra_and_a_missing_file_are_named(tmp_path: Path) -> None:
    dirs = _checkout(tmp_path)
    before = suitefiles.check(dirs).digest
    (tmp_path / "acceptance" / "test_world.py").write_text("def test_world():\n    pass\n")  # the body gutted
    (tmp_path / "acceptance" / "test_planted.py").write_text("def test_planted():\n    pass\n")
    (tmp_path / "workloads" / "__init__.py").unlink()
    (tmp_path / "clustergate" / "thresholds.yaml").unlink()  # the link replaced by a file of the same bytes
    (tmp_path / "clustergate" / "thresholds.yaml").write_text("schema: 1\n")
    os.mkfifo(tmp_path / "acceptance" / "test_fifo.py")  # never opened for reading: it would block
    checked = _bounded(lambda: suitefiles.check(dirs))
    assert checked.reference == "git" and checked.digest != before
    assert checked.modified == ("acceptance/test_world.py", "clustergate/thresholds.yaml")
    assert checked.extra == ("acceptance/test_fifo.py", "acceptance/test_planted.py")
    assert checked.missing == ("workloads/__init__.py",)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give the clone to another user here")
def test_a_clone_another_user_owns_is_read_all_the_same(tmp_path: Path) -> None:
    """git refuses a repository another user owns ("dubious ownership") unless it is declared safe: the check
    declares that one repository for its one command."""
    dirs = _checkout(tmp_path / "clone")
    subprocess.run(["chown", "-R", "nobody", str(tmp_path / "clone")], check=True)
    bare = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}  # no host safe.directory
    refused = subprocess.run(["git", "ls-tree", "HEAD"], cwd=tmp_path / "clone", capture_output=True, text=True,
                             env=bare)
    assert refused.returncode != 0 and "dubious ownership" in refused.stderr  # what the check must get past
    checked = suitefiles.check(dirs)
    assert (checked.reference, checked.modified, checked.extra, checked.missing) == ("git", (), (), ())


def test_without_git_a_checkout_has_no_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = _checkout(tmp_path / "clone")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    checked = suitefiles.check(dirs)
    assert checked.reference == "none" and "git is not installed" in str(checked.why_none)


def test_a_copy_without_git_or_record_and_packages_from_two_places_have_no_reference(tmp_path: Path) -> None:
    dirs = _suite(tmp_path / "copy")
    checked = suitefiles.check(dirs)
    assert checked.reference == "none" and "neither an installed wheel" in str(checked.why_none)
    mixed = {**dirs, "acceptance": _suite(tmp_path / "other")["acceptance"]}
    checked = suitefiles.check(mixed)
    assert checked.reference == "none" and "do not come from one directory" in str(checked.why_none)


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_an_installed_wheel_is_checked_against_its_record(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    dirs = _suite(site)
    (site / "clustergate" / "thresholds.yaml").unlink()  # a wheel carries a copy, not the link
    (site / "clustergate" / "thresholds.yaml").write_text("schema: 1\n")
    for name in ("conftest.py", "thresholds.yaml"):
        (site / name).unlink()
    files = suitefiles.find(dirs)
    rows = [f"{rel},sha256={_record_hash(p.read_bytes())},{p.stat().st_size}" for rel, p in files.items()]
    rows += ["clustergate/__pycache__/__init__.cpython-311.pyc,,", "acceptance/test_removed.py,sha256=x,1",
             "clustergate-0.1.0.dist-info/RECORD,,"]
    (site / "clustergate-0.1.0.dist-info").mkdir()
    (site / "clustergate-0.1.0.dist-info" / "RECORD").write_text("\n".join(rows) + "\n")
    checked = suitefiles.check(dirs)
    assert (checked.reference, checked.modified, checked.extra) == ("RECORD", (), ())
    assert checked.missing == ("acceptance/test_removed.py",)
    (site / "acceptance" / "test_world.py").write_text("def test_world():\n    pass\n")
    (site / "workloads" / "extra.py").write_text("")
    checked = suitefiles.check(dirs)
    assert checked.modified == ("acceptance/test_world.py",) and checked.extra == ("workloads/extra.py",)


def test_this_installation_is_checked_in_well_under_a_tenth_of_a_second() -> None:
    """Every rank pays for it at its start. Measured here at about 10 ms (2 cores, git included); the bound is the
    brief's, ten times that, for a machine that is busy."""
    started = time.perf_counter()
    checked = suitefiles.check()
    assert time.perf_counter() - started < 0.1 * 2  # doubled for a CI machine running two workers at once
    assert checked.reference in ("git", "RECORD") and checked.digest == attestation.suite_digest()


# ---- what a record says, read again ---------------------------------------------------------------------------------
def test_a_clean_attestation_has_no_problems_and_a_missing_one_is_a_problem() -> None:
    assert attestation.problems({"attestation": attested()}) == []
    [said] = attestation.problems({})
    assert said.startswith("it does not attest its code and plugins (no attestation section")


@pytest.mark.parametrize(("edit", "says"), [
    (lambda a: a.update(modified=["acceptance/test_world.py"]),
     "its code is not the shipped suite (git): modified acceptance/test_world.py"),
    (lambda a: a.update(extra=["acceptance/test_x.py"], missing=["workloads/y.py"]),
     "its code is not the shipped suite (git): extra acceptance/test_x.py; missing workloads/y.py"),
    (lambda a: a.update(reference="none"), "its code was checked against no reference: run the suite installed"),
    (lambda a: a.update(suite_digest="0" * 16), "its attestation has no suite digest"),
    (lambda a: a.update(modified="acceptance/test_world.py"), "its attestation's 'modified' is not a list of paths"),
    (lambda a: a.update(plugins=[]), "its attestation lists no plugins"),
    (lambda a: a["plugins"].append({"name": "skipper", "version": "1.0", "file": "/site/skipper.py", "suite": False}),
     "1 plugins that are not the suite's were loaded: skipper (/site/skipper.py); run with the suite's plugins "
     "alone: PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"),
    (lambda a: a.pop("dry_run"), "its attestation does not say whether it was a dry run"),
    (lambda a: a.pop("foreign_code"), "its attestation does not say whether its modules ran from their source"),
    (lambda a: a.update(foreign_code=[{"module": "workloads.x", "file": "/s/workloads/__pycache__/x.cpython-311.pyc",
                                       "why": "bytecode not compiled from its source"}]),
     "1 modules of the suite ran code that is not their attested source: workloads.x "
     "(/s/workloads/__pycache__/x.cpython-311.pyc: bytecode not compiled from its source); remove the suite's "
     "__pycache__ folders and run again"),
    (lambda a: a.update(foreign_code=[{"module": "workloads", "file": "/s/suite.zip",
                                       "why": "imported from an archive on the import path, not from the suite's "
                                              "files"}]),
     "1 modules of the suite ran code that is not their attested source: workloads (/s/suite.zip: imported from an "
     "archive on the import path, not from the suite's files); run the installed suite (or the checkout): take "
     "/s/suite.zip off PYTHONPATH"),
    (lambda a: a["plugins"].append({"name": "_pytest.evil", "version": None, "file": "/site/_pytest/evil.py",
                                    "suite": False, "why": "not a file pytest 9 installed"}),
     "1 plugins that are not the suite's were loaded: _pytest.evil (/site/_pytest/evil.py: not a file pytest 9 "
     "installed); run with the suite's plugins alone"),
])
def test_each_field_is_read_again_and_the_recorded_problems_are_never_trusted(edit: Any, says: str) -> None:
    section = attested()
    edit(section)
    section["problems"] = []  # a hand edit that empties the list for people changes nothing
    said = attestation.problems({"attestation": section})
    assert any(s.startswith(says) for s in said), said


def test_a_complete_run_that_is_not_attested_is_partial_for_every_command(node_run: Path) -> None:  # noqa: F811
    results = recorded(node_run)
    results["attestation"]["modified"] = ["acceptance/test_world.py"]
    verdict = of_record(results)
    assert verdict.verdict == "partial" and "modified acceptance/test_world.py" in str(verdict.reason)
    assert any("modified acceptance/test_world.py" in r for r in partial(results, shipped(), need="node"))


def test_plugins_are_the_suites_where_their_files_are() -> None:
    import _pytest.terminal
    import pytest_html.plugin
    import xdist.plugin

    places = attestation.suite_places()
    assert attestation.plugin_entry("terminal", "_pytest.terminal", _pytest.terminal.__file__, places) == {
        "name": "terminal", "version": pytest.__version__, "file": _pytest.terminal.__file__, "suite": True}
    assert attestation.plugin_entry("html", "pytest_html.plugin", pytest_html.plugin.__file__, places)["suite"]
    suite_conftest = str(ROOT / "acceptance" / "conftest.py")
    assert attestation.plugin_entry(suite_conftest, "acceptance.conftest", suite_conftest, places)["suite"]
    foreign = attestation.plugin_entry("xdist", "xdist.plugin", xdist.plugin.__file__, places)
    assert foreign == {"name": "xdist", "version": importlib.metadata.version("pytest-xdist"),
                       "file": str(Path(xdist.plugin.__file__).resolve()), "suite": False}
    elsewhere = attestation.plugin_entry("/tmp/x/conftest.py", "conftest", "/tmp/x/conftest.py", places)
    assert elsewhere == {"name": "/tmp/x/conftest.py", "version": None, "file": "/tmp/x/conftest.py", "suite": False}
    # A module that says its file is pytest's: its hooks' code says where it is.
    forged = attestation.plugin_entry("evil", "evil", _pytest.terminal.__file__, places, ["/tmp/x/evil.py"])
    assert forged == {"name": "evil", "version": None, "file": "/tmp/x/evil.py", "suite": False}
    assert not attestation.plugin_entry("terminal", "_pytest.terminal", _pytest.terminal.__file__, places,
                                        ["/tmp/x/evil.py"])["suite"]
    assert attestation.plugin_entry("terminal", "_pytest.terminal", _pytest.terminal.__file__, places,
                                    [_pytest.terminal.__file__])["suite"]
    from_text = attestation.plugin_entry("evil", "evil", _pytest.terminal.__file__, places, ["<string>"])
    assert from_text["suite"] is False and from_text["file"] == "<string>"


def test_a_plugin_file_in_pytests_folders_is_theirs_only_as_their_record_lists_it() -> None:
    """A file their RECORD does not list (one that is not there is never listed) is no plugin of theirs."""
    import _pytest.terminal
    import pytest_metadata.plugin

    places = attestation.suite_places()
    for module in (_pytest.terminal, pytest_metadata.plugin):
        real = Path(module.__file__).resolve()
        assert attestation.unshipped(real) is None
        planted = real.with_name("cg_evil.py")
        entry = attestation.plugin_entry("evil", f"{module.__name__.rpartition('.')[0]}.cg_evil", str(planted), places)
        distribution = "pytest" if module is _pytest.terminal else "pytest-metadata"
        assert entry == {"name": "evil", "version": None, "file": str(planted), "suite": False,
                         "why": f"not a file {distribution} {importlib.metadata.version(distribution)} installed "
                                "(its RECORD does not list it)"}
    # A plugin of pytest's whose hooks come from a file pytest did not install: named by that file.
    hooked = attestation.plugin_entry("terminal", "_pytest.terminal", _pytest.terminal.__file__, places,
                                      [str(Path(_pytest.terminal.__file__).with_name("cg_evil.py"))])
    assert hooked["suite"] is False and hooked["file"].endswith("_pytest/cg_evil.py") and "RECORD" in hooked["why"]


def test_the_cpu_profile_on_a_gpu_node_is_a_dry_run() -> None:
    gpu_node = NvidiaDevices(nvml_gpus=(), nvml_error="no NVML", device_files=(), pci_gpus=(), pci_other=(),
                             expected=8)
    cpu_node = NvidiaDevices(nvml_gpus=(), nvml_error="no NVML", device_files=(), pci_gpus=(), pci_other=(),
                             expected=None)
    said = attestation.profile_problem(True, gpu_node, dry_run=False)
    assert said is not None and said.startswith("--profile cpu on a GPU node (CLUSTERGATE_GPUS_PER_NODE=8)")
    assert "pass --dry-run" in said
    assert attestation.profile_problem(True, gpu_node, dry_run=True) is None
    assert attestation.profile_problem(True, cpu_node, dry_run=False) is None
    assert attestation.profile_problem(False, gpu_node, dry_run=True) == \
        "--dry-run rehearses the suite on CPU: it goes with --profile cpu"


# ---- every input read safely -------------------------------------------------------------------------------------
def test_the_reader_takes_regular_files_only_and_no_more_than_their_kind(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for read in (lambda: inputfile.read_bytes(fifo, "thresholds"), lambda: inputfile.head(fifo, 16)):
        with pytest.raises(inputfile.InputFileError, match=f"^{fifo}: a FIFO, not a regular file: not read"):
            _bounded(read)
    with pytest.raises(inputfile.InputFileError, match="^/dev/zero: a device, not a regular file"):
        inputfile.read_bytes("/dev/zero", "results")
    (tmp_path / "big").write_bytes(b"x" * 100)
    monkeypatch.setitem(inputfile.MAX_BYTES, "state", 99)
    with pytest.raises(inputfile.InputFileError, match="100 bytes, more than a state file can be"):
        inputfile.read_bytes(tmp_path / "big", "state")
    assert inputfile.read_text(tmp_path / "big", "results") == "x" * 100
    with pytest.raises(FileNotFoundError):
        inputfile.read_bytes(tmp_path / "none", "results")
    with pytest.raises(IsADirectoryError):
        inputfile.read_bytes(tmp_path, "results")


def test_a_fifo_as_baseline_or_progress_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "progress.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(baseline.BaselineError, match=f"^--baseline {fifo}: a FIFO, not a regular file"):
        _bounded(lambda: baseline.load(fifo))
    assert _bounded(lambda: node_runs._last_progress(tmp_path)) == ""  # merge says nothing of where it was


@pytest.mark.parametrize("command", [("history",), ("merge", "NODES", "-o", "OUT"), ("signoff", "OUT")])
def test_a_fifo_or_a_device_as_the_store_is_one_line_and_exit_2(tmp_path: Path, command: tuple[str, ...]) -> None:
    """history, and merge and sign-off too (a store that is only busy or broken later never changes their status;
    one that can never be a store is a usage error before they read anything)."""
    fifo = tmp_path / "store.db"
    os.mkfifo(fifo)
    (tmp_path / "nodes").mkdir()
    (tmp_path / "out").mkdir()
    args = [{"NODES": str(tmp_path / "nodes"), "OUT": str(tmp_path / "out")}.get(a, a) for a in command]
    for store, says in ((fifo, f"{fifo}: a FIFO, not a regular file"), (Path("/dev/zero"), "/dev/zero: a device")):
        # A hang guard only: the refusal is the command's start-up (about a second here).
        proc = subprocess.run([sys.executable, "-m", "clustergate", *args, "--store", str(store)], env=job_env(),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stdout + proc.stderr
        assert says in proc.stderr and proc.stdout == "", proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("option", ["--thresholds", "--store"])
def test_a_fifo_input_stops_every_rank_at_the_start(tmp_path: Path, option: str) -> None:
    """Each rank's own exit status: 2 on every rank, the FIFO named, no test run (the store is rank 0's alone: its
    refusal reaches the other rank through the start-up exchange)."""
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    args = plant(tmp_path, "two_tests")
    if option == "--thresholds":
        args = args[2:]  # plant's own --thresholds left out: the FIFO is the thresholds
    r = start_ranks(tmp_path, [*args, option, str(fifo)], timeout=120).wait()  # a hang guard
    assert r.codes == [2, 2], r.output[-3000:]
    assert f"{fifo}: a FIFO, not a regular file" in r.output and "Traceback" not in r.output, r.output[-3000:]
    # No rank was stuck on the read: each came to the start and said it (a rank blocked in open() would be named
    # after STARTUP_S, and the others would end 4, not 2). Wall time is left unasserted: on a loaded 2-core CI
    # machine two ranks' start alone has taken 47 s.
    assert "did not reach the start" not in r.output, r.output[-3000:]


# ---- runs under torchrun -------------------------------------------------------------------------------------------
def test_readme_command_1_attests_itself(node_run: Path) -> None:  # noqa: F811
    """The shared run of README's command 1, started as a user types it (no PYTEST_DISABLE_PLUGIN_AUTOLOAD): the
    checkout's pytest configuration keeps the plugins installed here (pytest-xdist, of the test extra) out."""
    section = recorded(node_run)["attestation"]
    assert (section["reference"], section["modified"], section["extra"], section["missing"]) == ("git", [], [], []), \
        section
    assert section["suite_digest"] == attestation.suite_digest() and section["dry_run"] is False
    assert section["foreign_code"] == []  # every module of the suite it loaded ran its attested source
    names = {p["name"] for p in section["plugins"]}
    assert {"html", "metadata", "clustergate", "junitxml"} <= names and "xdist" not in names
    assert all(p["suite"] for p in section["plugins"]) and section["problems"] == []


MEASURED = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.metrics("allreduce_busbw_gbps")
def test_measured(cg) -> None:
    t = torch.ones(1024)
    dist.all_reduce(t)
    assert t[0].item() == cg.world_size
    cg.record("allreduce_busbw_gbps", 1.0, "GB/s", scope="world")


def test_plain(cg) -> None:
    assert cg.world_size == 2
'''


def _planted(tmp_path: Path) -> list[str]:
    args = plant(tmp_path, "two_tests")
    (tmp_path / "test_fault.py").write_text(MEASURED)
    return args


@pytest.mark.slow
def test_a_plugin_through_pytest_addopts_makes_the_run_partial_naming_it(tmp_path: Path) -> None:
    """A plugin skips the measured test with a reason: every test passed or skipped saying why, so the run would
    accept; it is partial, naming the plugin and its file."""
    plugins = tmp_path / "site"  # beside the run's directory (the planted suite's), not in it
    plugins.mkdir()
    (plugins / "skipper.py").write_text(
        "import pytest\n\n\ndef pytest_runtest_setup(item):\n    if item.get_closest_marker('metrics'):\n"
        "        pytest.skip('not measured on this node')\n")
    # One that names a file of pytest's as its own and passes a test without running its body: listed all the
    # same, with the file its hook was compiled from.
    (plugins / "hider.py").write_text(
        "import os, _pytest, pytest\n__file__ = os.path.join(os.path.dirname(_pytest.__file__), 'python.py')\n\n\n"
        "@pytest.hookimpl(tryfirst=True)\ndef pytest_pyfunc_call(pyfuncitem):\n"
        "    return True if pyfuncitem.name == 'test_plain' else None\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = run_job(run_dir, _planted(run_dir), timeout=180,
                  env={"PYTEST_ADDOPTS": "-p skipper -p hider",
                       "PYTHONPATH": os.pathsep.join([str(ROOT), str(plugins)])})
    assert job.codes == [1], job.output[-3000:]
    res = job.results
    assert {t["nodeid"].split("::")[-1]: t["outcome"] for t in res["tests"]} == \
        {"test_measured": "skipped", "test_plain": "passed"}
    assert res["verdict"] == "partial", res["reason"]
    # How they were asked for is in the record too.
    assert res["environment"]["PYTEST_ADDOPTS"] == "-p skipper -p hider"
    assert str(plugins) in res["environment"]["PYTHONPATH"].split(os.pathsep)
    [said] = res["attestation"]["problems"]
    assert said.startswith(f"2 plugins that are not the suite's were loaded: hider ({plugins / 'hider.py'}), "
                           f"skipper ({plugins / 'skipper.py'}); run with the suite's plugins alone"), said
    # Its skip rests on no fact either (a plugin's pytest.skip records none): both are said.
    assert res["reason"] == ("ran less than a complete run: 1 skips are not earned by a recorded fact: test_measured "
                             f"(no skip fact recorded); {said}")


def _copy_of(distribution: str, site: Path) -> Path:
    """``distribution``'s package and dist-info copied into ``site`` (first on the run's path, they are the ones it
    imports and whose RECORD is read); its package folder there."""
    dist = importlib.metadata.distribution(distribution)
    installed = Path(dist.locate_file("")).resolve()
    tops = {str(f).split("/", 1)[0] for f in dist.files or () if str(f).endswith("__init__.py")}
    info = next(str(f).split("/", 1)[0] for f in dist.files or () if str(f).endswith(".dist-info/RECORD"))
    for top in (*tops, info):
        shutil.copytree(installed / top, site / top, ignore=shutil.ignore_patterns("__pycache__"))
    return site / ("_pytest" if distribution == "pytest" else distribution.replace("-", "_"))


HIDER = ("import pytest\n\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_pyfunc_call(pyfuncitem):\n"
         "    return True if pyfuncitem.name == 'test_plain' else None\n")
"""A plugin that passes a test without running its body."""


@pytest.mark.slow
@pytest.mark.parametrize(("case", "distribution"), [("planted", "pytest"), ("planted", "pytest-metadata"),
                                                    ("changed", "pytest")])
def test_a_plugin_planted_in_or_changed_among_pytests_files_makes_the_run_partial_naming_it(
        tmp_path: Path, case: str, distribution: str) -> None:
    """In a copy of pytest's and pytest-metadata's installed files (never this environment's): a plugin planted in
    the package's folder and loaded with -p, or a file of pytest's changed, is not theirs: partial, named by its file
    and why. Everything else of theirs is."""
    site = tmp_path / "site"
    folders = {d: _copy_of(d, site) for d in ("pytest", "pytest-metadata")}
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    version = importlib.metadata.version(distribution)
    if case == "planted":
        named = folders[distribution] / "cg_evil.py"
        named.write_text(HIDER)
        env["PYTEST_ADDOPTS"] = f"-p {folders[distribution].name}.cg_evil"
        why = f"not a file {distribution} {version} installed (its RECORD does not list it)"
    else:
        named = folders[distribution] / "skipping.py"
        named.write_text(named.read_text() + "\n# changed after pytest installed it\n")
        why = f"not the file {distribution} {version} installed (its sha256 is not the one its RECORD gives)"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = run_job(run_dir, _planted(run_dir), timeout=180, env=env)
    res = job.results
    assert job.codes == [1] and [t["outcome"] for t in res["tests"]] == ["passed", "passed"], job.output[-3000:]
    section = res["attestation"]
    assert [p for p in section["plugins"] if not p["suite"]] == [
        {"name": "skipping" if case == "changed" else f"{named.parent.name}.cg_evil", "version": None,
         "file": str(named), "suite": False, "why": why}], section["plugins"]
    assert res["verdict"] == "partial" and f"({named}: {why})" in res["reason"]
    others = [p for p in section["plugins"] if p["suite"] and p["file"] and p["file"].startswith(str(site))]
    assert {"terminal", "metadata"} <= {p["name"] for p in others}  # the copy's own files are theirs


def test_an_environment_file_is_checked_against_the_record_of_its_directory(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """In a copy of pluggy's installed files (never this environment's): its files are as listed; one planted among
    them, one from a folder with no distribution and one listed without a hash are named; Python's own library and a
    file outside every directory of sys.path (torch.compile's kernels) are not checked."""
    import json as stdlib_module

    site = tmp_path / "site"
    folder = _copy_of("pluggy", site).resolve()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "loose.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(plain))
    monkeypatch.syspath_prepend(str(site))
    assert distfiles.problem(str(folder / "_hooks.py")) is None
    (folder / "cg_planted.py").write_text("x = 1\n")
    assert distfiles.problem(str(folder / "cg_planted.py")) == \
        f"no distribution installed it (no RECORD in {site.resolve()} lists it)"
    assert distfiles.problem(str((plain / "loose.py").resolve())) == (
        f"no distribution in {plain.resolve()} has a RECORD (a folder on PYTHONPATH, an egg or a system package): "
        "nothing says what it should be")
    [record] = site.glob("pluggy-*.dist-info/RECORD")
    record.write_text(record.read_text().replace("pluggy/_result.py,sha256=", "pluggy/_result.py,md5="))
    distfiles._record.cache_clear()
    assert distfiles.problem(str(folder / "_result.py")).endswith("'s RECORD gives it no sha256: nothing says what "
                                                                  "it should be")
    assert distfiles.problem(str(Path(stdlib_module.__file__).resolve())) is None
    outside = tmp_path / "kernels" / "c3ser.py"
    assert distfiles.problem(str(outside)) is None and distfiles.check().outside >= 0


@pytest.mark.slow
def test_an_edited_file_of_an_installed_dependency_makes_the_run_partial_naming_it(tmp_path: Path) -> None:
    """The issue's reproducer, point 6, on a dependency every run imports (pluggy, pytest's): a copy of its installed
    files and dist-info first on the run's path (never this environment's own), one of its files edited. The run is
    partial naming that file and why; every other file it imported from its environment is as installed."""
    site = tmp_path / "site"
    folder = _copy_of("pluggy", site)
    edited = (folder / "_hooks.py").resolve()
    edited.write_text(edited.read_text() + "\nEDITED = True  # ten lines of a slow clock would do\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = run_job(run_dir, _planted(run_dir), timeout=180,
                  env={"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])})
    assert job.codes == [1] and [t["outcome"] for t in job.results["tests"]] == ["passed", "passed"], \
        job.output[-3000:]
    res = job.results
    why = (f"not the file pluggy {importlib.metadata.version('pluggy')} installed (its sha256 is not the one its "
           "RECORD gives)")
    environment = res["attestation"]["environment_code"]
    assert environment["unattested"] == [{"file": str(edited), "why": why}], environment
    assert environment["checked"] > 100  # torch's, numpy's, pytest's files: as installed
    assert res["verdict"] == "partial" and (
        f"1 Python files it imported from its environment are not as their distribution installed them: {edited} "
        f"({why}); reinstall each from its wheel") in res["reason"], res["reason"]


@pytest.mark.slow
def test_a_gutted_copy_of_the_suite_on_pythonpath_is_partial_naming_the_file(tmp_path: Path) -> None:
    """A copy of the suite, committed in its own clone, then a test body gutted: the run's code is checked against
    that clone's tree, and the file is named."""
    copy_root = tmp_path / "copy"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, copy_root / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in suitefiles.CHECKOUT_FILES:
        shutil.copy(ROOT / name, copy_root / name)
    (copy_root / ".gitignore").write_text("__pycache__/\n")
    _git(copy_root, "init", "-q")
    _git(copy_root, "add", "-A")
    _git(copy_root, "commit", "-qm", "the suite")
    world = copy_root / "acceptance" / "test_world.py"
    checks = "    assert not problems, \"\\n\".join(problems)\n"
    assert checks in world.read_text()
    world.write_text(world.read_text().replace(checks, "    return\n"))  # the world is never checked
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = run_job(run_dir, _planted(run_dir), timeout=180, env={"PYTHONPATH": str(copy_root)})
    assert job.codes == [1], job.output[-3000:]
    res = job.results
    assert [t["outcome"] for t in res["tests"]] == ["passed", "passed"] and res["verdict"] == "partial"
    section = res["attestation"]
    assert (section["reference"], section["modified"], section["extra"], section["missing"]) == \
        ("git", ["acceptance/test_world.py"], [], []), section
    assert "its code is not the shipped suite (git): modified acceptance/test_world.py" in res["reason"]
    assert section["suite_digest"] != attestation.suite_digest()
