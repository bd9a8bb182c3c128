"""``clustergate signoff``: the final word on a cluster signed off in phases.

    clustergate signoff REPORTS/RUN_ID [--fabric DIR] [--thresholds FILE] [--key-file FILE]

Reads the merged node phase (REPORTS/RUN_ID/results.json, from ``merge``) and the fabric phase's run
(REPORTS/RUN_ID/fabric/results.json) and writes into REPORTS/RUN_ID:

- ``signoff.json`` (schema below and in ``clustergate/cluster/signoff.schema.json``) and ``signoff.html``;
- ``signoff-accepted-hosts.txt``, ``signoff-excluded-hosts.txt`` (``HOST<TAB>phase: reason; ...``),
  ``signoff-accepted-hostlist.txt`` and ``signoff-excluded-hostlist.txt`` (Slurm hostlist form);
- ``signoff-metrics.prom``: the sign-off in the OpenMetrics text format (``clustergate.report.openmetrics``), for
  node_exporter's textfile collector.

With a results store (``--store``, else ``$CLUSTERGATE_STORE``) the merge's results.json and the fabric run are
recorded into it (where they are not yet), then signoff.json; what cannot be recorded is a warning.

The accepted set is the hosts the node phase accepted, less those the fabric phase excluded: a node
its pair rounds excluded (slow with a known-good partner, or unresolved), or a host a failed per-GPU
or per-node fabric figure names. The accepted set is signed off only when the fabric run is a complete
fabric run (every multinode test of the suite's manifest, at the merge's level or more) of the same
cluster run (its run id, the same suite digest and the merge's profile, no dry run beside GPU nodes), started
after the merge, on exactly the node phase's accepted hosts, every node file still the one the merge read (its
digest), and every fabric failure is one of those exclusions;
anything else (a whole-job figure missed, a test that raised, a run that died) keeps the set from being
signed off, and ``reasons`` says why. With a site key (``--key-file``, else ``$CLUSTERGATE_KEY_FILE``:
``clustergate.trust.keyed``), the merged record, every node file and the fabric run must carry a valid HMAC (a node
file without one is excluded, naming it; a merge or fabric run without one is not signed off), the node files'
keyed digests must match, and signoff.json is signed. One accepted node needs no fabric phase. Every input is
read and judged first: a refused sign-off (exit 2) changes nothing. Then an earlier sign-off's outputs in
REPORTS/RUN_ID are moved to ``earlier/<UTC time>/`` (each sign-off is kept; the command says where), and one
that does not sign off writes no ``signoff-accepted-*`` list.

Exit status: 0 when the accepted set is signed off; 1 when it is not; 2 when an input cannot be used;
4 when an output cannot be written (a full disk).

signoff.json (schema 1)::

    {"schema": 1, "kind": "signoff", "verdict": "accept" | "reject", "created": ISO-8601, "run_dir": DIR,
     "run_id": str, "level": str, "profile": str | null (the merge's), "signed": bool,
     "thresholds": FILE, "profile_digest": str | null, "suite_digest": str | null, "dry_run": bool,
     "clustergate": {"version": str} (the clustergate that signed),
     "nodes": [{"host", "gpus": int, "gpu_models": [str], "ranks": int | null}] (each accepted host),
     "criteria": [{"phase": "node" | "fabric", "metric", "test", "unit", "scope", "parts": int, "min", "median",
                   "max", "worst", "margin_pct": float | null, "criterion": str, "severity", "source", "judged"}]
                 (every criterion over the accepted hosts' parts: ``clustergate.cluster.signoff_criteria``),
     "accepted": [host], "accepted_hostlist": str,
     "excluded": [{"host", "phase": "node" | "fabric", "reasons": [str]}], "excluded_hostlist": str,
     "reasons": [str], "warnings": [str],
     "phases": {"node": {"results", "verdict", "accepted", "excluded", "missing", "levels", "profiles"},
                "fabric": {"results", "verdict", "hosts": [host], "rounds": int | null,
                           "tests": {outcome: count}, "error"}}}
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import clustergate
from clustergate.cluster import binding, judged_by, signoff_criteria, store_record
from clustergate.cluster.fleet import FleetMetric
from clustergate.cluster.merge import (
    add_key_option,
    add_thresholds_option,
    as_written,
    judge_nodes,
    load_thresholds,
    set_aside,
    site_key,
    write_lists,
)
from clustergate.cluster.node_runs import ACCEPTED, MergeInputError, message_summary
from clustergate.common.exit_codes import refused
from clustergate.common.hostlist import compress
from clustergate.common.numbers import number
from clustergate.common.terminal import error_text, main_guarded
from clustergate.criteria.against_shipped import Weakening, shipped_profile, weakenings
from clustergate.criteria.criterion import Criterion
from clustergate.criteria.thresholds import Thresholds
from clustergate.record import resultsfile
from clustergate.record.outputs import Parser, write_text
from clustergate.record.rejudge import problems_of
from clustergate.record.reportdir import node_directory
from clustergate.record.results import short_test_name
from clustergate.record.verdict import contradiction, decide, of_record
from clustergate.report import openmetrics
from clustergate.report.signoff_words import DRY_RUN, held_to, shapes
from clustergate.secrets.redact import keep
from clustergate.store import Store, store_path, store_problem
from clustergate.store.command import add_store_options
from clustergate.trust import completeness, keyed
from clustergate.trust import manifest as suite_manifest

SCHEMA = 1
LISTS = ("signoff-accepted-hosts.txt", "signoff-excluded-hosts.txt", "signoff-accepted-hostlist.txt",
         "signoff-excluded-hostlist.txt")
OUTPUTS = ("signoff.json", "signoff.html", "signoff-metrics.prom", *LISTS)
"""What a sign-off writes into REPORTS/RUN_ID; an earlier sign-off's are moved to earlier/<UTC time>/ first."""


