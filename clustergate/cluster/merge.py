"""``clustergate merge``: the node phase's directories -> one cluster report.

    clustergate merge REPORTS/RUN_ID/nodes/* -o REPORTS/RUN_ID/ [--expect-hosts FILE_OR_HOSTLIST]
        [--thresholds FILE] [--profile NAME] [--level LEVEL] [--run-id RUN_ID] [--window HOURS]
        [--key-file FILE]

Writes into the output directory:

- ``results.json``: the cluster results document (``"kind": "cluster"``, schema below and in
  ``clustergate/cluster/cluster.schema.json``);
- ``report.html``: self-contained, opens offline: the verdict, the hosts in both forms, the excluded
  nodes with their reasons, a table of nodes (verdict, failed tests, worst figure per metric; excluded first, at
  most ``merge_html.NODES_SHOWN``), the
  fleet's distribution of every per-GPU and per-node metric with its outliers marked, and the fleet outliers;
- ``accepted-hosts.txt`` (one host a line), ``excluded-hosts.txt`` (``HOST<TAB>reason; reason<TAB>ACTION``,
  ACTION one of isolate, reset, config, retest, vendor: ``clustergate.record.actions``), ``accepted-hostlist.txt`` and
  ``excluded-hostlist.txt`` (one Slurm hostlist, ``gpu[001-007,009]``);
- ``metrics.prom``: the merge in the OpenMetrics text format (``clustergate.report.openmetrics``), for node_exporter's
  textfile collector;
- ``evidence/evidence-HOST.tar.gz`` for every excluded host with a node directory
(``clustergate.record.evidence_bundle``:
  its report, XID lines, ``nvidia-smi -q`` where captured, the profile), for a vendor ticket.

With a results store (``--store``, else ``$CLUSTERGATE_STORE``) every finished node run read is recorded into it,
then the cluster results.json; what cannot be recorded is a warning, never a change of verdict.

A node is accepted when its own run accepted it as a complete node run at ``--level`` or more (default
standard: a run that ran less, by any option, is partial and excluded, saying what it left out), no part
of it (a GPU, or the node's own figure) is a fleet outlier (outside the criterion's ``outlier_fraction`` or
``outlier_multiple`` of the fleet median for its profile, whatever the criterion's severity:
``clustergate.cluster.fleet``), and it has the GPUs most nodes of its model have. Each node's results.json is
checked against the schema and its verdict computed again from its records and the suite's manifest
(``clustergate.record.verdict.of_record``): a stored "accept" the records do not support is excluded, saying "records
contradict the stored verdict". Every run
is held to ``--thresholds`` (default the shipped file, ``clustergate.cluster.judged_by``): its profile must be
there, its recorded digest that profile's and each stored criterion the profile's. Where no run was judged by
them (a site profile's runs merged without its file) the command line is wrong, not every node: exit 2, one line
naming the profile and digest the runs were judged by, nothing written. The host the file names
must be its directory's name. Each node file must be this cluster run's (``clustergate.cluster.binding``):
its run id ``--run-id`` (default: the name of the directory above ``nodes/``), the suite this clustergate
runs (its suite digest), the fleet's profile (``--profile``, else the one every node run agrees on; runs that
disagree without it are an input error) and no dry run beside GPU nodes, started within ``--window`` hours of
the node phase's median start, and under a GPU profile GPUs whose serials and UUIDs are identities (not
NVML's placeholders) that no other host names. Its skips must be earned in the fleet too: a node that skips
a test as unsupported that another node ran, or for having no InfiniBand port where another has one, is
partial (``clustergate.trust.completeness.fleet_problems``). With a site key (``--key-file``, else
``$CLUSTERGATE_KEY_FILE``: ``clustergate.trust.keyed``) every node file must carry a valid HMAC, and the merged
results.json is signed and keeps each node file's keyed digest; without one, the sha256 digest of each.
Expected hosts (``--expect-hosts``) with no directory, directories without a usable results.json, and results
that still say "running" (a killed or hung run) are excluded as missing; a host with results that is not
expected is excluded too. ``-o`` may not be a node directory, nor hold a node's results. The whole command line
and every input are checked first: a refused merge changes nothing. Only then, its result about to be written, are
an earlier merge's outputs there moved to ``earlier/<UTC time>/`` (saying where), and every file is written
whole, never through a link. An excluded host's evidence bundle says why it was excluded.

Exit status: 0 when every node (every expected node, and every node given) was accepted; 1 when any
was excluded or missing; 2 when an input cannot be used; 4 when an output cannot be written (a full disk).

Cluster results.json (schema 1)::

    {"schema": 1, "kind": "cluster", "verdict": "accept" | "reject", "sign_off": bool,
     "created": ISO-8601, "merge_s": float (reading and judging, before the report is drawn), "output": DIR,
     "run_id": str, "level": str (the level required), "manifest": str (digest of the suite's manifest),
     "profile": str | null (the fleet's), "profile_source": str, "dry_run": bool (a cpu-profile fleet),
     "suite_digest": "sha256:..." (this clustergate's), "signed": bool,
     "window": {"hours", "median_start", "from", "to"},
     "expected": {"source": str, "hosts": [str]} | null,
     "counts": {"expected": int | null, "results": int, "accepted": int, "excluded": int, "missing": int,
                "fleet_outliers": int},
     "accepted": [host], "accepted_hostlist": str,
     "excluded": [{"host", "phase": "node", "reasons": [str], "action": str, "steps": [step],
                   "evidence": "evidence/evidence-HOST.tar.gz" | null}], "excluded_hostlist": str,
     "thresholds": str, "profiles": [str], "levels": [str], "warnings": [str],
     "nodes": [{"host", "directory", "digest": "sha256:..." | "hmac-sha256:..." | null, "run_id",
                "status": "accepted" | "excluded",
                "verdict": "accept" | "reject" | "partial" | "unjudged" | "running" | "unreadable" | "missing"
                           | "unbound",
                "profile", "level", "started", "duration_s", "ranks", "gpus", "gpu_models": [str],
                "tests": {outcome: count}, "failed_tests": [{"nodeid", "outcome", "summary"}],
                "reasons": [str], "warnings": [str],
                "drift": [{"metric", "where", "unit", "first", "now", "fraction", "limit", "severity", "criterion"}]}]
              (each node file referenced by its directory and digest, its figures not copied: a merge's record grows
              by under 1 KB a node, 100,000 nodes far under the 512 MiB its readers take),
     "fleet": [{"metric", "test", "profile", "unit", "scope": "gpu" | "node" | "world", "criterion",
                "count", "min", "p05", "median", "p95", "max", "floor": float | null, "limit": float | null,
                "outliers": [{"host", "gpu_index", "gpu_serial", "rank", "part", "value", "severity"}],
                "failing": [value] (the parts that fail, by their node's run or against the fleet),
                "histogram": {"edges": [float], "counts": [int]} (at most 40 bins: ``fleet.histogram``)}]}
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clustergate.cluster import binding, firmware_fleet, judged_by, node_facts, store_record
from clustergate.cluster import excluded as excluded_mod
from clustergate.cluster import fleet as fleet_mod
from clustergate.cluster.node_runs import (
    ACCEPTED,
    Exclusion,
    MergeInputError,
    NodeRun,
    missing_node,
    node_row,
    read_node,
)
from clustergate.common.exit_codes import refused
from clustergate.common.hostlist import HostlistError, compress, read_hosts
from clustergate.common.terminal import error_text, main_guarded
from clustergate.criteria.against_shipped import weakenings
from clustergate.criteria.thresholds import Profile, Thresholds, ThresholdsError, load, shipped_thresholds
from clustergate.record import resultsfile
from clustergate.record.evidence_bundle import BundleError
from clustergate.record.outputs import (
    OutputError,
    Parser,
    keep_earlier,
    refuse_inputs,
    refuse_not_directory,
    refuse_not_files,
    write_text,
)
from clustergate.record.results import encode, signed
from clustergate.report import openmetrics
from clustergate.secrets.redact import keep
from clustergate.store import Store, store_path, store_problem
from clustergate.store.command import add_store_options
from clustergate.trust import attestation, completeness, keyed, known_metrics, skip_facts
from clustergate.trust import manifest as suite_manifest
from clustergate.trust.manifest import LEVELS
from workloads.heartbeat import Heartbeat
from workloads.node.name import node_name

SCHEMA = 1
DEFAULT_LEVEL = "standard"
LISTS = ("accepted-hosts.txt", "excluded-hosts.txt", "accepted-hostlist.txt", "excluded-hostlist.txt")
OUTPUTS = ("results.json", "report.html", "metrics.prom", excluded_mod.EVIDENCE, *LISTS)
"""What a merge writes into -o; an earlier merge's are moved to earlier/<UTC time>/ before any is written."""
DIRECTORIES = (excluded_mod.EVIDENCE,)
"""Those of merge's outputs that are directories (the rest are files)."""


