"""``clustergate render``: a run's report drawn again from its results.json, judged again or compared as asked.

    clustergate render reports/20260101T000000Z/results.json
    clustergate render results.json --baseline old/results.json -o compared.html
    clustergate render results.json --thresholds new-thresholds.yaml --profile h100-sxm-80gb --json-out rejudged.json

For a run that died before pytest-html wrote its report, a comparison with an earlier run, or a verdict under
other thresholds. The file must match clustergate/results.schema.json; the verdict is computed again from its
tests by the rule the run used (clustergate.record.verdict), never taken on trust, and a run that ran less than a
complete node or fabric run of the suite is partial (clustergate/manifest.json). The report and --json-out are
written whole, never through a link, never over an input (the results.json or --baseline) and never over what is
not a regular file (a device, a FIFO, a socket, a directory). Exit status: 0
when that verdict is accept, 1 otherwise, 2 when an input cannot be used.

This module decides (the verdict, the re-judgement, the baseline's flags) and hands the decided dict to
``clustergate.report`` to draw.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clustergate.common.exit_codes import Exit, refused
from clustergate.common.terminal import error_text, main_guarded
from clustergate.record.outputs import OutputError, Parser, refuse_inputs, refuse_not_files, write_text
from clustergate.record.results import encode
from clustergate.secrets.redact import keep

PROG = "clustergate render"
LARGE_BYTES = 16 << 20
"""A results.json above this takes seconds to minutes to read, judge and draw (a 200 MB one: minutes): each stage
is said as it starts, never silence."""


def progress(path: Path) -> Callable[[str], None]:
    """A line on stderr as each stage of rendering ``path`` starts, with the seconds so far, when the file is larger
    than ``LARGE_BYTES`` (the first at once, naming its size and the cap a results file is held to); silent for a
    smaller one."""
    from clustergate.common.inputfile import MAX_BYTES, MiB

    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size <= LARGE_BYTES:
        return lambda stage: None
    t0 = time.monotonic()
    cap = MAX_BYTES["results"]
    said = f"more than the {cap // MiB} MiB a results file may be: it is refused" if size > cap else \
        f"at most {cap // MiB} MiB are read"
    print(f"{PROG}: {path} is {size / MiB:.0f} MiB ({said}); reading it", file=sys.stderr, flush=True)
    return lambda stage: print(f"{PROG}: {stage} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a relative change of 0 or more (e.g. 0.05)")
    return value


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0], epilog="\n\n".join(__doc__.split("\n\n")[1:3]),
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


def decide(args: argparse.Namespace, say: Callable[[str], None] = lambda stage: None) -> dict[str, Any]:
    """The recorded run with its verdict decided again, re-judged and compared as asked (``say``: each stage as it
    starts, ``progress``); ValueError (the input's own: ResultsFileError, ThresholdsError, BaselineError) saying what
    to fix."""
    from clustergate.criteria import baseline
    from clustergate.record import resultsfile
    from clustergate.record.verdict import of_record

    if not args.results.exists():
        raise resultsfile.ResultsFileError(f"{args.results}: file not found; pass the results.json of a run (or its "
                                           "report directory)")
    results = resultsfile.read(args.results)
    say("read and checked against the schema; judging its verdict again")
    recorded, decision = results.get("verdict"), of_record(results)
    results["verdict"], results["reason"] = decision.verdict, decision.reason
    if recorded != decision.verdict:
        print(f"{PROG}: the recorded verdict {recorded!r} is not what its records say: "
              f"{decision.verdict!r} ({decision.reason}; computed again by the run's rule)", file=sys.stderr)
    tolerance = args.tolerance
    if args.thresholds is not None or args.profile is not None:
        from clustergate.criteria.thresholds import load, shipped_thresholds
        from clustergate.record.rejudge import rejudge

        thresholds = load(args.thresholds or shipped_thresholds())
        profile = thresholds.profile(args.profile or results.get("profile", ""))
        results = rejudge(results, profile)
        if tolerance is None:
            tolerance = profile.settings.get("baseline_tolerance")
    elif results["verdict"] == "accept":
        # The recorded criteria judged it again: an accept stands only if they are the shipped thresholds'
        # (a site's run is re-rendered with its --thresholds), as merge and signoff hold every run to them.
        from clustergate.cluster import judged_by
        from clustergate.criteria.thresholds import load, shipped_thresholds

        if (why := judged_by.problem(results, load(shipped_thresholds()))) is not None:
            results["verdict"] = "unjudged"
            results["reason"] = f"not judged by the shipped thresholds: {why}"
            print(f"{PROG}: {results['reason']}", file=sys.stderr)
    if args.baseline is not None:
        if tolerance is None:
            tolerance = (results.get("baseline") or {}).get("tolerance", baseline.DEFAULT_TOLERANCE)
        results["baseline"] = baseline.compare(results, baseline.load(args.baseline), float(tolerance))
    return results


def refuse_overwrites(path: Path, output: Path, json_out: Path | None, baseline: str | None) -> None:
    """OutputError when an output would be written over an input (or over the other output)."""
    inputs = [path, *([Path(baseline)] if baseline else [])]
    baseline_path = Path(baseline) / "results.json" if baseline and Path(baseline).is_dir() else None
    inputs += [baseline_path] if baseline_path else []
    for option, out in (("-o", output), ("--json-out", json_out)):
        if out is None:
            continue
        refuse_not_files(option, [out])
        refuse_inputs(option, [out], inputs, "write it to a file of its own")
    if json_out is not None and output.resolve() == json_out.resolve():
        raise OutputError(f"-o and --json-out are both {output}: give each its own file")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    return main_guarded(PROG, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    from clustergate.report.replay import DrawingFailed, draw

    path = args.results / "results.json" if args.results.is_dir() else args.results
    output = args.output or path.parent / "report-rerendered.html"
    keep(str(path), str(path.resolve()), str(output), str(output.resolve()))
    try:
        refuse_overwrites(path, output, args.json_out, args.baseline)
        say = progress(path)
        results = decide(args, say)
        if args.json_out is not None:
            write_text(args.json_out, encode(results))
    except (ValueError, OSError) as exc:  # BaselineError, ThresholdsError and OutputError are ValueErrors
        print(f"{PROG}: {error_text(exc)}", file=sys.stderr)
        return refused(exc)
    say(f"judged; drawing {output}")
    try:  # the directory resolved, never the name: a link planted as the report is replaced, not followed
        draw(path, results, output.parent.resolve() / output.name)
    except OSError as exc:
        print(f"{PROG}: cannot write {output}: {error_text(exc)}", file=sys.stderr)
        return refused(exc)
    except DrawingFailed as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return Exit.USAGE
    from clustergate.report.summary import summary_lines

    print(summary_lines(results)[0])  # the verdict, as the run's own summary says it first
    print(f"report: {output}" + (f"\nresults: {args.json_out}" if args.json_out else ""))
    return Exit.ACCEPT if results.get("verdict") == "accept" else Exit.NOT_ACCEPTED
