"""The code that runs is the code attested (clustergate.trust.source_import, .loaded_code, .bytecode_cache).

Bytecode is planted for real in a git clone of this checkout, its source left as committed (``git status`` clean),
in the two forms Python takes beside a source: a hash-based pyc it is told not to check, and a timestamp pyc whose
header carries the source's time and size; and in pytest's own form for a module pytest rewrites. Each forged
module writes a file when it runs, and plain Python is shown to run it first: then a run under torchrun compiles the
suite's modules from their source (the file never appears, the all-reduce check runs and the record names nothing),
and a module that loads before the import hook (the package's ``__init__``) makes the run partial naming it.
The image's ``compileall`` and a site's still count as the suite's; the cache is read only where it is the user's own.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import py_compile
import stat
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from complete_runs import NODE_TESTS

from clustergate.trust import bytecode_cache, loaded_code

from torchrun_job import ROOT, job_env, run_job

COLLECTIVE_CHECK = "workloads/interconnect/collective_check.py"
RUN_BODY = "def run(cfg: Config) -> Result:\n"


def clone(tmp_path: Path) -> Path:
    """A git clone of this checkout at its HEAD, as an operator has one (end-to-end runs need the change committed)."""
    target = tmp_path / "clone"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True, capture_output=True)
    subprocess.run(["git", "checkout", "-q", head.stdout.strip()], cwd=target, check=True, capture_output=True)
    return target


def forged_source(source: bytes, marker: Path) -> bytes:
    """``source`` changed: it writes ``marker`` as it is imported, and collective_check's run() returns at once."""
    forged = source.replace(RUN_BODY.encode(), RUN_BODY.encode() + b"    return Result(metrics=(), details={})\n")
    return forged + f"\nopen({str(marker)!r}, 'w').write('the forged bytecode ran')\n".encode()


def forge(checkout: Path, rel: str, form: str, marker: Path) -> Path:
    """Bytecode of a changed ``rel`` left where its loader takes it, the source as it was (bytes and time): ``form``
    is ``unchecked-hash`` (py_compile's UNCHECKED_HASH), ``timestamp`` (the source's time and size in its header)
    or ``pytest`` (pytest's rewritten form, the same header). The bytecode's path."""
    source_path = checkout / rel
    source = source_path.read_bytes()
    times = os.stat(source_path)
    if form == "unchecked-hash":
        source_path.write_bytes(forged_source(source, marker))
        pyc = Path(py_compile.compile(str(source_path), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                                      doraise=True))
        source_path.write_bytes(source)
        os.utime(source_path, ns=(times.st_atime_ns, times.st_mtime_ns))
        return pyc
    code = compile(forged_source(source, marker), str(source_path), "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + b"\0\0\0\0" + struct.pack("<LL", int(times.st_mtime) & 0xFFFFFFFF,
                                                                      times.st_size & 0xFFFFFFFF)
    if form == "timestamp":
        pyc = Path(importlib.util.cache_from_source(str(source_path)))
    else:
        from _pytest.assertion.rewrite import PYC_TAIL

        pyc = source_path.parent / "__pycache__" / (source_path.name[:-3] + PYC_TAIL)
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(header + marshal.dumps(code))
    return pyc


def git_status(checkout: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=checkout, check=True, capture_output=True,
                          text=True).stdout


def python(checkout: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh Python that imports the suite from ``checkout`` (a hang guard: it takes seconds)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=checkout, capture_output=True, text=True,
                          env=job_env({"PYTHONPATH": str(checkout)}), timeout=120)