def parser() -> argparse.ArgumentParser:
    head, _, rest = __doc__.partition("\n\n")
    p = Parser(prog="clustergate merge", description=head,
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
    p.add_argument("--profile", default=None, metavar="NAME",
                   help="the profile that judges this cluster run (default: the one every node run was judged by; "
                        "runs that disagree need it): a node run judged by another is excluded")
    add_level_option(p)
    p.add_argument("--run-id", default=None, metavar="RUN_ID",
                   help="the cluster run the node files must belong to (their CLUSTERGATE_RUN_ID; default: the name "
                        "of the directory above nodes/, RUN_ID of REPORTS/RUN_ID/nodes/*)")
    p.add_argument("--window", type=_hours, default=binding.WINDOW_H, metavar="HOURS",
                   help=f"a node file must have started within this many hours of the node phase's median start "
                        f"(default {binding.WINDOW_H:g})")
    add_key_option(p)
    add_store_options(p)
    return p


def add_key_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key-file", default=None, metavar="FILE",
                   help=f"the site key (default: ${keyed.KEY_ENV}): every results.json read must carry a valid HMAC "
                        "(a file without one is excluded, naming it), and what is written is signed; a file only "
                        "this user can read (chmod 600)")


def site_key(given: str | None) -> bytes | None:
    """The site key of ``--key-file`` or ``$CLUSTERGATE_KEY_FILE`` (MergeInputError naming the file: exit 2)."""
    try:
        return keyed.given_key(given)
    except keyed.KeyFileError as exc:
        raise MergeInputError(str(exc)) from None


