"""``clustergate list``: what a profile judges at a level, before anything runs.

    clustergate list                                  this node's profile of the shipped thresholds, level standard
    clustergate list --profile h200 --level quick
    clustergate list --profile h200 --json            the same as one JSON document
    clustergate list --nproc-per-node 8 --store fleet.db   each test's limit on nodes of 8 ranks, refined by the store

The tests a complete node run and a complete fabric run contain (the suite's manifest, clustergate/manifest.json),
the tests the level leaves out by design, each test's time limit and where it comes from (its own, the profile's,
its measured healthy time on a node of that shape from the reference runs or the site's store, else the level's:
``clustergate.run.testlimit``), and each metric's criterion under the profile (thresholds.yaml): its bounds, unit,
severity, source and description, described as the report's criteria table describes them
(``clustergate.criteria.criterion.Criterion.describe``). The profile is chosen as ``run`` and ``health`` choose it
(``clustergate.criteria.profile_choice``): asking NVML which GPU this node has, never torch. Exit status: 0, or 2 when
the thresholds file, the profile or the level cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from clustergate.common.exit_codes import Exit
from clustergate.common.terminal import error_text, main_guarded
from clustergate.criteria.against_shipped import Weakening, weakenings
from clustergate.criteria.criterion import Criterion
from clustergate.criteria.profile_choice import choose_profile
from clustergate.criteria.thresholds import Profile, ThresholdsError, expects_gpus, load, shipped_thresholds
from clustergate.record.outputs import Parser
from clustergate.run.durations import DurationsError, Key, Shape, reference, site
from clustergate.run.limits import SITE_RUNS
from clustergate.run.testlimit import TimeLimit, choose
from clustergate.store import STORE_ENV, Store, StoreError, store_path, store_problem
from clustergate.trust import known_metrics
from clustergate.trust.manifest import LEVELS, RUNS, Manifest, ManifestError, shipped
from workloads.node import gpu_presence
from workloads.node.discovery import host_root

PROG = "clustergate list"
DEFAULT_LEVEL = "standard"
RUN_WORDS = {"node": "every node alone", "fabric": "two or more nodes together (-m multinode)"}
CPU_RANKS = 2
"""The ranks clustergate run starts on a node without GPUs (clustergate.run.launch.command)."""
NOT_IN_PROFILE = "the profile has no criterion for this metric: the test errors until one is added"


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:]),
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--thresholds", type=Path, default=None, metavar="FILE",
                   help="thresholds file whose criteria are listed (default: the shipped thresholds.yaml)")
    p.add_argument("--profile", default=None, help="profile of the thresholds file (default: this node's, chosen as "
                   "run and health choose it: from the GPU model NVML reports; 'cpu' where no NVIDIA device exists)")
    p.add_argument("--level", default=DEFAULT_LEVEL, choices=LEVELS, help=f"level of the run (default {DEFAULT_LEVEL})")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="ranks on each node, for the tests' limits (default: the profile's gpus_per_node, else 2 CPU "
                        "ranks, as clustergate run starts them)")
    p.add_argument("--nodes", type=int, default=1, metavar="N",
                   help="nodes of the job, for the tests' limits (default 1: the node run)")
    p.add_argument("--store", default=None, metavar="PATH",
                   help=f"the results store whose accepted runs refine the tests' limits (default: ${STORE_ENV}; "
                        "--store '' uses none)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return p


def limits(manifest: Manifest, profile: Profile, key: Key, store: Path | None) -> dict[str, TimeLimit]:
    """Each test's limit in a run of ``key`` (profile, level, shape), as the run chooses it; the tests' own limits
    are the manifest's (their @pytest.mark.time_limit), the site's durations ``store``'s (None: none)."""
    known = reference(key)
    found = site(Store(store), key, SITE_RUNS) if store is not None else {}
    return {t.nodeid: choose(key=key, marker_s=t.time_limit.get(key.level), option_s=None,
                             profile_s=profile.settings.get("test_timeout_s"), reference=known.get(t.nodeid),
                             site=found.get(t.nodeid))
            for t in manifest.tests}


def _metric(name: str, scope: str, profile: Profile) -> dict[str, Any]:
    criterion = profile.metrics.get(name)
    said = (criterion or Criterion()).describe()
    if criterion is None:
        said["criterion"] = NOT_IN_PROFILE
    return {"name": name, "scope": scope, "in_profile": criterion is not None, **said}