# ---- runs under torchrun -------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("form", ["unchecked-hash", "timestamp"])
def test_bytecode_from_other_source_never_runs(tmp_path: Path, key_file: Path, form: str) -> None:
    """The issue's reproducer: collective_check's run() gutted in bytecode beside the committed source. Plain Python
    runs it; the run compiles the source, the all-reduce check runs, and the record names no foreign code."""
    checkout = clone(tmp_path)
    marker = tmp_path / "forged-ran"
    pyc = forge(checkout, COLLECTIVE_CHECK, form, marker)
    assert git_status(checkout) == ""  # __pycache__ is ignored: nothing to see
    live = python(checkout, "import workloads.interconnect.collective_check")
    assert live.returncode == 0 and marker.exists(), live.stderr  # Python takes it as the module's code
    marker.unlink()

    job = run_job(checkout, ["acceptance", "-k", "test_world", "--key-file", str(key_file)], timeout=240,
                  env={"PYTHONPATH": str(checkout)}, report_dir=tmp_path / "report")
    res = job.results
    assert not marker.exists(), f"{pyc} ran in the run"
    assert {t["nodeid"].split("::")[-1]: t["outcome"] for t in res["tests"]} == \
        {"test_world_matches_profile": "passed", "test_allreduce_is_exact": "passed"}, job.output[-3000:]
    section = res["attestation"]
    assert (section["reference"], section["modified"], section["extra"]) == ("git", [], []), section
    assert section["foreign_code"] == [] and section["problems"] == [], section
    assert res["verdict"] == "partial" and res["reason"].startswith(
        f"ran less than a complete run: {NODE_TESTS - 2} of the {NODE_TESTS} tests")
    assert "hmac" in res  # the keyed record of the reproducer


@pytest.mark.slow
def test_bytecode_of_what_loads_before_the_hook_makes_the_run_partial_naming_it(tmp_path: Path) -> None:
    """clustergate's own ``__init__`` loads before the hook (pytest rewrites it, as ``-p clustergate`` asks): its
    forged bytecode runs, and the run is partial naming the module and the file."""
    checkout = clone(tmp_path)
    marker = tmp_path / "forged-ran"
    pyc = forge(checkout, "clustergate/__init__.py", "pytest", marker)
    assert git_status(checkout) == ""
    job = run_job(checkout, ["acceptance", "-k", "test_world"], timeout=240, env={"PYTHONPATH": str(checkout)},
                  report_dir=tmp_path / "report")
    # The checker's own bytecode ran: what it can and cannot do then, the contract says.
    assert marker.exists(), job.output[-3000:]
    res = job.results
    assert job.codes == [1] and res["verdict"] == "partial"
    section = res["attestation"]
    assert section["foreign_code"] == [{"module": "clustergate", "file": str(pyc),
                                        "why": "bytecode not compiled from its source, under a header that matches "
                                               "the source"}], section
    assert (f"1 modules of the suite ran code that is not their attested source: clustergate ({pyc}: bytecode not "
            "compiled from its source") in res["reason"]


# ---- the same rules in one process ---------------------------------------------------------------------------------
ATTEST = """
    import json, sys
    import clustergate
    from clustergate.trust import attestation
    checked = attestation.code()
    print(json.dumps({"foreign_code": attestation.section(checked, [], False)["foreign_code"],
                      "modified": list(checked.modified), "extra": list(checked.extra)}))
"""


def attested_in(checkout: Path, before: str = "") -> dict[str, list]:
    proc = python(checkout, textwrap.dedent(before) + textwrap.dedent(ATTEST))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("form", ["unchecked-hash", "timestamp"])
def test_a_forged_module_loaded_before_the_hook_by_python_is_named(tmp_path: Path, form: str) -> None:
    """Without pytest (``clustergate run`` and the other commands), the package's ``__init__``, the hook and what it
    imports load through Python's own importer: a forged pyc of one of them is named."""
    checkout = clone(tmp_path)
    marker = tmp_path / "forged-ran"
    pyc = forge(checkout, "clustergate/trust/suitefiles.py", form, marker)
    said = attested_in(checkout)
    assert marker.exists()
    assert said["foreign_code"] == [{"module": "clustergate.trust.suitefiles", "file": str(pyc),
                                     "why": "bytecode not compiled from its source, under a header that matches the "
                                            "source"}], said