def signed_text(record: dict[str, Any], key: bytes | None) -> str:
    """A merged record or sign-off as written: signed on this host with the site key where there is one."""
    return encode(signed(record, key, node_name()) if key is not None else record)


def as_written(record: dict[str, Any], key: bytes | None) -> tuple[str, dict[str, Any]]:
    """The text of a merged record or sign-off as written (``signed_text``: redacted, signed where there is a key),
    and the record that text says, which every other output (the lists, the metrics, the page) shows: redacted once,
    as it is written, not again for each."""
    text = signed_text(record, key)
    shown = json.loads(text)
    shown.pop(keyed.FIELD, None)
    return text, shown


def _hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 24 * 365:  # nan fails this too
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hours above 0")
    return value


def add_level_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--level", choices=LEVELS, default=DEFAULT_LEVEL,
                   help=f"the level the site requires: a node run at a lower level ran less and is excluded "
                        f"(default {DEFAULT_LEVEL})")


def add_thresholds_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--thresholds", type=Path, default=None, metavar="FILE",
                   help="the thresholds the runs were started with (default: the shipped thresholds.yaml); a run "
                        "judged by other criteria, or whose stored criteria differ from them, is not accepted")


def load_thresholds(path: Path | None) -> Thresholds:
    """The thresholds runs are held to (MergeInputError naming the file when it cannot be used)."""
    try:
        return known_metrics.check(load(path if path is not None else shipped_thresholds()))
    except (ThresholdsError, OSError) as exc:
        raise MergeInputError(f"--thresholds: {error_text(exc)}") from None


