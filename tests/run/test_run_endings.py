"""End to end under torchrun on gloo (2 ranks, real processes): every way a run can end early leaves a
verdict that tells the truth, within a stated time, naming what happened, where and on
which rank.

Times are measured from the planted event (a signal sent, a rank that leaves), not from the start, so
they do not depend on how long torch takes to import on a busy machine. Each bound says where it
comes from.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from report_runs import schema_errors
from secret_samples import everything, leaks
from waited_out_runs import ended, waited_out  # noqa: F401  (waited_out: the fixture)

from clustergate.common.exit_codes import Exit
from clustergate.report.summary import summary_lines
from clustergate.run.launch.command import verdict_of
from clustergate.secrets.redact import REDACTED

from torchrun_job import (
    ROOT,
    JobResult,
    foreground_signals,
    frames_of_ours,
    job_env,
    plant,
    run_job,
    start_job,
    wait_for,
)

HOST = socket.gethostname()
LEFT_WITHIN_S = 60.0
"""A rank that leaves early ends every other rank within 60 s (not the 300-900 s watchdog)."""

pytestmark = pytest.mark.slow


def note(case: str, r: JobResult, seconds: float, res: dict | None, message: str) -> None:
    """One row of a table of endings, when CLUSTERGATE_ENDINGS_TABLE names a file: the exit
    status (torchrun's, and each rank's as its summary reports it), verdict, seconds and message."""
    table = os.environ.get("CLUSTERGATE_ENDINGS_TABLE")
    if not table:
        return
    ranks = dict(re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*: (-?\d+)", r.output))
    with open(table, "a") as f:
        f.write(json.dumps({"case": case, "codes": r.codes, "ranks": ranks, "seconds": round(seconds, 1),
                            "verdict": (res or {}).get("verdict"), "message": message}) + "\n")


def assert_valid(res: dict) -> None:
    assert schema_errors(res) == [], res


def test_sigint_to_the_job_rejects_and_names_rank_and_test(waited_out: dict[str, Any],  # noqa: F811
                                                            request: pytest.FixtureRequest) -> None:
    """Ctrl-C on torchrun while rank 0 is blocked in a collective (it cannot run a Python handler) and
    rank 1 is in Python. (The job runs beside the suite's other jobs that wait out a timer:
    tests/helpers/waited_out_runs.py, which sends the SIGINT once both ranks are in the test.)"""
    r, seen = ended(waited_out, request)
    # Rank 0's signal thread gives the main thread 20 s to unwind, then ends it: before torchrun's own
    # SIGKILL, 30 s after it forwarded the SIGINT (that SIGKILL would leave exit code -9).
    res = r.results
    note("SIGINT to torchrun (rank 0 blocked in a collective)", r, seen["took"], res, res["error"])
    assert seen["took"] < 30, r.output
    assert r.codes != [0], r.output
    assert_valid(res)
    assert res["verdict"] == "reject", res
    assert f"interrupted by SIGINT on rank 0 ({HOST}) during test_fault.py::test_blocked [call]" in res["error"]
    [test] = res["tests"]
    assert test["outcome"] == "interrupted"  # never "passed", and not a failure of the test
    assert "exitcode  : -9" not in r.output  # no rank was left for torchrun to kill
    # No rank caused it: run again (it says nothing about the node), and the test never reached is counted (rank 0,
    # blocked in C++, was ended before it could print its summary: the summary drawn from its record says it).
    assert res["interrupted"] is True and {(a["category"], a["escalate"]) for a in res["actions"]} == \
        {("interrupted", None)}, res["actions"]
    assert "tests: 1 interrupted, 1 never ran" in summary_lines(res) and "isolate" not in r.output, r.output


def test_sigint_without_torchrun_rejects(tmp_path: Path) -> None:
    """Ctrl-C on plain ``pytest`` (world size 1): pytest unwinds, the outputs are written, the verdict is reject."""
    (tmp_path / "test_fault.py").write_text("import time\nfrom pathlib import Path\n\n\ndef test_sleeps():\n"
                                            "    Path('ready-0').touch()\n    time.sleep(120)\n\n\n"
                                            "def test_never_reached():\n    pass\n")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "clustergate", "--color=yes",
                             "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "--report-dir",
                             str(tmp_path / "report"), "--thresholds", str(ROOT / "thresholds.yaml"), "test_fault.py"],
                            cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=foreground_signals)
    wait_for(tmp_path / "ready-0")
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=60)  # a hang guard: the product's own bound is 20 s, asserted below
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"pytest still running 60 s after SIGINT; its output:\n{out[-6000:]}")
    res = json.loads((tmp_path / "report" / "results.json").read_text())
    note("SIGINT to plain pytest (world size 1)", JobResult([proc.returncode], out, time.monotonic() - sent,
                                                            tmp_path / "report"), time.monotonic() - sent, res,
         res["error"])
    assert time.monotonic() - sent < 20, out  # pytest unwinds at once; 20 s is the grace before a forced end
    assert proc.returncode == Exit.NOT_ACCEPTED, out  # interrupted: the run did not finish
    assert_valid(res)
    assert res["verdict"] == "reject", res
    assert res["error"] == f"interrupted by SIGINT on rank 0 ({HOST}) during test_fault.py::test_sleeps [call]"
    assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "junit.xml").exists()
    # The test it was in is interrupted, not passed, and junit.xml counts it as an error.
    [test] = res["tests"]
    assert test["outcome"] == "interrupted", test
    # No rank caused it: run again, not a node to isolate; the test never reached is counted.
    assert res["interrupted"] is True and {(a["category"], a["escalate"]) for a in res["actions"]} == \
        {("interrupted", None)}, res["actions"]
    assert "tests: 1 interrupted, 1 never ran" in out and "do: retest: the run was interrupted before it finished" \
        in out and "isolate" not in out, out
    # It says nothing about the node: INTERRUPTED, in yellow, never the reject's red REJECT.
    [first] = [line for line in out.splitlines() if "profile cpu   level" in line]
    assert "INTERRUPTED" in first and "REJECT" not in first and "\x1b[33m" in first and "\x1b[31m" not in first, first
    assert verdict_of(res, proc.returncode, None).startswith("clustergate run: INTERRUPTED: interrupted by SIGINT")
    assert 'class="cg-banner cg-unjudged" id="cg-verdict"><div class="cg-verdict">INTERRUPTED<' in \
        (tmp_path / "report" / "report.html").read_text()
    # junit.xml counts the test it was in as an error, and the verdict's testcase says interrupted, an error too.
    junit = ET.parse(tmp_path / "report" / "junit.xml").getroot()
    suite = junit if junit.tag == "testsuite" else junit.find("testsuite")
    assert suite is not None and suite.get("errors") == "2" and suite.get("failures") == "0", ET.tostring(junit)
    case, verdict = suite.iter("testcase")
    assert case.get("name") == "test_sleeps" and case.find("error") is not None, ET.tostring(case)
    error = verdict.find("error")
    assert (verdict.get("classname"), verdict.get("name")) == ("clustergate", "verdict") and error is not None
    assert error.get("type") == "interrupted" and error.get("message", "").startswith(
        f"INTERRUPTED: {res['error']} (exit 1)"), ET.tostring(verdict)


def test_no_secret_reaches_any_output(tmp_path: Path) -> None:
    """Secrets by name (NCCL_IB_AUTH_TOKEN, SITE_PASSWORD) and by value: a secret of every format in NCCL_* values
    (the report's environment table shows them) and, in no variable, in what the test says (its assertion message,
    its log, its details). None reaches an output of the run, the results store, the merge and the sign-off of its
    cluster run (made where none of the secrets is in the environment), or the merge's evidence bundle; what failed
    still reads."""
    token, password = "tok-planted-8c41f0e2a9", "pa55-planted-w0rd"
    in_env, said = everything("environment"), everything("message")
    (tmp_path / "planted-messages.json").write_text(json.dumps([p.text for p in said.values()]))
    run_dir, store = tmp_path / "reports" / "run-secrets", tmp_path / "store.db"
    env = {"NCCL_IB_AUTH_TOKEN": token, "SITE_PASSWORD": password, "CLUSTERGATE_RUN_ID": run_dir.name,
           "CLUSTERGATE_NODE_NAME": "cg-leak", "CLUSTERGATE_STORE": str(store),
           **{f"NCCL_PLANTED_{i}": p.text for i, p in enumerate(in_env.values())}}
    r = run_job(tmp_path, plant(tmp_path, "leaks_secrets"), timeout=180, env=env,
                report_dir=run_dir / "nodes" / "cg-leak")
    said_line = next(line for line in r.results["tests"][0]["message"].splitlines()
                     if line.startswith("E ") and "planted failure" in line)
    note("token in the environment", r, r.seconds, r.results, said_line.strip())
    assert r.codes == [1], r.output
    cluster = [[sys.executable, "-m", "clustergate", "merge", str(r.report_dir), "-o", str(run_dir)],
               [sys.executable, "-m", "clustergate", "signoff", str(run_dir)]]
    merged, signed = (subprocess.run(argv, cwd=ROOT, env=job_env({"CLUSTERGATE_STORE": str(store)}), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120) for argv in cluster)
    bundle = run_dir / "evidence" / "evidence-cg-leak.tar.gz"
    assert merged.returncode == 1 and bundle.is_file(), merged.stdout  # the node excluded, its evidence bundled
    assert signed.returncode == 1 and (run_dir / "signoff.json").is_file(), signed.stdout
    written = {str(p.relative_to(run_dir)): p.read_bytes().decode("utf-8", "replace")
               for p in run_dir.rglob("*") if p.is_file() and p != bundle}
    node_outputs = {f"nodes/cg-leak/{n}" for n in ("results.json", "report.html", "junit.xml", "progress.jsonl",
                                                   "metrics.prom")}
    assert node_outputs | {"results.json", "report.html", "metrics.prom", "excluded-hosts.txt", "signoff.json",
                           "signoff.html", "signoff-metrics.prom"} <= set(written), sorted(written)
    with tarfile.open(bundle) as tar:
        written |= {f"bundle: {m.name}": tar.extractfile(m).read().decode("utf-8", "replace")  # type: ignore[union-attr]
                    for m in tar.getmembers() if m.isfile()}
    written |= {"terminal": r.output, "merge's terminal": merged.stdout, "signoff's terminal": signed.stdout,
                "the store": store.read_bytes().decode("utf-8", "replace")}
    planted = {**{f"{k} in NCCL_*": v for k, v in in_env.items()}, **{f"{k} said": v for k, v in said.items()}}
    shown = {name: leaks(text, planted) for name, text in written.items()}
    assert not any(shown.values()), {name: found for name, found in shown.items() if found}
    for name, text in written.items():
        assert token not in text and password not in text, name
    message = r.results["tests"][0]["message"]
    assert "planted failure quoting [redacted] and https://[redacted]@example.org/x" in message
    assert f"--password={REDACTED}" in message and '{"password": "[redacted]"}' in message  # only the secret goes
    assert r.results["tests"][0]["details"]["nccl_env"] == {"NCCL_IB_AUTH_TOKEN": REDACTED, "NCCL_DEBUG": "WARN"}
    report = written["nodes/cg-leak/report.html"]
    assert "connecting with [redacted]" in report  # captured output kept, scrubbed
    assert "NCCL_PLANTED_0&#34;: &#34;[redacted]&#34;" in report  # the environment table names it, without its value
    assert "planted failure quoting [redacted]" in r.output  # the terminal says what failed, without the token


def test_read_only_report_dir_is_one_usage_error_naming_it(tmp_path: Path) -> None:
    report = tmp_path / "report"
    report.mkdir()
    report.chmod(0o555)
    readonly = os.system(f"chattr +i {report} 2>/dev/null") == 0 if os.geteuid() == 0 else True
    try:
        if not readonly:
            pytest.skip("root here and chattr +i unavailable: no way to make a read-only directory")
        r = run_job(tmp_path, plant(tmp_path, "healthy"), timeout=120)
    finally:
        os.system(f"chattr -i {report} 2>/dev/null")
        report.chmod(0o755)
    message = f"ERROR: --report-dir {report}: cannot write in it"
    said = next((line.partition("traceback : ")[2] for line in r.output.splitlines() if message in line), "")
    note("read-only report dir", r, r.seconds, None, said)
    assert r.codes == [1], r.output  # the run's 4 (could not run), in torchrun's summary; torchrun reports 1
    assert r.output.count(message) == 2, r.output  # first by rank 0, then by torchrun's summary
    assert "INTERNALERROR" not in r.output and not frames_of_ours(r.output), r.output
    assert not (report / "results.json").exists()


def test_second_run_into_a_held_dir_refuses_and_earlier_outputs_move_aside(tmp_path: Path) -> None:
    first = start_job(tmp_path, plant(tmp_path, "holds_the_dir"), timeout=180)
    wait_for(tmp_path / "a-running")
    (tmp_path / "second").mkdir()
    second = run_job(tmp_path / "second", [*plant(tmp_path / "second", "healthy"), "--report-dir",
                                           str(tmp_path / "report")], timeout=120)
    (tmp_path / "b-done").touch()
    r = first.wait()
    said = next((line for line in second.output.splitlines() if "is in use by another" in line), "")
    note("second run into a locked report dir", second, second.seconds, None, said)
    assert second.codes == [1], second.output
    assert f"ERROR: --report-dir {tmp_path / 'report'} is in use by another clustergate run (pid" in second.output
    assert r.codes == [0], r.output
    assert r.results["verdict"] == "accept"
    third = run_job(tmp_path, plant(tmp_path, "healthy"), timeout=120)  # again into the same directory
    assert third.codes == [0], third.output
    [earlier] = (tmp_path / "report" / "earlier").iterdir()
    assert {p.name for p in earlier.iterdir()} == {"results.json", "report.html", "junit.xml", "progress.jsonl",
                                                  "metrics.prom"}
    assert json.loads((earlier / "results.json").read_text())["tests"][0]["nodeid"].endswith("test_holds_the_run")
    assert third.results["tests"][0]["nodeid"].endswith("test_records_a_metric")


def test_an_accepted_run_runs_the_exit_handlers_before_it_leaves(tmp_path: Path) -> None:
    """An accepted run leaves by the run's one way out (no interpreter teardown), but Python's exit handlers
    still run: pytest's unlocks its temporary directories (a locked one is never pruned), clustergate's own
    remove NCCL's log directory and release the report directory."""
    marks, temproot = tmp_path / "marks", tmp_path / "temproot"
    marks.mkdir()
    temproot.mkdir()
    r = run_job(tmp_path, plant(tmp_path, "exit_handlers"), timeout=180,
                env={"EXIT_HANDLER_MARKS": str(marks), "PYTEST_DEBUG_TEMPROOT": str(temproot)})
    assert r.codes == [0] and r.results["verdict"] == "accept", r.output
    assert sorted(p.name for p in marks.iterdir()) == ["rank-0", "rank-1"], r.output
    made = list(temproot.rglob("scratch"))
    assert len(made) == 2 and not list(temproot.rglob("*.lock")), sorted(map(str, temproot.rglob("*")))