def test_a_suite_package_imported_from_a_zip_is_named_with_the_zip(tmp_path: Path) -> None:
    """workloads zipped and put first on PYTHONPATH: its modules are named by the archive, and the advice is to take
    the archive off the path (no __pycache__ is involved, so removing those folders would change nothing)."""
    archive = tmp_path / "suite.zip"
    files = subprocess.run(["git", "ls-files", "workloads"], cwd=ROOT, check=True, capture_output=True, text=True)
    with zipfile.ZipFile(archive, "w") as z:
        for rel in files.stdout.split():
            if rel.endswith(".py"):
                z.write(ROOT / rel, rel)
    code = ATTEST.replace("print(json.dumps({", "print(json.dumps({'problems': attestation._problems(attestation."
                          "section(checked, [], False)), ")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True,
                          env=job_env({"PYTHONPATH": f"{archive}:{ROOT}"}), timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout.splitlines()[-1])
    named = {c["module"]: (c["file"], c["why"]) for c in said["foreign_code"]}
    assert {"workloads", "workloads.node.gpu_presence"} <= set(named), named
    assert set(named.values()) == {(str(archive), loaded_code.FROM_ARCHIVE)}, named
    line = next(p for p in said["problems"] if "not their attested source" in p)
    assert line.endswith(f"; run the installed suite (or the checkout): take {archive} off PYTHONPATH"), line
    assert "__pycache__" not in line


def test_compileall_bytecode_counts_as_the_suites(tmp_path: Path) -> None:
    """The image's ``compileall`` (as root, timestamp pycs) and a site's (hash-based, under another path: ``-d``) write
    the code the source compiles to: the modules that load through Python's importer take it, and nothing is named
    (code objects compare their code, not the path they were compiled under)."""
    checkout = clone(tmp_path)
    for args in (["-q"], ["-q", "--invalidation-mode", "unchecked-hash", "-d", "/opt/elsewhere", "-f"]):
        done = subprocess.run([sys.executable, "-m", "compileall", *args, "clustergate", "acceptance", "workloads"],
                              cwd=checkout, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        taken = Path(importlib.util.cache_from_source(str(checkout / "clustergate" / "trust" / "suitefiles.py")))
        assert taken.exists()
        said = attested_in(checkout)
        assert said == {"foreign_code": [], "modified": [], "extra": []}, said


def test_a_module_whose_source_changes_after_its_import_is_named_and_after_the_attestation_not_loaded(
        tmp_path: Path) -> None:
    """The hook compiles the bytes it reads: a source changed between its import and the digest is named (the
    digest sees the file restored); one changed after the digest is not loaded at all."""
    checkout = clone(tmp_path)
    target = checkout / "workloads" / "interconnect" / "collective_check.py"
    original = target.read_bytes()
    changed_then_restored = f"""
        from pathlib import Path
        import clustergate
        target = Path({str(target)!r})
        target.write_bytes(target.read_bytes() + b"\\nCHANGED = True\\n")
        import workloads.interconnect.collective_check as m
        assert m.CHANGED and type(m.__loader__).__name__ == "SourceLoader"
        target.write_bytes({original!r})
    """
    said = attested_in(checkout, changed_then_restored)
    assert said["modified"] == [] and said["foreign_code"] == [{
        "module": "workloads.interconnect.collective_check", "file": str(target),
        "why": "compiled from bytes that are not the attested file's (it changed while the run started)"}], said

    after = python(checkout, f"""
        from pathlib import Path
        import clustergate
        from clustergate.trust import attestation
        attestation.code()
        target = Path({str(target)!r})
        target.write_bytes(target.read_bytes() + b"\\nCHANGED = True\\n")
        try:
            import workloads.interconnect.collective_check
        except ImportError as exc:
            print(exc)
    """)
    assert after.stdout.strip() == (f"{target} has changed since this run attested at its start "
                                    "(clustergate.trust.attestation): not loaded; the suite's files must not change "
                                    "while it runs"), after.stdout + after.stderr


# ---- clustergate's own cache ---------------------------------------------------------------------------------------
@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The cache in a folder of the test's (this process's own cache is looked up again afterwards), written to
    whatever PYTHONDONTWRITEBYTECODE says here (it says where Python writes nothing, the cache too)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    bytecode_cache.directory.cache_clear()
    yield tmp_path / "cache"
    bytecode_cache.directory.cache_clear()


