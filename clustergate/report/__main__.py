"""Re-render the sign-off report from a results.json.

    python -m clustergate.report reports/20260101T000000Z/results.json
    python -m clustergate.report results.json --baseline old/results.json -o compared.html
    python -m clustergate.report results.json --thresholds new-thresholds.yaml --profile h100-sxm-80gb \\
        --json-out rejudged.json

For a run that died before pytest-html wrote its report, runs merged later, a comparison with an
earlier run, or a verdict under other thresholds. The file must match clustergate/results.schema.json;
the verdict is computed again from its tests by the rule the run used (clustergate.verdict.decide),
never taken on trust, and a run that ran less than a complete node or fabric run of the suite is
partial (clustergate/manifest.json). The report and --json-out are written whole, never through a link and
never over an input (the results.json or --baseline). Exit status: 0 when that verdict is accept, 1
otherwise, 2 when an input cannot be used.

Signing off a cluster in phases (each has its own --help):
    python -m clustergate.report merge REPORTS/RUN_ID/nodes/* -o REPORTS/RUN_ID/ [--expect-hosts FILE_OR_HOSTLIST]
    python -m clustergate.report signoff REPORTS/RUN_ID
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from clustergate.outputs import OutputError, Parser, main_guarded, refuse_inputs, write_text
from clustergate.redact import keep
from clustergate.report import baseline as baseline_mod
from clustergate.results import encode


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a relative change of 0 or more (e.g. 0.05)")
    return value


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m clustergate.report", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="results.json of a run (or its report directory)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="report to write (default: report-rerendered.html beside results.json)")
    p.add_argument("--baseline", default=None, metavar="PATH",
                   help="results.json of an earlier run to compare with (stored under 'baseline')")
    p.add_argument("--tolerance", type=_tolerance, default=None,
                   help="relative change flagged against --baseline (default: the profile's "
                        "baseline_tolerance with --thresholds, else the recorded comparison's, else 0.05)")
    p.add_argument("--thresholds", type=Path, default=None, metavar="FILE",
                   help="judge the recorded per-rank values again under this thresholds file")
    p.add_argument("--profile", default=None, help="profile of --thresholds (default: the recorded profile)")
    p.add_argument("--json-out", type=Path, default=None, metavar="FILE",
                   help="also write the re-judged/compared results.json here")
    return p


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Load, re-judge and compare as asked; raises ValueError with what to fix."""
    from clustergate import resultsfile
    from clustergate.verdict import of_record

    if not args.results.exists():
        raise resultsfile.ResultsFileError(f"{args.results}: file not found; pass the results.json of a run (or its "
                                           "report directory)")
    results = resultsfile.read(args.results)
    recorded, decision = results.get("verdict"), of_record(results)
    results["verdict"], results["reason"] = decision.verdict, decision.reason
    if recorded != decision.verdict:
        print(f"clustergate.report: the recorded verdict {recorded!r} is not what its records say: "
              f"{decision.verdict!r} ({decision.reason}; computed again by the run's rule)", file=sys.stderr)
    tolerance = args.tolerance
    if args.thresholds is not None or args.profile is not None:
        from clustergate.report.rejudge import rejudge
        from clustergate.thresholds import load, shipped_thresholds

        thresholds = load(args.thresholds or shipped_thresholds())
        profile = thresholds.profile(args.profile or results.get("profile", ""))
        results = rejudge(results, profile)
        if tolerance is None:
            tolerance = profile.settings.get("baseline_tolerance")
    elif results["verdict"] == "accept":
        # The recorded criteria judged it again: an accept stands only if they are the shipped thresholds'
        # (a site's run is re-rendered with its --thresholds), as merge and signoff hold every run to them.
        from clustergate.cluster import judged_by
        from clustergate.thresholds import load, shipped_thresholds

        if (why := judged_by.problem(results, load(shipped_thresholds()))) is not None:
            results["verdict"] = "unjudged"
            results["reason"] = f"not judged by the shipped thresholds: {why}"
            print(f"clustergate.report: {results['reason']}", file=sys.stderr)
    if args.baseline is not None:
        if tolerance is None:
            tolerance = (results.get("baseline") or {}).get("tolerance", baseline_mod.DEFAULT_TOLERANCE)
        results["baseline"] = baseline_mod.compare(results, baseline_mod.load(args.baseline), float(tolerance))
    return results


def render(results_path: Path, results: dict[str, Any], output: Path) -> int:
    """Run the replay session; pytest-html writes ``output``. Returns pytest's exit status."""
    from clustergate.report import hooks
    from clustergate.report.replay import ReplayPlugin

    # No conftest and no installed clustergate plugin (its torch session): only the report's hooks.
    args = [str(results_path), "--rootdir", str(results_path.parent), "-c", os.devnull, "--noconftest",
            "-p", "no:clustergate", "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "--tb=no", "-rN",
            "--html", str(output), "--self-contained-html"]
    return int(pytest.main(args, plugins=[hooks, ReplayPlugin(results_path, results)]))


def written(path: Path, output: Path, json_out: Path | None, baseline: str | None) -> None:
    """OutputError when an output would be written over an input (or over the other output)."""
    inputs = [path, *([Path(baseline)] if baseline else [])]
    baseline_path = Path(baseline) / "results.json" if baseline and Path(baseline).is_dir() else None
    inputs += [baseline_path] if baseline_path else []
    for option, out in (("-o", output), ("--json-out", json_out)):
        if out is None:
            continue
        if out.is_dir():
            raise OutputError(f"{option} {out} is a directory: name a file")
        refuse_inputs(option, [out], inputs, "write it to a file of its own")
    if json_out is not None and output.resolve() == json_out.resolve():
        raise OutputError(f"-o and --json-out are both {output}: give each its own file")


def render_to(path: Path, results: dict[str, Any], output: Path) -> int:
    """``render`` into a private directory beside ``output``, then renamed over it: pytest-html writes the file
    itself, and a link planted at ``output`` must be replaced, never written through."""
    scratch = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}."))
    try:
        status = render(path, results, scratch / "report.html")
        if (scratch / "report.html").is_file():
            os.replace(scratch / "report.html", output)
        return status
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("merge", "signoff"):  # the cluster commands, under the name the launchers use
        from clustergate.cluster.__main__ import command

        return int(command(argv[0])(argv[1:]))
    args = _parser().parse_args(argv)
    return main_guarded("clustergate.report", lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    path = args.results / "results.json" if args.results.is_dir() else args.results
    output = args.output or path.parent / "report-rerendered.html"
    keep(str(path), str(path.resolve()), str(output), str(output.resolve()))
    try:
        written(path, output, args.json_out, args.baseline)
        results = prepare(args)
        if args.json_out is not None:
            write_text(args.json_out, encode(results))
    except (ValueError, OSError) as exc:  # BaselineError, ThresholdsError and OutputError are ValueErrors
        print(f"clustergate.report: {exc}", file=sys.stderr)
        return 2
    try:  # the directory resolved, never the name: a link planted as the report is replaced, not followed
        status = render_to(path, results, output.parent.resolve() / output.name)
    except OSError as exc:
        print(f"clustergate.report: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    # A record without tests replays no test (pytest's 5): its page is drawn all the same.
    if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        print(f"clustergate.report: rendering failed (pytest exit status {status})", file=sys.stderr)
        return 2
    print(f"report: {output}" + (f"\nresults: {args.json_out}" if args.json_out else ""))
    return 0 if results.get("verdict") == "accept" else 1


if __name__ == "__main__":
    sys.exit(main())