def test_a_full_disk_ends_the_run_and_never_reads_accept(tmp_path: Path) -> None:
    r = run_job(tmp_path, plant(tmp_path, "disk_fills"), timeout=120)
    after = time.time() - float((tmp_path / "filled-at").read_text())
    said = next((line for line in r.output.splitlines() if "File too large" in line), "")
    note("full disk on rank 0 (RLIMIT_FSIZE)", r, after, r.results, said)
    assert after < LEFT_WITHIN_S, r.output  # rank 0 stops at its next write; rank 1 sees it gone at once
    assert r.codes == [1], r.output
    assert "File too large" in r.output and f"on rank 0 ({HOST})" in r.output, r.output
    res = r.results
    assert res["verdict"] == "running", res  # the last write that succeeded; it could write no more


def test_results_say_running_from_the_start_with_selection_and_world(tmp_path: Path) -> None:
    r = run_job(tmp_path, [*plant(tmp_path, "sees_running"), "-k", "running", "--level", "quick"], timeout=120)
    res = r.results
    assert_valid(res)
    assert [t["outcome"] for t in res["tests"]] == ["passed"], r.output  # it checked the file while the run ran
    # -k left a test of the suite out: a partial run, exit 1, never accept.
    assert r.codes == [1] and res["verdict"] == "partial" and "-k 'running'" in res["reason"], r.output
    assert res["selection"] == {"k": "running", "m": None, "level": "quick", "selected": 1, "deselected": 1,
                                "multinode": 0, "multinode_deselected": 0, "suite": ".", "args": ["test_fault.py"],
                                "deselect": [], "modes": [], "maxfail": 0}
    assert "1 of 2 tests selected (-k 'running', level quick)" in r.output