def listing(manifest: Manifest, profile: Profile, level: str, shape: Shape | None = None,
            store: Path | None = None) -> dict[str, Any]:
    """The tests, their limits and the criteria ``profile`` judges in a complete node run and fabric run at
    ``level``, on nodes of ``shape`` (default: one node of the profile's GPUs, else 2 CPU ranks)."""
    shape = shape or Shape(1, int(profile.settings.get("gpus_per_node") or CPU_RANKS))
    key = Key(profile.name, level, shape)
    limited = limits(manifest, profile, key, store)
    runs: dict[str, list[dict[str, Any]]] = {run: [] for run in RUNS}
    left_out = []
    for test in manifest.tests:
        if level in test.skipped_by_design:
            left_out.append({"nodeid": test.nodeid, "run": test.run, "why": test.skipped_by_design[level]})
            continue
        runs[test.run].append({"nodeid": test.nodeid, "limit": limited[test.nodeid].as_json(),
                               "limit_text": limited[test.nodeid].describe(),
                               "metrics": [_metric(m, scope, profile) for m, scope in test.metrics.items()]})
    return {"profile": profile.name, "description": profile.description, "sign_off": profile.sign_off,
            "dry_run": not expects_gpus(profile.settings.get("gpus_per_node")),
            "thresholds": str(profile.source), "level": level, "shape": shape.key,
            "store": None if store is None else str(store), "manifest": manifest.digest, "runs": runs,
            "left_out": left_out, "looser_than_shipped": [w.as_json() for w in weakenings(profile)]}


def text(listed: dict[str, Any]) -> list[str]:
    """The listing as lines: each run's tests, each test's metrics with their criteria, what the level leaves out."""
    sign_off = ("a dry-run profile (no GPU): CPU ranks rehearse the flow, they sign off no GPU node"
                if listed["dry_run"] else "a sign-off profile" if listed["sign_off"]
                else "not a sign-off profile: it judges nothing")
    shape = Shape.parse(listed["shape"]).describe()
    lines = [f"profile {listed['profile']}   level {listed['level']}   {sign_off}   thresholds {listed['thresholds']}",
             f"time limits on {shape}" + (f", refined by the store {listed['store']}" if listed["store"] else "")]
    weaker: dict[str, str] = {}
    for w in listed["looser_than_shipped"]:
        weaker[w["metric"]] = "; ".join(filter(None, [weaker.get(w["metric"]), Weakening(**w).text()]))
    if weaker:
        lines += ["", f"LOOSER THAN SHIPPED: {len(listed['looser_than_shipped'])} criteria of profile "
                      f"{listed['profile']} ask less than the shipped profile:"]
        lines += [f"  {Weakening(**w).text()}" for w in listed["looser_than_shipped"]]
    for run, tests in listed["runs"].items():
        judged = sum(1 for t in tests for m in t["metrics"] if m["bounds"])
        lines += ["", f"{run} run ({RUN_WORDS[run]}): {len(tests)} tests, {judged} judged metrics"]
        for test in tests:
            lines.append(f"  {test['nodeid']}")
            lines.append(f"      limit {test['limit_text']}")
            for m in test["metrics"]:
                detail = ", ".join(x for x in (m["unit"], f"severity {m['severity']}" if m["bounds"] else "",
                                               m["source"]) if x)
                said = f"{m['name']} ({m['scope']}): {m['criterion']}" + (f"   [{detail}]" if detail else "")
                lines.append(f"      {said}" + (f"   LOOSER THAN SHIPPED: {weaker[m['name']]}" if m["name"] in weaker
                                                    else ""))
                if m["description"]:
                    lines.append(f"          {m['description']}")
    if listed["left_out"]:
        lines += ["", f"left out at level {listed['level']} by design:"]
        lines += [f"  {t['nodeid']} ({t['run']} run): {t['why']}" for t in listed["left_out"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    return main_guarded(PROG, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    try:
        thresholds = known_metrics.check(load(args.thresholds or shipped_thresholds()))
        profile = choose_profile(thresholds, args.profile, gpu_presence.find(host_root()))
        shape = None
        if args.nproc_per_node is not None or args.nodes != 1:
            if args.nodes < 1 or (args.nproc_per_node is not None and args.nproc_per_node < 1):
                raise ValueError("--nodes and --nproc-per-node must be whole numbers >= 1")
            shape = Shape(args.nodes, args.nproc_per_node or int(profile.settings.get("gpus_per_node") or CPU_RANKS))
        store = store_path(args.store)
        problem = store_problem(store)
        if problem:
            raise ValueError(problem)
        listed = listing(shipped(), profile, args.level, shape, store)
    except (ThresholdsError, ManifestError, DurationsError, StoreError, ValueError, OSError) as exc:
        print(f"{PROG}: {error_text(exc)}", file=sys.stderr)
        return Exit.USAGE
    print(json.dumps(listed, indent=1) if args.json else "\n".join(text(listed)))
    return Exit.ACCEPT