def parser() -> argparse.ArgumentParser:
    head, _, rest = __doc__.partition("\n\n")
    p = Parser(prog="clustergate signoff", description=head,
                                epilog=rest.split("signoff.json (schema")[0].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, metavar="REPORTS/RUN_ID", help="the run's directory: results.json of merge")
    p.add_argument("--fabric", type=Path, default=None, metavar="DIR",
                   help="the fabric phase's report directory (default: REPORTS/RUN_ID/fabric)")
    add_thresholds_option(p)
    add_key_option(p)
    add_store_options(p)
    return p


def _load(path: Path, kind: str, what: str) -> dict[str, Any]:
    """A results file of ``kind``, strictly read and schema-checked (MergeInputError: unusable input)."""
    try:
        data = resultsfile.load_json(path)
        if kind == "cluster" and (not isinstance(data, dict) or data.get("kind") != "cluster"):
            raise resultsfile.ResultsFileError(f"{path} is not a merged cluster results.json (no \"kind\": "
                                               "\"cluster\")")
        return resultsfile.checked(data, path, kind)  # read once: the file is not loaded a second time
    except resultsfile.ResultsFileError as exc:
        raise MergeInputError(f"{exc}; {what}") from None


def merged_again(cluster: dict[str, Any], run_dir: Path, site: Thresholds,
                 key: bytes | None = None) -> tuple[list[str], dict[str, list[str]], list[FleetMetric]]:
    """The node phase judged again from its node directories, as merge judged it (the same run id, level, profile
    and window, the merge's time; each file's HMAC with the site ``key``), each node file checked against the digest
    merge kept: the hosts accepted now, for each host the merged file accepts but its directory no longer
    supports, why, and the fleet judged again (its figures: the merged record keeps only their distribution). The
    merged results.json's own lists are never taken on trust."""
    paths = [node_directory(n["directory"], run_dir) for n in cluster["nodes"] if n.get("directory")]
    expected = (cluster.get("expected") or {}).get("hosts")
    created = binding.started({"started": cluster.get("created")})
    judged = judge_nodes([p for p in paths if p.is_dir()], expected, site, run_id=str(cluster.get("run_id")),
                         level=str(cluster.get("level")), window_h=float((cluster.get("window") or {}).get("hours")
                                                                          or binding.WINDOW_H), now=created,
                         profile=cluster.get("profile"), key=key)
    now = {r.host: r for r in judged.runs}
    kept = {n["host"]: n.get("digest") for n in cluster["nodes"]}
    for run in judged.runs:
        if run.digest is not None and kept.get(run.host) != run.digest:
            run.reasons.append(f"{Path(run.directory or '') / 'results.json'} is not the file the merge read "
                               f"(digest {run.digest}, the merge "
                               f"kept {kept.get(run.host)}): changed or replaced since; run merge again")
    accepted = [r.host for r in judged.runs if r.status == ACCEPTED]
    unsupported: dict[str, list[str]] = {}
    for host in cluster["accepted"]:
        if host not in accepted:
            why = now[host].reasons if host in now else ["no node directory of it is recorded in the merge"]
            unsupported[host] = ["accepted by the merged results.json, but its node directory does not support it "
                                 f"now: {'; '.join(why) or 'not accepted'}"]
    return accepted, unsupported, judged.fleet


