"""Name the node that failed first in a multi-node job that ended early, in the job output and the report.

When one node's torchrun ends non-zero mid-run (a rank crashed, a node lost its GPU), Slurm's
`srun --kill-on-bad-exit` stops every other node at once, and the ranks that write results.json only
see a SIGTERM or a lost peer: they cannot know which node went first, and where nodes share a host
name torchrun's own summary cannot tell them apart. launch/node.sh leaves one record per node whose
preflight or torchrun ended non-zero (REPORT_DIR/node-exits/NODE.json: node, node_index, stage,
status, time); this reads them after the job step and, for a run that ended early, says which node
failed first:

    python3 launch/first_failure.py REPORT_DIR [--annotate]

prints that line and, with --annotate, adds it to results.json's "error" (so the verdict is reject)
and renders report.html again from it (clustergate render). A run that finished (a reject
that every node agreed on) is left alone: every node then ends non-zero together, none of them first.
Exit status 0, also when there is nothing to say; 2 when REPORT_DIR does not exist.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, get_args

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "clustergate"


def node_exits(report_dir: Path) -> list[dict[str, Any]]:
    """The records node.sh left, earliest first; unreadable ones are skipped (a node may die mid-write)."""
    records = []
    for path in sorted((report_dir / "node-exits").glob("*.json")):
        try:
            record = json.loads(path.read_text())
            record["time"] = float(record["time"])
            records.append(record)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(records, key=lambda r: r["time"])


def ended_early(report_dir: Path, results: dict[str, Any] | None) -> bool:
    """True unless the run finished: progress.jsonl ends its session and results.json has no run error and a
    verdict of a run that ended (accept, reject, partial or unjudged: a narrowed run ends non-zero on every node
    together, none of them first)."""
    from clustergate.record.verdict import VerdictName

    ended = set(get_args(VerdictName)) - {"running"}
    if results is None or results.get("error") or results.get("verdict") not in ended:
        return True
    try:
        return '"session_end"' not in (report_dir / "progress.jsonl").read_text()
    except OSError:
        return True


def describe(records: list[dict[str, Any]]) -> str:
    """One sentence naming the first node to fail, and the others that ended on their own after it."""
    first = records[0]
    when = time.strftime("%H:%M:%S", time.gmtime(first["time"])) + f".{int(first['time'] % 1 * 1000):03d} UTC"
    index = f" (node index {first['node_index']})" if str(first.get("node_index", "")) != "" else ""
    stage = first.get("stage", "torchrun")
    text = (f"node {first['node']}{index} failed first: its {stage} exited {first['status']} at {when}; "
            "the other nodes were stopped after it")
    later = [f"{r['node']} (exit {r['status']}, +{r['time'] - first['time']:.1f} s)" for r in records[1:]]
    if later:
        text += f" (then {', '.join(later)})"
    return text


def annotate(report_dir: Path, results: dict[str, Any], note: str) -> None:
    """Add ``note`` to results.json's error and render report.html again from it."""
    from clustergate.record.results import write_json  # the checkout's writer: atomic, the format the plugin uses
    from clustergate.record.verdict import decide  # the one verdict rule: a run-level error rejects

    error = results.get("error") or ""
    if note in error:
        return
    results["error"] = f"{error}\n{note}".strip()
    # A run whose leader died mid-run may have left a verdict from before the failure.
    results["verdict"] = decide((t.get("outcome", "") for t in results.get("tests", [])),
                                error=results["error"], finished=True).verdict
    path = report_dir / "results.json"
    write_json(path, results)
    render = subprocess.run([sys.executable, "-m", "clustergate", "render", str(path), "-o",
                             str(report_dir / "report.html")], cwd=ROOT, stdout=subprocess.DEVNULL, check=False,
                            timeout=300)
    if render.returncode not in (0, 1):  # 0 accept, 1 reject: a report was written either way
        print(f"{PREFIX}: report.html was not rendered again (status {render.returncode}): "
              f"clustergate render {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report_dir", type=Path, help="the job's report directory")
    parser.add_argument("--annotate", action="store_true",
                        help="also add the finding to results.json's error and render report.html again")
    parser.add_argument("--job-status", type=int, metavar="STATUS",
                        help="print the job's exit status instead, given the job step's STATUS: that of the "
                             "verdict (0 accept, 1 not) for a run that ended on every node with its verdict, "
                             "else STATUS")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # clustergate from this checkout, installed or not
    if not args.report_dir.is_dir():
        print(f"{PREFIX}: report directory {args.report_dir} does not exist", file=sys.stderr)
        return 2
    records = node_exits(args.report_dir)
    results_path = args.report_dir / "results.json"
    try:
        results = json.loads(results_path.read_text()) if results_path.exists() else None
    except ValueError:
        results = None
    if args.job_status is not None:
        # srun --kill-on-bad-exit signals the nodes still ending when the first exits 1 (status 143 for the
        # step): for a run every node ended with its verdict, the verdict, not that race, gives the status.
        finished = results is not None and not ended_early(args.report_dir, results)
        print(args.job_status if not finished else 0 if results["verdict"] == "accept" else 1)
        return 0
    if not records or not ended_early(args.report_dir, results):
        return 0
    note = describe(records)
    print(f"{PREFIX}: {note}", flush=True)
    if args.annotate and results is not None:
        try:
            annotate(args.report_dir, results, note)
        except (ImportError, OSError, subprocess.SubprocessError) as exc:
            said = getattr(exc, "strerror", None) or exc  # clustergate itself may be what failed to import
            print(f"{PREFIX}: could not add this to {results_path} ({said}); render the report again with "
                  f"clustergate render {results_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
