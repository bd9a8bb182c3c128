"""``python -m clustergate.report merge``: the node phase's directories -> one cluster report.

    python3 -m clustergate.report merge REPORTS/RUN_ID/nodes/* -o REPORTS/RUN_ID/ [--expect-hosts FILE_OR_HOSTLIST]
        [--thresholds FILE]

Writes into the output directory:

- ``results.json``: the cluster results document (``"kind": "cluster"``, schema below and in
  ``clustergate/cluster/cluster.schema.json``);
- ``report.html``: self-contained, opens offline: the verdict, the hosts in both forms, the excluded
  nodes with their reasons, a table of nodes (verdict, failed tests, worst figure per metric), the
  fleet's distribution of every per-GPU (and per-node) metric, and the fleet outliers;
- ``accepted-hosts.txt`` (one host a line), ``excluded-hosts.txt`` (``HOST<TAB>reason; reason``),
  ``accepted-hostlist.txt`` and ``excluded-hostlist.txt`` (one Slurm hostlist, ``gpu[001-007,009]``).

A node is accepted when its own run accepted it and no GPU of it is a fleet outlier (below the
criterion's ``outlier_fraction`` of the fleet median; a ``severity: warn`` criterion only warns).
Each node's results.json is checked against the schema and its verdict computed again from its
records (``clustergate.verdict.of_record``): a stored "accept" the records do not support is excluded,
saying "records contradict the stored verdict". Every run is held to ``--thresholds`` (default the shipped
file, ``clustergate.cluster.judged_by``): its profile must be there, its recorded digest that profile's and
each stored criterion the profile's. The host the file names must be its directory's name.
Expected hosts (``--expect-hosts``) with no directory, directories without a usable results.json, and
results that still say "running" (a killed or hung run) are excluded as missing; a host with results
that is not expected is excluded too. ``-o`` may not be a node directory, nor hold a node's results.

Exit status: 0 when every node (every expected node, and every node given) was accepted; 1 when any
was excluded or missing; 2 when an input cannot be used.

Cluster results.json (schema 1)::

    {"schema": 1, "kind": "cluster", "verdict": "accept" | "reject", "sign_off": bool,
     "created": ISO-8601, "merge_s": float (reading and judging, before the report is drawn), "output": DIR,
     "expected": {"source": str, "hosts": [str]} | null,
     "counts": {"expected": int | null, "results": int, "accepted": int, "excluded": int, "missing": int,
                "fleet_outliers": int},
     "accepted": [host], "accepted_hostlist": str,
     "excluded": [{"host", "phase": "node", "reasons": [str]}], "excluded_hostlist": str,
     "thresholds": str, "profiles": [str], "levels": [str], "warnings": [str],
     "nodes": [{"host", "directory", "status": "accepted" | "excluded",
                "verdict": "accept" | "reject" | "running" | "unreadable" | "missing",
                "profile", "level", "started", "duration_s", "ranks", "gpus", "gpu_models": [str],
                "tests": {outcome: count}, "failed_tests": [{"nodeid", "outcome", "summary"}],
                "reasons": [str], "warnings": [str],
                "worst": {metric title: {"value", "unit", "gpu_index", "state": "fail" | ""}}}],
     "fleet": [{"metric", "test", "profile", "unit", "scope": "gpu" | "node" | "world", "criterion",
                "count", "min", "p05", "median", "p95", "max", "floor": float | null,
                "outliers": [{"host", "gpu_index", "gpu_serial", "rank", "value", "severity"}],
                "samples": [[host, gpu_index | null, value]]}]}
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clustergate import resultsfile
from clustergate.cluster import fleet as fleet_mod
from clustergate.cluster.hostlist import HostlistError, compress, read_hosts
from clustergate.cluster.node_runs import ACCEPTED, MergeInputError, NodeRun, missing_node, node_row, read_node
from clustergate.results import write_json
from clustergate.thresholds import Thresholds, ThresholdsError, load, shipped_thresholds
from workloads.heartbeat import Heartbeat

SCHEMA = 1


def parser() -> argparse.ArgumentParser:
    head, _, rest = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(prog="python -m clustergate.report merge", description=head,
                                epilog=rest.split("Cluster results.json")[0].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nodes", nargs="*", type=Path, metavar="NODE_DIR",
                   help="the node phase's report directories (REPORTS/RUN_ID/nodes/*), one per node")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                   help="where results.json, report.html and the host lists go (REPORTS/RUN_ID/)")
    p.add_argument("--expect-hosts", metavar="FILE_OR_HOSTLIST", default=None,
                   help="the hosts that should have a result: a file (one name or hostlist a line) or a Slurm "
                        "hostlist such as gpu[001-016]; a host without a result is excluded as missing")
    add_thresholds_option(p)
    return p


def add_thresholds_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--thresholds", type=Path, default=None, metavar="FILE",
                   help="the thresholds the runs were started with (default: the shipped thresholds.yaml); a run "
                        "judged by other criteria, or whose stored criteria differ from them, is not accepted")


def load_thresholds(path: Path | None) -> Thresholds:
    """The thresholds runs are held to (MergeInputError naming the file when it cannot be used)."""
    try:
        return load(path if path is not None else shipped_thresholds())
    except (ThresholdsError, OSError) as exc:
        raise MergeInputError(f"--thresholds: {exc}") from None


def gather(paths: list[Path], expected: list[str] | None, thresholds: Thresholds) -> tuple[list[NodeRun], list[str]]:
    """Every node given or expected, in host order, and warnings about the input."""
    runs: dict[str, NodeRun] = {}
    warnings: list[str] = []
    beat = Heartbeat("merge: reading and judging node directories", total=len(paths), unit="nodes")
    for done, path in enumerate(paths):
        beat(done)
        if path.is_file() and path.name != "results.json":
            warnings.append(f"{path}: not a node directory, left out")
            continue
        run = read_node(path, thresholds)
        if run.host in runs:
            first = runs[run.host]
            first.reasons.append(f"two result directories name this host ({first.directory} and {run.directory}): "
                                 "which is this node is unknown")
            continue
        runs[run.host] = run
    if expected is not None:
        for host in expected:
            runs.setdefault(host, missing_node(host))
        extra = sorted(set(runs) - set(expected))
        for host in extra:  # a host outside the list is not one of the cluster's nodes, whatever it measured
            runs[host].reasons.append("not an expected host (--expect-hosts): a result from a node outside the "
                                      "cluster is never accepted")
        if extra:
            warnings.append(f"{len(extra)} hosts have results but were not expected, excluded: {compress(extra)}")
    return [runs[h] for h in sorted(runs)], warnings


def judge_nodes(paths: list[Path], expected: list[str] | None, thresholds: Thresholds
                ) -> tuple[list[NodeRun], list[fleet_mod.FleetMetric], int, list[str]]:
    """Every node read and judged, then set against the fleet: what merge writes and sign-off checks again."""
    runs, warnings = gather(paths, expected, thresholds)
    fleet = fleet_mod.collect(runs)
    outliers = fleet_mod.judge_outliers(fleet, runs)
    return runs, fleet, outliers, warnings


def check_output(output: Path, paths: list[Path]) -> None:
    """The output directory must not be one of the node directories, nor hold a node's own results: merge
    would overwrite the evidence it was given (MergeInputError)."""
    target = output.resolve()
    for path in paths:
        directory = path.parent if path.name == "results.json" else path
        if directory.resolve() == target:
            raise MergeInputError(f"-o {output} is one of the node directories given: merge would overwrite "
                                  "that node's results; write to REPORTS/RUN_ID/ (the node directories' parent)")
    existing = output / "results.json"
    if existing.is_file():
        try:
            kind = resultsfile.load_json(existing).get("kind")
        except (resultsfile.ResultsFileError, AttributeError):
            kind = None
        if kind != "cluster":
            raise MergeInputError(f"-o {output} holds a results.json that is not a merge's (a node's run, or "
                                  "unreadable): merge would overwrite it; choose the run's directory REPORTS/RUN_ID/")


def cluster_results(runs: list[NodeRun], fleet: list[fleet_mod.FleetMetric], outliers: int,
                    expected: tuple[str, list[str]] | None, warnings: list[str], output: Path,
                    seconds: float) -> dict[str, Any]:
    accepted = [r.host for r in runs if r.status == ACCEPTED]
    excluded = [r for r in runs if r.status != ACCEPTED]
    with_results = [r.results for r in runs if r.results]
    levels = sorted({str(r.get("level")) for r in with_results})
    if len(levels) > 1:
        warnings.append(f"nodes ran at different levels ({', '.join(levels)}): their figures are not alike")
    nodes = []
    for r in runs:
        row = node_row(r)
        row["worst"] = fleet_mod.worst_figures(r, fleet)
        nodes.append(row)
    return {
        "schema": SCHEMA, "kind": "cluster",
        "verdict": "accept" if runs and not excluded else "reject",
        "sign_off": all(r.get("sign_off", True) for r in with_results),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "merge_s": round(seconds, 3),
        "output": str(output),
        "expected": {"source": expected[0], "hosts": expected[1]} if expected else None,
        "counts": {"expected": len(expected[1]) if expected else None, "results": len(with_results),
                   "accepted": len(accepted), "excluded": len(excluded),
                   "missing": sum(r.verdict in ("missing", "running", "unreadable") for r in runs),
                   "fleet_outliers": outliers},
        "accepted": accepted, "accepted_hostlist": compress(accepted),
        "excluded": [{"host": r.host, "phase": "node", "reasons": r.reasons} for r in excluded],
        "excluded_hostlist": compress(r.host for r in excluded),
        "profiles": sorted({str(r.get("profile")) for r in with_results}), "levels": levels,
        "warnings": warnings, "nodes": nodes, "fleet": [fm.as_json() for fm in fleet],
    }


def write_lists(output: Path, lists: dict[str, Any], prefix: str = "",
                excluded_line: Callable[[dict[str, Any]], str] | None = None) -> None:
    """accepted-hosts.txt (one host a line), excluded-hosts.txt (``HOST<TAB>reasons``) and both as hostlists."""
    line = excluded_line or (lambda e: f"{e['host']}\t{'; '.join(e['reasons'])}")
    (output / f"{prefix}accepted-hosts.txt").write_text("".join(f"{h}\n" for h in lists["accepted"]))
    (output / f"{prefix}excluded-hosts.txt").write_text("".join(f"{line(e)}\n" for e in lists["excluded"]))
    (output / f"{prefix}accepted-hostlist.txt").write_text(lists["accepted_hostlist"] + "\n")
    (output / f"{prefix}excluded-hostlist.txt").write_text(lists["excluded_hostlist"] + "\n")


def merge(paths: list[Path], output: Path, expect: str | None = None,
          thresholds: Path | None = None) -> dict[str, Any]:
    """Read, judge the fleet, write every output; the cluster results dict. Raises MergeInputError,
    HostlistError (ValueErrors) and OSError with what to fix."""
    t0 = time.perf_counter()
    site = load_thresholds(thresholds)
    expected = read_hosts(expect) if expect is not None else None
    if not paths and expected is None:
        raise MergeInputError("no node directories given: pass REPORTS/RUN_ID/nodes/* (and --expect-hosts to "
                              "count nodes that wrote nothing)")
    check_output(output, paths)
    runs, fleet, outliers, warnings = judge_nodes(paths, expected[0] if expected else None, site)
    output.mkdir(parents=True, exist_ok=True)
    cluster = cluster_results(runs, fleet, outliers, (expected[1], expected[0]) if expected else None, warnings,
                              output, time.perf_counter() - t0)
    cluster["thresholds"] = str(site.path)
    # The verdict and the lists first: a report that cannot be drawn must not cost the results.
    write_json(output / "results.json", cluster)
    write_lists(output, cluster)
    from clustergate.report.merge_html import cluster_page  # matplotlib only once the inputs are good

    (output / "report.html").write_text(cluster_page(cluster, fleet))
    return cluster


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    t0 = time.perf_counter()
    try:
        cluster = merge(args.nodes, args.output, args.expect_hosts, args.thresholds)
    except (MergeInputError, HostlistError, OSError) as exc:
        print(f"clustergate.report merge: {exc}", file=sys.stderr)
        return 2
    c = cluster["counts"]
    print(f"{cluster['verdict'].upper()}: {c['accepted']} of {c['accepted'] + c['excluded']} nodes accepted, "
          f"{c['excluded']} excluded ({c['missing']} without a result, {c['fleet_outliers']} fleet-outlier GPUs); "
          f"merged in {time.perf_counter() - t0:.1f} s")
    print(f"accepted: {cluster['accepted_hostlist'] or '(none)'}")
    for e in cluster["excluded"][:20]:
        print(f"excluded: {e['host']}: {'; '.join(e['reasons'])}")
    if len(cluster["excluded"]) > 20:
        print(f"excluded: ... {len(cluster['excluded']) - 20} more in excluded-hosts.txt")
    print(f"report: {args.output / 'report.html'}\nresults: {args.output / 'results.json'}")
    return 0 if cluster["verdict"] == "accept" else 1