def keyed_problems(cluster: dict[str, Any], path: Path, key: bytes | None) -> list[str]:
    """Why the merged record cannot be taken under the site key: a merge made with a key, signed off without one; or,
    with the key, an HMAC that is missing or does not match."""
    if key is None:
        return ["the merge was signed with a site key, so the sign-off needs the same key (--key-file or "
                f"${keyed.KEY_ENV})"] if cluster.get("signed") else []
    why = keyed.problem(cluster, key)
    return [f"{path}: {why}"] if why else []


def binding_problems(fabric: dict[str, Any], cluster: dict[str, Any], site: Thresholds) -> list[str]:
    """Why the fabric run is not this cluster run's fabric phase: another run id, another suite, another profile
    than the merge's (or a dry run beside GPU nodes), or started before the merge."""
    out = [f"the fabric run: {why}" for why in (binding.suite_problem(fabric),) if why]
    if (profile := site.profiles.get(str(cluster.get("profile")))) is not None and \
            (why := binding.profile_problem(fabric, profile, "the merge's")) is not None:
        out.append(f"the fabric run: {why}")
    if fabric.get("run_id") != cluster.get("run_id"):
        out.append(f"the fabric run belongs to run {fabric.get('run_id')!r}, not to this run {cluster.get('run_id')!r} "
                   "(CLUSTERGATE_RUN_ID): run the fabric phase of this run")
    began, merged = binding.started(fabric), binding.started({"started": cluster.get("created")})
    if began is None or merged is None or began < merged:
        out.append(f"the fabric run started {fabric.get('started')}, before the merge ({cluster.get('created')}): "
                   "it did not run on the merge's accepted hosts; run it again on accepted-hosts.txt")
    return out


def what_was_signed(cluster: dict[str, Any], site: Thresholds, accepted: list[str]) -> dict[str, Any]:
    """What the accepted set was held to and what it is: the thresholds file, the profile's digest (the one every
    node run recorded, ``Profile.run_digest``), the suite's digest, whether the fleet ran the cpu profile (a dry
    run), and each accepted host's GPUs (count and model) and ranks, as the merge read them from its node run."""
    profile = site.profiles.get(str(cluster.get("profile")))
    nodes = {n["host"]: n for n in cluster["nodes"]}

    def hardware(host: str) -> dict[str, Any]:
        node = nodes.get(host, {})
        return {"host": host, "gpus": int(node.get("gpus") or 0), "gpu_models": list(node.get("gpu_models") or []),
                "ranks": node.get("ranks")}

    base = shipped_profile(profile) if profile is not None else None
    return {"thresholds": str(site.path), "profile_digest": profile.run_digest if profile is not None else None,
            # A site profile is named as the site's, with the shipped one it holds to and where it asks less.
            "shipped_profile": None if base is None or base is profile else base.name,
            "looser_than_shipped": [w.as_json() for w in weakenings(profile)] if profile is not None else [],
            "suite_digest": cluster.get("suite_digest"), "dry_run": bool(cluster.get("dry_run")),
            "nodes": [hardware(h) for h in accepted]}