def gather(paths: list[Path], expected: list[str] | None, thresholds: Thresholds,
           level: str = DEFAULT_LEVEL, key: bytes | None = None,
           collector: fleet_mod.Collector | None = None) -> tuple[list[NodeRun], list[Exclusion], list[str]]:
    """Every node given or expected, in host order; the exclusions the directories call for (two name one host, a
    host not expected); and warnings about the input. Each node file is read once and kept only as the facts the
    later steps need (``node_facts.keep``), its figures put into ``collector`` first: the memory of a merge does not
    grow with each node's detail."""
    runs: dict[str, NodeRun] = {}
    found: list[Exclusion] = []
    warnings: list[str] = []
    beat = Heartbeat("merge: reading and judging node directories", total=len(paths), unit="nodes")
    for done, path in enumerate(paths):
        beat(done)
        if path.is_file() and path.name != "results.json":
            warnings.append(f"{path}: not a node directory, left out")
            continue
        run = read_node(path, thresholds, level, key)
        if run.host in runs:
            first = runs[run.host]
            found.append(Exclusion(run.host, f"two result directories name this host ({first.directory} and "
                                             f"{run.directory}): which is this node is unknown"))
            continue
        if collector is not None and run.results is not None:
            collector.add(run.host, run.results)
        node_facts.keep(run)
        runs[run.host] = run
        # What is kept stays to the merge's end and holds no cycle: the cycle collector need not walk it again.
        gc.freeze()
    if expected is not None:
        for host in expected:
            runs.setdefault(host, missing_node(host))
        extra = sorted(set(runs) - set(expected))
        for host in extra:  # a host outside the list is not one of the cluster's nodes, whatever it measured
            found.append(Exclusion(host, "not an expected host (--expect-hosts): a result from a node outside the "
                                         "cluster is never accepted"))
        if extra:
            warnings.append(f"{len(extra)} hosts have results but were not expected, excluded: {compress(extra)}")
    return [runs[h] for h in sorted(runs)], found, warnings


@dataclass(slots=True)
class Judged:
    """The node phase read, bound to its run, judged and set against the fleet."""

    runs: list[NodeRun]
    fleet: list[fleet_mod.FleetMetric]
    outliers: int
    warnings: list[str]
    window: dict[str, Any]
    profile: Profile | None = None
    """The profile that judges the cluster run (None when no node has a result)."""
    profile_source: str = ""


def judge_nodes(paths: list[Path], expected: list[str] | None, thresholds: Thresholds, *, run_id: str,
                level: str = DEFAULT_LEVEL, window_h: float = binding.WINDOW_H, now: datetime | None = None,
                profile: str | None = None, key: bytes | None = None) -> Judged:
    """Every node read (each file's HMAC checked with ``key``) and judged, bound to run ``run_id`` and to the fleet's
    profile (``profile``, else the one the runs agree on), its skips held to the fleet, then set against the fleet:
    what merge writes and sign-off checks again (``now``: the time the parts must have started before: the
    merge's).

    Each step after the read returns its exclusions and ``excluded.join`` adds them to their hosts here, in the
    order of ``clustergate.cluster.excluded``'s list, before the next step reads the runs: a node the cluster run
    unbinds is no part of the fleet the later steps judge."""
    collector = fleet_mod.Collector()
    runs, found, warnings = gather(paths, expected, thresholds, level, key, collector)  # 1. its own run (read_node)
    excluded_mod.join(runs, found)  # 2. the node directories
    read = [r.results if r.results is not None else r.unjudged for r in runs]
    if (problem := judged_by.fleet_problem((r for r in read if r is not None), thresholds)) is not None:
        raise MergeInputError(problem)  # the command line's mistake: no node is to blame for it
    chosen = binding.fleet_profile(runs, profile, thresholds)
    source = "--profile" if profile is not None else "the one every node run agrees on"
    window, found = binding.bind(runs, run_id, window_h, now or datetime.now(timezone.utc), chosen, source)
    excluded_mod.join(runs, found)  # 3. the cluster run
    excluded_mod.join(runs, fleet_skips(runs))  # 4. the fleet's skips
    fleet = collector.fleet(runs)
    excluded_mod.join(runs, fleet_mod.judge_outliers(fleet))  # 5. the fleet's figures
    excluded_mod.join(runs, fleet_mod.judge_shapes(runs))  # 6. the fleet's shape
    versions = {r.host: r.firmware for r in runs if r.verdict != "unbound" and r.firmware}
    excluded_mod.join(runs, firmware_fleet.exclusions(versions))  # 7. the fleet's firmware
    return Judged(runs, fleet, fleet_mod.outlying_parts(fleet), warnings, window, chosen, source)


