"""``python -m clustergate.report signoff``: the final word on a cluster signed off in phases.

    python3 -m clustergate.report signoff REPORTS/RUN_ID [--fabric DIR]

Reads the merged node phase (REPORTS/RUN_ID/results.json, from ``merge``) and the fabric phase's run
(REPORTS/RUN_ID/fabric/results.json) and writes into REPORTS/RUN_ID:

- ``signoff.json`` (schema below and in ``clustergate/cluster/signoff.schema.json``) and ``signoff.html``;
- ``signoff-accepted-hosts.txt``, ``signoff-excluded-hosts.txt`` (``HOST<TAB>phase: reason; ...``),
  ``signoff-accepted-hostlist.txt`` and ``signoff-excluded-hostlist.txt`` (Slurm hostlist form).

The accepted set is the hosts the node phase accepted, less those the fabric phase excluded: a node
its pair rounds excluded (slow with a known-good partner, or unresolved), or a host a failed per-GPU
or per-node fabric figure names. The accepted set is signed off only when the fabric run finished on
exactly the node phase's accepted hosts and every fabric failure is one of those exclusions; anything
else (a whole-job figure missed, a test that raised, a run that died) keeps the set from being
signed off, and ``reasons`` says why. One accepted node needs no fabric phase.

Exit status: 0 when the accepted set is signed off; 1 when it is not; 2 when an input cannot be used.

signoff.json (schema 1)::

    {"schema": 1, "kind": "signoff", "verdict": "accept" | "reject", "created": ISO-8601, "run_dir": DIR,
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

from clustergate import resultsfile
from clustergate.cluster import judged_by
from clustergate.cluster.hostlist import compress
from clustergate.cluster.merge import add_thresholds_option, judge_nodes, load_thresholds, write_lists
from clustergate.cluster.node_runs import ACCEPTED, MergeInputError, message_summary
from clustergate.criteria import Criterion
from clustergate.report.model import fmt, short_test_name
from clustergate.report.rejudge import problems_of
from clustergate.results import write_json
from clustergate.thresholds import Thresholds
from clustergate.verdict import contradiction, decide, of_record

SCHEMA = 1


def parser() -> argparse.ArgumentParser:
    head, _, rest = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(prog="python -m clustergate.report signoff", description=head,
                                epilog=rest.split("signoff.json (schema")[0].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, metavar="REPORTS/RUN_ID", help="the run's directory: results.json of merge")
    p.add_argument("--fabric", type=Path, default=None, metavar="DIR",
                   help="the fabric phase's report directory (default: REPORTS/RUN_ID/fabric)")
    add_thresholds_option(p)
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


def _node_directory(stored: str, run_dir: Path) -> Path:
    """A node directory as merge recorded it: as given to merge, else relative to the run's directory."""
    path = Path(stored)
    return path if path.is_absolute() or path.exists() else run_dir / path


def merged_again(cluster: dict[str, Any], run_dir: Path, site: Thresholds) -> tuple[list[str], dict[str, list[str]]]:
    """The node phase judged again from its node directories, as merge judged it: the hosts accepted now,
    and, for each host the merged file accepts but its directory no longer supports, why. The merged
    results.json's own lists are never taken on trust."""
    paths = [_node_directory(n["directory"], run_dir) for n in cluster["nodes"] if n.get("directory")]
    expected = (cluster.get("expected") or {}).get("hosts")
    runs, _, _, _ = judge_nodes([p for p in paths if p.is_dir()], expected, site)
    now = {r.host: r for r in runs}
    accepted = [r.host for r in runs if r.status == ACCEPTED]
    unsupported: dict[str, list[str]] = {}
    for host in cluster["accepted"]:
        if host not in accepted:
            why = now[host].reasons if host in now else ["no node directory of it is recorded in the merge"]
            unsupported[host] = ["accepted by the merged results.json, but its node directory does not support it "
                                 f"now: {'; '.join(why) or 'not accepted'}"]
    return accepted, unsupported


def fabric_selection_problem(results: dict[str, Any]) -> str | None:
    """Why a fabric run did not test every multinode check (None when it did): it must have selected
    multinode tests and left out none of them (-k or -m). A record from before the run counted them
    must have run ``-m multinode`` (or no -m) and no -k at all."""
    sel = results.get("selection") or {}
    if "multinode_deselected" in sel:
        if sel["multinode_deselected"]:
            return (f"the fabric run left out {sel['multinode_deselected']} multinode tests (-k/-m): the sign-off "
                    "covers only what was tested, so run the fabric phase with -m multinode")
        if not sel.get("multinode"):
            return "the fabric run selected no multinode test: run the fabric phase with -m multinode"
        return None
    if sel.get("k"):
        return (f"the fabric run was narrowed with -k {sel['k']!r}: multinode tests may have been left out; run "
                "it with -m multinode alone")
    if sel.get("m") not in (None, "multinode"):
        return (f"the fabric run selected -m {sel['m']!r}, not -m multinode: the sign-off covers only what was "
                "tested, so run the fabric phase with -m multinode")
    if sel.get("selected") is None:
        return "the fabric run does not record what it selected: its results.json is not a run's"
    return None