class Fabric:
    """What the fabric run says: hosts it excludes with evidence, and failures that block the sign-off."""

    def __init__(self, results: dict[str, Any], site: Thresholds, level: str | None = None) -> None:
        self.results = results
        self.site = site
        self.level = level
        self.excluded: dict[str, list[str]] = {}
        self.blocking: list[str] = []
        self.warnings: list[str] = []
        self.rounds: int | None = None
        self.hosts = [str(n.get("host")) for n in results.get("nodes", [])]

    def exclude(self, host: str, evidence: list[str], severity: str) -> None:
        if severity == "warn":
            self.warnings += [f"{host}: {e} (severity warn: kept)" for e in evidence]
        else:
            self.excluded.setdefault(host, []).extend(evidence)

    def read(self) -> Fabric:
        res = self.results
        profile = self.site.profiles.get(str(res.get("profile")))  # its skips on the profile's settings are checked
        decision = of_record(res, need="fabric", level=self.level, profile=profile)
        if res.get("verdict") == "running":
            self.blocking.append("the fabric run did not finish: its results.json still says running (killed or hung)")
        elif res.get("error"):
            self.blocking.append(f"fabric run error: {str(res['error']).splitlines()[0]}")
        elif (problem := contradiction(res)) is not None:
            self.blocking.append(f"fabric phase: records contradict the stored verdict {res['verdict']}: {problem}")
        elif decision.verdict == "unjudged":
            self.blocking.append(f"fabric phase: {decision.reason}")
        # Whatever else it says (its failures exclude hosts below), a fabric run signs only what it tested.
        if ran_less := completeness.partial(res, suite_manifest.shipped(), need="fabric", level=self.level,
                                            profile=profile):
            self.blocking.append("fabric phase: ran less than a complete run: " + "; ".join(ran_less))
        if (problem := judged_by.problem(res, self.site)) is not None:
            self.blocking.append(f"the fabric run was not judged by the site's thresholds: {problem}")
        for test in res.get("tests", []):
            self._pair_rounds(test)
        for test in res.get("tests", []):
            if test.get("outcome") in ("failed", "error"):
                self._failure(test)
        outcomes = [str(t.get("outcome")) for t in res.get("tests", [])]
        if len(self.hosts) > 1 and not set(outcomes) - {"skipped"} and not self.blocking:  # nothing measured
            self.blocking.append(f"fabric phase: {decide(outcomes, error=None, finished=True).reason}")
        self.warnings += [f"{w.get('metric')}={w.get('value')} {w.get('where', '')}: warning"
                          for w in res.get("warnings") or [] if isinstance(w, dict)]
        return self

    def _pair_rounds(self, test: dict[str, Any]) -> None:
        rounds = (test.get("details") or {}).get("node_rounds")
        if not isinstance(rounds, dict):
            return
        self.rounds = rounds.get("rounds")
        criterion = next((m.get("criterion") or {} for m in test.get("metrics", [])), {})
        for node in rounds.get("excluded", []):
            self.exclude(str(node["host"]), [f"{short_test_name(test['nodeid'])}: {e}" for e in node["evidence"]],
                         str(criterion.get("severity", "fail")))

    def _failure(self, test: dict[str, Any]) -> None:
        name = short_test_name(test["nodeid"])
        rest = "\n".join(problems_of(test))
        if test.get("outcome") == "error" or rest:
            self.blocking.append(f"{name}: {message_summary(rest or test.get('message', ''))}")
        for m in test.get("metrics", []):
            if m.get("passed", True):
                continue
            crit = m.get("criterion") or {}
            bad = [p for p in m.get("per_rank") or [] if not p.get("passed", True)]
            what = f"{m['name']} ({Criterion.from_json(crit).text()})"
            impossible = [p for p in bad if "ceiling" in crit and p["value"] > crit["ceiling"]]
            if impossible:  # a figure above what the hardware can do is the measurement's fault, not a host's
                shown = number(impossible[0]["value"], m.get("unit", ""))
                self.blocking.append(f"{name}: {m['name']}={shown} is above the physical ceiling "
                                     f"{number(crit['ceiling'])}: a measurement error, not a result")
                bad = [p for p in bad if p not in impossible]
                if not bad:
                    continue
            if m.get("scope") == "world" or not bad:
                self.blocking.append(f"{name}: {what} missed by the whole job "
                                     f"({number(m['value'], m.get('unit', ''))}): not one host's fault; fix it and run "
                                     "the fabric phase again")
                continue
            for host in sorted({str(p.get("host")) for p in bad}):
                if host in self.excluded:
                    continue  # the pair rounds already put the blame here
                values = ", ".join(number(p["value"], m.get("unit", "")) for p in bad if str(p.get("host")) == host)
                self.exclude(host, [f"{name}: {m['name']}={values}, {Criterion.from_json(crit).text()}"],
                             str(crit.get("severity", "fail")))