def fleet_skips(runs: list[NodeRun]) -> list[Exclusion]:
    """A node whose skips its fleet contradicts (``clustergate.trust.completeness.fleet_problems``) lacks what the
    others have: partial, saying so. Only the node runs of this cluster run count as its fleet."""
    fleet = {r.host: r.results for r in runs if r.results is not None and r.verdict in ("accept", "reject", "partial")}
    return [Exclusion(host, reason, verdict="partial")
            for host, reasons in completeness.fleet_problems(fleet, suite_manifest.shipped()).items()
            for reason in reasons]


def check_output(output: Path, paths: list[Path]) -> None:
    """The output directory must not be one of the node directories, nor hold a node's own results: merge
    would overwrite the evidence it was given (MergeInputError); nor be anything but a directory, nor hold one of
    merge's outputs as anything but what merge writes there (a device, a FIFO: never replaced): a regular file, and
    the evidence bundles' directory."""
    try:
        refuse_not_directory("-o", output)
        for name in DIRECTORIES:
            refuse_not_directory("-o", output / name)
        refuse_not_files("-o", [output / name for name in OUTPUTS if name not in DIRECTORIES])
    except OutputError as exc:
        raise MergeInputError(str(exc)) from None
    target = output.resolve()
    for path in paths:
        directory = path.parent if path.name == "results.json" else path
        if directory.resolve() == target:
            raise MergeInputError(f"-o {output} is one of the node directories given: merge would overwrite "
                                  "that node's results; write to REPORTS/RUN_ID/ (the node directories' parent)")
    nodes = [p if p.name == "results.json" else p / "results.json" for p in paths]
    try:
        refuse_inputs("-o", [output / name for name in OUTPUTS], nodes,
                      "write to REPORTS/RUN_ID/ (the node directories' parent)")
    except OutputError as exc:
        raise MergeInputError(str(exc)) from None
    existing = output / "results.json"
    if existing.is_file():
        try:
            kind = resultsfile.load_json(existing).get("kind")
        except (resultsfile.ResultsFileError, AttributeError):
            kind = None
        if kind != "cluster":
            raise MergeInputError(f"-o {output} holds a results.json that is not a merge's (a node's run, or "
                                  "unreadable): merge would overwrite it; choose the run's directory REPORTS/RUN_ID/")


def _within_output(directory: str | None, output: Path) -> str | None:
    """A node directory as the merged record keeps it: relative to the output directory where it lies inside it
    (REPORTS/RUN_ID/nodes/HOST: the run's directory then moves or is copied whole, node files with it), else as
    given to merge."""
    if directory is None:
        return None
    try:
        return Path(directory).resolve().relative_to(output.resolve()).as_posix()
    except ValueError:
        return directory


def cluster_results(judged: Judged, expected: tuple[str, list[str]] | None, output: Path,
                    seconds: float) -> dict[str, Any]:
    runs, fleet, outliers, warnings = judged.runs, judged.fleet, judged.outliers, judged.warnings
    accepted = [r.host for r in runs if r.status == ACCEPTED]
    excluded = [r for r in runs if r.status != ACCEPTED]
    with_results = [r.results for r in runs if r.results]
    levels = sorted({str(r.get("level")) for r in with_results})
    if len(levels) > 1:
        warnings.append(f"nodes ran at different levels ({', '.join(levels)}): their figures are not alike")
    if judged.profile is not None:  # a site profile that asks less than the shipped one says so, per criterion
        warnings += [f"profile {w.profile}: {w.text()}" for w in weakenings(judged.profile)]
    nodes = []
    for r in runs:
        row = node_row(r)
        row["directory"] = _within_output(r.directory, output)
        row["drift"] = r.drift if r.drift is not None else excluded_mod.drift_rows(r.results)
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
        "excluded": [excluded_mod.entry(r) for r in excluded],
        "excluded_hostlist": compress(r.host for r in excluded),
        "profile": judged.profile.name if judged.profile else None, "profile_source": judged.profile_source,
        "dry_run": bool(judged.profile) and skip_facts.profile_kind({}, judged.profile) == "cpu",
        "suite_digest": attestation.suite_digest(),
        "profiles": sorted({str(r.get("profile")) for r in with_results}), "levels": levels,
        "warnings": warnings, "nodes": nodes, "fleet": [fm.as_json() for fm in fleet],
    }