def test_the_cache_gives_code_by_its_source_under_the_file_it_is_loaded_from(cache_home: Path) -> None:
    source = b"def f():\n    return 42\n"
    name = bytecode_cache.key(source, "plain")
    assert name != bytecode_cache.key(source + b"\n", "plain") and name != bytecode_cache.key(source, "pytest")
    bytecode_cache.write(name, compile(source, "/one/clone/m.py", "exec", dont_inherit=True))
    where = bytecode_cache.directory()
    assert where is not None and stat.S_IMODE(os.stat(where).st_mode) == 0o700
    code = bytecode_cache.read(name, "/another/clone/m.py")
    assert code is not None and code.co_filename == "/another/clone/m.py"
    function = next(c for c in code.co_consts if hasattr(c, "co_code"))
    assert function.co_filename == "/another/clone/m.py"  # tracebacks and the plugins' check read it
    assert bytecode_cache.read(bytecode_cache.key(b"other", "plain"), "/x.py") is None
    sys.dont_write_bytecode = True  # PYTHONDONTWRITEBYTECODE, -B: nothing is written
    bytecode_cache.write(bytecode_cache.key(b"y = 2\n", "plain"), compile(b"y = 2\n", "m.py", "exec"))
    assert bytecode_cache.read(bytecode_cache.key(b"y = 2\n", "plain"), "m.py") is None


def test_the_cache_is_read_only_where_it_is_the_users_alone(cache_home: Path) -> None:
    source = b"x = 1\n"
    name = bytecode_cache.key(source, "plain")
    bytecode_cache.write(name, compile(source, "m.py", "exec"))
    where = bytecode_cache.directory()
    assert where is not None
    entry = where / name
    entry.chmod(0o664)  # another user of the group could have written it
    assert bytecode_cache.read(name, "m.py") is None
    entry.chmod(0o600)
    assert bytecode_cache.read(name, "m.py") is not None
    entry.rename(where / "elsewhere")
    entry.symlink_to(where / "elsewhere")  # a link is never followed
    assert bytecode_cache.read(name, "m.py") is None
    where.chmod(0o775)
    bytecode_cache.directory.cache_clear()
    assert bytecode_cache.directory() is None  # a folder others may write to is no cache at all


# ---- the cluster commands check the code they run ------------------------------------------------------------------
def command(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m clustergate ARGS`` as an operator runs it from ``checkout`` (a hang guard: it takes seconds)."""
    return subprocess.run([sys.executable, "-m", "clustergate", *args], cwd=checkout, capture_output=True, text=True,
                          env=job_env({"PYTHONPATH": str(checkout)}), timeout=120)


def test_merge_and_signoff_refuse_where_the_package_init_ran_forged_bytecode(tmp_path: Path) -> None:
    """The issue's reproducer, point 5: an unchecked-hash pyc of ``clustergate/__init__.py`` (loaded before the
    importer, before any of the command's code) beside its committed source. Plain Python runs it; merge and signoff
    refuse, exit 4, naming the module and the file, and write nothing. The same commands in the clean clone get past
    the check to their inputs."""
    checkout = clone(tmp_path)
    node = tmp_path / "reports" / "run-x" / "nodes" / "gpu-node-07"
    node.mkdir(parents=True)
    (node / "results.json").write_bytes((ROOT / "tests" / "data" / "fleet" / "node-run.json").read_bytes())
    out = tmp_path / "reports" / "run-x"
    merge = ("merge", str(node), "-o", str(out))
    signoff = ("signoff", str(out))
    clean = [command(checkout, *merge), command(checkout, *signoff)]
    assert all("refused, nothing read or written" not in p.stderr and p.returncode != 4 for p in clean), \
        [p.stderr for p in clean]
    for name in ("merge.json", "signoff.json", "merge.html", "signoff.html"):
        (out / name).unlink(missing_ok=True)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "reports").rglob("*"))

    marker = tmp_path / "forged-ran"
    pyc = forge(checkout, "clustergate/__init__.py", "unchecked-hash", marker)
    assert git_status(checkout) == ""
    for args in (merge, signoff):
        proc = command(checkout, *args)
        assert marker.exists(), proc.stderr  # the forged package ran first, as it would have for an ACCEPT
        marker.unlink()
        assert proc.returncode == 4, proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == [
            f"clustergate {args[0]}: refused, nothing read or written: 1 modules of the suite ran code that is not "
            f"their attested source: clustergate ({pyc}: bytecode not compiled from its source, under a header that "
            "matches the source); remove the suite's __pycache__ folders and run again"], proc.stderr
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "reports").rglob("*")) == before