def signoff(run_dir: Path, fabric_dir: Path | None = None, thresholds: Path | None = None, *,
            store: Store | None = None, key: bytes | None = None) -> dict[str, Any]:
    """The sign-off of ``run_dir``, written there (and recorded into ``store``, with the merge and the fabric run it
    read; signed with the site ``key``, every file it reads held to it); raises MergeInputError when an input cannot
    be used."""
    keep(str(run_dir), str(run_dir.resolve()), *([str(fabric_dir), str(fabric_dir.resolve())] if fabric_dir else []))
    site = load_thresholds(thresholds)
    cluster = _load(run_dir / "results.json", "cluster", "give the run directory that `clustergate "
                                                         "merge REPORTS/RUN_ID/nodes/* -o REPORTS/RUN_ID/` wrote")
    if not isinstance(cluster.get("run_id"), str) or cluster.get("level") is None or "profile" not in cluster:
        raise MergeInputError(f"{run_dir / 'results.json'} does not say which run, level and profile it merged "
                              "(written by an older clustergate): run merge again")
    keep(cluster["run_id"])
    reasons: list[str] = keyed_problems(cluster, run_dir / "results.json", key)
    warnings: list[str] = list(cluster.get("warnings", []))
    merged_with = cluster.get("thresholds")
    if merged_with is not None and Path(merged_with).resolve() != site.path.resolve():
        reasons.append(f"the merge held the nodes to {merged_with}, this sign-off to {site.path}: give merge and "
                       "signoff the same --thresholds")
    node_accepted, unsupported, fleet = merged_again(cluster, run_dir, site, key)
    node_accepted = [h for h in cluster["accepted"] if h in node_accepted]  # accepted by the file and the records
    if unsupported:
        reasons.append(f"the merged results.json accepts {len(unsupported)} hosts its node directories do not "
                       f"support ({compress(unsupported)}): run merge again")
    excluded = [{"host": e["host"], "phase": "node", "reasons": e["reasons"]} for e in cluster.get("excluded", [])]
    excluded += [{"host": h, "phase": "node", "reasons": why} for h, why in sorted(unsupported.items())]
    if not cluster.get("sign_off", True):
        reasons.append("a node's profile has no sign-off criteria: its figures are measured, not judged")
    if not node_accepted:
        reasons.append("no node passed the node phase")
    fabric_dir = fabric_dir or run_dir / "fabric"
    fabric_path = fabric_dir / "results.json"
    fabric: Fabric | None = None
    if fabric_path.exists():
        fabric = Fabric(_load(fabric_path, "results", "the fabric phase's results.json"), site,
                        str(cluster["level"])).read()
        reasons += fabric.blocking
        reasons += binding_problems(fabric.results, cluster, site)
        if key is not None and (why := keyed.problem(fabric.results, key, keyed.writer(fabric.results))):
            reasons.append(f"{fabric_path}: {why}")
        warnings += fabric.warnings
        outside = sorted(set(fabric.hosts) - set(node_accepted))
        if outside:
            reasons.append(f"the fabric phase ran on hosts the node phase did not accept ({compress(outside)}): run "
                           "it on accepted-hosts.txt")
        untested = sorted(set(node_accepted) - set(fabric.hosts))
        if untested:
            reasons.append(f"the fabric run did not cover every host the node phase accepted ({compress(untested)} "
                           "never joined it): a sign-off covers exactly the accepted hosts; run the fabric phase on "
                           "accepted-hosts.txt")
        for host in untested:
            fabric.excluded.setdefault(host, []).append("accepted by the node phase but not in the fabric phase's "
                                                        "job: its links were never tested")
        excluded += [{"host": h, "phase": "fabric", "reasons": ev} for h, ev in sorted(fabric.excluded.items())
                     if h in node_accepted]
    elif len(node_accepted) > 1:
        reasons.append(f"no fabric phase results at {fabric_path}: run the fabric phase (torchrun -m multinode) on "
                       "accepted-hosts.txt")
    elif node_accepted:
        warnings.append("one node accepted: there is no fabric between nodes to test")
    fabric_out = {h for h, _ in (fabric.excluded.items() if fabric else [])}
    accepted = [h for h in node_accepted if h not in fabric_out]
    if node_accepted and not accepted:
        reasons.append("the fabric phase excluded every host the node phase accepted")
    fres = fabric.results if fabric else {}
    counts: dict[str, int] = {}
    for t in fres.get("tests", []):
        counts[str(t.get("outcome"))] = counts.get(str(t.get("outcome")), 0) + 1
    c = cluster.get("counts", {})
    out = {
        "schema": SCHEMA, "kind": "signoff", "verdict": "accept" if accepted and not reasons else "reject",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run_dir": str(run_dir),
        "run_id": cluster["run_id"], "level": cluster["level"], "profile": cluster.get("profile"),
        "signed": key is not None, "clustergate": {"version": clustergate.__version__},
        **what_was_signed(cluster, site, accepted),
        "criteria": signoff_criteria.criteria(fleet, fres, accepted),
        "accepted": accepted, "accepted_hostlist": compress(accepted),
        "excluded": sorted(excluded, key=lambda e: e["host"]),
        "excluded_hostlist": compress(e["host"] for e in excluded),
        "reasons": reasons, "warnings": warnings,
        "phases": {"node": {"results": str(run_dir / "results.json"), "verdict": cluster.get("verdict"),
                            "accepted": c.get("accepted"), "excluded": c.get("excluded"), "missing": c.get("missing"),
                            "levels": cluster.get("levels", []), "profiles": cluster.get("profiles", [])},
                   "fabric": {"results": str(fabric_path) if fabric else None, "verdict": fres.get("verdict"),
                              "hosts": fabric.hosts if fabric else [], "rounds": fabric.rounds if fabric else None,
                              "tests": counts, "error": fres.get("error")}},
    }
    warnings += store_record.record_inputs(store, [run_dir / "results.json",
                                               *([fabric_path] if fabric and fres.get("verdict") != "running" else [])])
    text, out = as_written(out, key)  # every output below shows what signoff.json says
    # Every input read and judged: only now is an earlier sign-off moved aside (a refused command line changes
    # nothing); each is kept, and one that fails leaves none of an earlier one's lists as its own.
    set_aside("clustergate signoff", run_dir, OUTPUTS)
    write_text(run_dir / "signoff.json", text)
    write_lists(run_dir, out, prefix="signoff-", accepted=out["verdict"] == "accept",
                excluded_line=lambda e: f"{e['host']}\t{e['phase']}: {'; '.join(e['reasons'])}")
    write_text(run_dir / "signoff-metrics.prom", openmetrics.render(out))
    if (said := store_record.record_output(store, run_dir / "signoff.json")) is not None:
        print(f"clustergate signoff: {said}", file=sys.stderr)
    from clustergate.report.merge_html import node_reports
    from clustergate.report.signoff_html import signoff_page

    links = node_reports({**cluster, "output": str(run_dir)})  # the node phase's own reports
    links |= {e["host"]: os.path.relpath(fabric_dir / "report.html", run_dir)
              for e in excluded if e["phase"] == "fabric" and (fabric_dir / "report.html").is_file()}
    write_text(run_dir / "signoff.html", signoff_page(out, links))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return main_guarded("clustergate signoff", lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    where = store_path(args.store)
    if (unusable := store_problem(where)) is not None:
        print(f"clustergate signoff: {unusable}", file=sys.stderr)
        return 2
    try:
        out = signoff(args.run_dir, args.fabric, args.thresholds, key=site_key(args.key_file),
                      store=Store(where, timeout_s=args.wait) if where is not None else None)
    except (MergeInputError, OSError) as exc:
        print(f"clustergate signoff: {error_text(exc)}", file=sys.stderr)
        return refused(exc)
    signed = out["verdict"] == "accept"
    print(f"{'SIGNED OFF' if signed else 'NOT SIGNED OFF'}: {len(out['accepted'])} hosts accepted, "
          f"{len(out['excluded'])} excluded" + (f" ({DRY_RUN})" if out["dry_run"] else ""))
    print(f"{'signed' if signed else 'held to'}: {held_to(out)}")
    for weaker in out["looser_than_shipped"]:
        print(f"looser than shipped: {Weakening(**weaker).text()}")
    print(f"accepted: {out['accepted_hostlist'] or '(none)'}")
    for hosts, shape in shapes(out):
        print(f"  {hosts}: {shape}")
    for e in out["excluded"][:20]:
        print(f"excluded ({e['phase']} phase): {e['host']}: {'; '.join(e['reasons'])}")
    for reason in out["reasons"]:
        print(f"not signed off: {reason}")
    print(f"sign-off: {args.run_dir / 'signoff.html'}\nresults: {args.run_dir / 'signoff.json'}")
    return 0 if signed else 1