def excluded_line(entry: dict[str, Any]) -> str:
    """A line of merge's excluded-hosts.txt: ``HOST<TAB>reason; reason<TAB>ACTION`` (a tab in a reason is a space:
    the columns stay three)."""
    reasons = "; ".join(" ".join(str(r).split("\t")) for r in entry["reasons"])
    return f"{entry['host']}\t{reasons}\t{entry.get('action') or ''}"


def write_lists(output: Path, lists: dict[str, Any], prefix: str = "",
                excluded_line: Callable[[dict[str, Any]], str] = excluded_line, accepted: bool = True) -> None:
    """accepted-hosts.txt (one host a line), excluded-hosts.txt (``excluded_line``: merge's by default) and both
    as hostlists; ``accepted`` False: the excluded lists alone (a sign-off that does not accept leaves no accepted
    list)."""
    line = excluded_line
    write_text(output / f"{prefix}excluded-hosts.txt", "".join(f"{line(e)}\n" for e in lists["excluded"]))
    write_text(output / f"{prefix}excluded-hostlist.txt", lists["excluded_hostlist"] + "\n")
    if accepted:
        write_text(output / f"{prefix}accepted-hosts.txt", "".join(f"{h}\n" for h in lists["accepted"]))
        write_text(output / f"{prefix}accepted-hostlist.txt", lists["accepted_hostlist"] + "\n")


def merge(paths: list[Path], output: Path, expect: str | None = None, thresholds: Path | None = None, *,
          level: str = DEFAULT_LEVEL, run_id: str | None = None, window_h: float = binding.WINDOW_H,
          store: Store | None = None, profile: str | None = None, key: bytes | None = None) -> dict[str, Any]:
    """Read, judge the fleet, write every output; the cluster results dict. ``store``: the results store the node
    runs read and the cluster results.json are recorded into; ``profile``: the fleet's (default: the one the runs
    agree on); ``key``: the site key (``clustergate.trust.keyed``). Raises MergeInputError, HostlistError (ValueErrors)
    and OSError with what to fix."""
    t0 = time.perf_counter()
    now = datetime.now(timezone.utc)
    check_output(output, paths)
    site = load_thresholds(thresholds)
    expected = read_hosts(expect) if expect is not None else None
    if not paths and expected is None:
        raise MergeInputError("no node directories given: pass REPORTS/RUN_ID/nodes/* (and --expect-hosts to "
                              "count nodes that wrote nothing)")
    run_id = run_id if run_id is not None else binding.default_run_id(paths)
    # The run's own names stay whole in what merge writes (the nodes' directories are named by their parent's).
    keep(run_id, str(output), str(output.resolve()), *{str(p.parent) for p in paths},
         *{str(p.resolve().parent) for p in paths})
    judged = judge_nodes(paths, expected[0] if expected else None, site, run_id=run_id, level=level,
                         window_h=window_h, now=now, profile=profile, key=key)
    cluster = cluster_results(judged, (expected[1], expected[0]) if expected else None, output,
                              time.perf_counter() - t0)
    cluster.update(thresholds=str(site.path), run_id=run_id, level=level, window=judged.window,
                   manifest=suite_manifest.shipped().digest, created=now.isoformat(timespec="seconds"),
                   signed=key is not None)
    if key is None and any(keyed.FIELD in (r.results or {}) for r in judged.runs):
        cluster["warnings"].append("the node files carry HMACs, but no site key was given (--key-file): they were "
                                   "not checked, and this merge is not signed")
    # Every input read and judged: only now, with a result to write, do an earlier merge's outputs move aside (a
    # refused command line changes nothing), and none of them may outlive this merge as if it were its own.
    output.mkdir(parents=True, exist_ok=True)
    set_aside("clustergate merge", output, OUTPUTS, DIRECTORIES)
    add_evidence(cluster, judged.runs, output, site.path)
    cluster["warnings"] += store_record.record_inputs(store, [Path(r.directory) / "results.json" for r in judged.runs
                                                          if r.directory and r.verdict not in excluded_mod.NO_RESULT])
    text, cluster = as_written(cluster, key)  # every output below shows what results.json says
    # The verdict and the lists first: a report that cannot be drawn must not cost the results.
    write_text(output / "results.json", text)
    write_lists(output, cluster)
    write_text(output / "metrics.prom", openmetrics.render(cluster))
    if (said := store_record.record_output(store, output / "results.json")) is not None:
        print(f"clustergate merge: {said}", file=sys.stderr)
    from clustergate.report.merge_html import cluster_page  # matplotlib only once the inputs are good

    by_host = {r.host: r for r in judged.runs}  # the page's nodes table: each row's worst figures, drawn as it is
    write_text(output / "report.html", cluster_page(cluster, lambda host: fleet_mod.worst_figures(by_host[host],
                                                                                                  judged.fleet)))
    return cluster


