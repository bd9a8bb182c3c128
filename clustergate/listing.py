"""``clustergate list``: what a profile judges at a level, before anything runs.

    clustergate list                                  this node's profile of the shipped thresholds, level standard
    clustergate list --profile h200 --level quick
    clustergate list --profile h200 --json            the same as one JSON document

The tests a complete node run and a complete fabric run contain (the suite's manifest, clustergate/manifest.json),
the tests the level leaves out by design, and each metric's criterion under the profile (thresholds.yaml): its
bounds, unit, severity, source and description, described as the report's criteria table describes them
(``clustergate.criteria.Criterion.describe``). The profile is chosen as ``run`` and ``health`` choose it
(``clustergate.profile_choice``): asking NVML which GPU this node has, never torch. Exit status: 0, or 2 when the
thresholds file, the profile or the level cannot be used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from clustergate.criteria import Criterion
from clustergate.exit_codes import Exit
from clustergate.manifest import LEVELS, RUNS, Manifest, ManifestError, shipped
from clustergate.outputs import Parser, main_guarded
from clustergate.profile_choice import choose_profile
from clustergate.thresholds import Profile, ThresholdsError, expects_gpus, load, shipped_thresholds
from workloads.node import gpu_presence
from workloads.node.discovery import host_root

PROG = "clustergate list"
DEFAULT_LEVEL = "standard"
RUN_WORDS = {"node": "every node alone", "fabric": "two or more nodes together (-m multinode)"}
NOT_IN_PROFILE = "the profile has no criterion for this metric: the test errors until one is added"


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:]),
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--thresholds", type=Path, default=None, metavar="FILE",
                   help="thresholds file whose criteria are listed (default: the shipped thresholds.yaml)")
    p.add_argument("--profile", default=None, help="profile of the thresholds file (default: this node's, chosen as "
                   "run and health choose it: from the GPU model NVML reports; 'cpu' where no NVIDIA device exists)")
    p.add_argument("--level", default=DEFAULT_LEVEL, choices=LEVELS, help=f"level of the run (default {DEFAULT_LEVEL})")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return p


def _metric(name: str, scope: str, profile: Profile) -> dict[str, Any]:
    criterion = profile.metrics.get(name)
    said = (criterion or Criterion()).describe()
    if criterion is None:
        said["criterion"] = NOT_IN_PROFILE
    return {"name": name, "scope": scope, "in_profile": criterion is not None, **said}


def listing(manifest: Manifest, profile: Profile, level: str) -> dict[str, Any]:
    """The tests and criteria ``profile`` judges in a complete node run and fabric run at ``level``."""
    runs: dict[str, list[dict[str, Any]]] = {run: [] for run in RUNS}
    left_out = []
    for test in manifest.tests:
        if level in test.skipped_by_design:
            left_out.append({"nodeid": test.nodeid, "run": test.run, "why": test.skipped_by_design[level]})
            continue
        runs[test.run].append({"nodeid": test.nodeid,
                               "metrics": [_metric(m, scope, profile) for m, scope in test.metrics.items()]})
    return {"profile": profile.name, "description": profile.description, "sign_off": profile.sign_off,
            "dry_run": not expects_gpus(profile.settings.get("gpus_per_node")),
            "thresholds": str(profile.source), "level": level, "manifest": manifest.digest, "runs": runs,
            "left_out": left_out}


def text(listed: dict[str, Any]) -> list[str]:
    """The listing as lines: each run's tests, each test's metrics with their criteria, what the level leaves out."""
    sign_off = ("a dry-run profile (no GPU): CPU ranks rehearse the flow, they sign off no GPU node"
                if listed["dry_run"] else "a sign-off profile" if listed["sign_off"]
                else "not a sign-off profile: it judges nothing")
    lines = [f"profile {listed['profile']}   level {listed['level']}   {sign_off}   thresholds {listed['thresholds']}"]
    for run, tests in listed["runs"].items():
        judged = sum(1 for t in tests for m in t["metrics"] if m["bounds"])
        lines += ["", f"{run} run ({RUN_WORDS[run]}): {len(tests)} tests, {judged} judged metrics"]
        for test in tests:
            lines.append(f"  {test['nodeid']}")
            for m in test["metrics"]:
                detail = ", ".join(x for x in (m["unit"], f"severity {m['severity']}" if m["bounds"] else "",
                                               m["source"]) if x)
                said = f"{m['name']} ({m['scope']}): {m['criterion']}" + (f"   [{detail}]" if detail else "")
                lines.append(f"      {said}")
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
        thresholds = load(args.thresholds or shipped_thresholds())
        profile = choose_profile(thresholds, args.profile, gpu_presence.find(host_root()))
        listed = listing(shipped(), profile, args.level)
    except (ThresholdsError, ManifestError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return Exit.USAGE
    try:
        print(json.dumps(listed, indent=1) if args.json else "\n".join(text(listed)))
        sys.stdout.flush()
    except BrokenPipeError:
        # main_guarded's word for this ("the files are written") is about the commands that write files: list
        # writes none, so it says what was lost. Python flushes stdout again at exit: point it at /dev/null first.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"{PROG}: the output was closed before the listing was printed whole (broken pipe); list writes no "
              "file: run it without the pipe, or keep it with --json > FILE", file=sys.stderr)
        return Exit.USAGE
    return Exit.ACCEPT