class Fabric:
    """What the fabric run says: hosts it excludes with evidence, and failures that block the sign-off."""

    def __init__(self, results: dict[str, Any], site: Thresholds) -> None:
        self.results = results
        self.site = site
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
        decision = of_record(res)
        if res.get("verdict") == "running":
            self.blocking.append("the fabric run did not finish: its results.json still says running (killed or hung)")
        elif res.get("error"):
            self.blocking.append(f"fabric run error: {str(res['error']).splitlines()[0]}")
        elif (problem := contradiction(res)) is not None:
            self.blocking.append(f"fabric phase: records contradict the stored verdict {res['verdict']}: {problem}")
        elif decision.verdict == "unjudged":
            self.blocking.append(f"fabric phase: {decision.reason}")
        if (problem := fabric_selection_problem(res)) is not None:
            self.blocking.append(problem)
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
                self.blocking.append(f"{name}: {m['name']}={fmt(impossible[0]['value'], m.get('unit', ''))} is above "
                                     f"the physical ceiling {crit['ceiling']:g}: a measurement error, not a result")
                bad = [p for p in bad if p not in impossible]
                if not bad:
                    continue
            if m.get("scope") == "world" or not bad:
                self.blocking.append(f"{name}: {what} missed by the whole job ({fmt(m['value'], m.get('unit', ''))}): "
                                     "not one host's fault; fix it and run the fabric phase again")
                continue
            for host in sorted({str(p.get("host")) for p in bad}):
                if host in self.excluded:
                    continue  # the pair rounds already put the blame here
                values = ", ".join(fmt(p["value"], m.get("unit", "")) for p in bad if str(p.get("host")) == host)
                self.exclude(host, [f"{name}: {m['name']}={values}, {Criterion.from_json(crit).text()}"],
                             str(crit.get("severity", "fail")))


def signoff(run_dir: Path, fabric_dir: Path | None = None, thresholds: Path | None = None) -> dict[str, Any]:
    """The sign-off of ``run_dir``, written there; raises MergeInputError when an input cannot be used."""
    site = load_thresholds(thresholds)
    cluster = _load(run_dir / "results.json", "cluster", "give the run directory that `python -m clustergate.report "
                                                         "merge REPORTS/RUN_ID/nodes/* -o REPORTS/RUN_ID/` wrote")
    reasons: list[str] = []
    warnings: list[str] = list(cluster.get("warnings", []))
    merged_with = cluster.get("thresholds")
    if merged_with is not None and Path(merged_with).resolve() != site.path.resolve():
        reasons.append(f"the merge held the nodes to {merged_with}, this sign-off to {site.path}: give merge and "
                       "signoff the same --thresholds")
    node_accepted, unsupported = merged_again(cluster, run_dir, site)
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
        fabric = Fabric(_load(fabric_path, "results", "the fabric phase's results.json"), site).read()
        reasons += fabric.blocking
        warnings += fabric.warnings
        outside = sorted(set(fabric.hosts) - set(node_accepted))
        if outside:
            reasons.append(f"the fabric phase ran on hosts the node phase did not accept ({compress(outside)}): run "
                           "it on accepted-hosts.txt")
        untested = sorted(set(node_accepted) - set(fabric.hosts))
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
    write_json(run_dir / "signoff.json", out)
    write_lists(run_dir, out, prefix="signoff-",
                excluded_line=lambda e: f"{e['host']}\t{e['phase']}: {'; '.join(e['reasons'])}")
    from clustergate.report.merge_html import node_reports
    from clustergate.report.signoff_html import signoff_page

    links = node_reports({**cluster, "output": str(run_dir)})  # the node phase's own reports
    links |= {e["host"]: os.path.relpath(fabric_dir / "report.html", run_dir)
              for e in excluded if e["phase"] == "fabric" and (fabric_dir / "report.html").is_file()}
    (run_dir / "signoff.html").write_text(signoff_page(out, links))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        out = signoff(args.run_dir, args.fabric, args.thresholds)
    except (MergeInputError, OSError) as exc:
        print(f"clustergate.report signoff: {exc}", file=sys.stderr)
        return 2
    signed = out["verdict"] == "accept"
    print(f"{'SIGNED OFF' if signed else 'NOT SIGNED OFF'}: {len(out['accepted'])} hosts accepted, "
          f"{len(out['excluded'])} excluded")
    print(f"accepted: {out['accepted_hostlist'] or '(none)'}")
    for e in out["excluded"][:20]:
        print(f"excluded ({e['phase']} phase): {e['host']}: {'; '.join(e['reasons'])}")
    for reason in out["reasons"]:
        print(f"not signed off: {reason}")
    print(f"sign-off: {args.run_dir / 'signoff.html'}\nresults: {args.run_dir / 'signoff.json'}")
    return 0 if signed else 1