def set_aside(prog: str, directory: Path, names: tuple[str, ...], directories: tuple[str, ...] = ()) -> None:
    """An earlier command's outputs in ``directory`` moved to ``earlier/<UTC time>/`` (``keep_earlier``), saying
    where in one line; MergeInputError where they cannot be (a link under an output's name)."""
    try:
        kept = keep_earlier(directory, names, directories)
    except OutputError as exc:
        raise MergeInputError(str(exc)) from None
    if kept is not None:
        print(f"{prog}: the earlier outputs in {directory} were moved to {kept}", file=sys.stderr)


def add_evidence(cluster: dict[str, Any], runs: list[NodeRun], output: Path, thresholds: Path) -> None:
    """An evidence bundle for every excluded host with a node directory, named in its ``excluded`` entry; one that
    cannot be made is a warning."""
    by_host = {r.host: r for r in runs}
    for entry in cluster["excluded"]:
        run = by_host[entry["host"]]
        if run.directory is None:
            continue
        try:
            entry["evidence"] = excluded_mod.bundle(run, output, thresholds)
        except (BundleError, OSError) as exc:
            cluster["warnings"].append(f"no evidence bundle for {run.host}: {error_text(exc)}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return main_guarded("clustergate merge", lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    where = store_path(args.store)
    if (unusable := store_problem(where)) is not None:
        print(f"clustergate merge: {unusable}", file=sys.stderr)
        return 2
    try:
        cluster = merge(args.nodes, args.output, args.expect_hosts, args.thresholds, level=args.level,
                        run_id=args.run_id, window_h=args.window, profile=args.profile, key=site_key(args.key_file),
                        store=Store(where, timeout_s=args.wait) if where is not None else None)
    except (MergeInputError, HostlistError, OSError) as exc:
        print(f"clustergate merge: {error_text(exc)}", file=sys.stderr)
        return refused(exc)
    c = cluster["counts"]
    print(f"{cluster['verdict'].upper()}: {c['accepted']} of {c['accepted'] + c['excluded']} nodes accepted, "
          f"{c['excluded']} excluded ({c['missing']} without a result, {c['fleet_outliers']} fleet outliers); "
          f"merged in {time.perf_counter() - t0:.1f} s")
    print(f"accepted: {cluster['accepted_hostlist'] or '(none)'}")
    for e in cluster["excluded"][:20]:
        print(f"excluded: {e['host']} ({e['action']}): {'; '.join(e['reasons'])}")
    if len(cluster["excluded"]) > 20:
        print(f"excluded: ... {len(cluster['excluded']) - 20} more in excluded-hosts.txt")
    for warning in cluster["warnings"]:  # what the merge could not check or left out, besides the verdict
        print(f"clustergate merge: warning: {warning}", file=sys.stderr)
    print(f"report: {args.output / 'report.html'}\nresults: {args.output / 'results.json'}")
    return 0 if cluster["verdict"] == "accept" else 1
