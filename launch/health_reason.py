"""The one-line reason a node failed its clustergate health check, from its health.json or results.json.

    python3 launch/health_reason.py REPORT_DIR [--max-chars 250]

Prints nothing and exits 0 when the node passed (an accept, or a partial run of the shipped suite whose narrowed
selection all passed); otherwise prints the reason and exits 1. From the health
tier's health.json (``clustergate health --report-dir``): "clustergate: health: <n> failures: <the first
failure's line>" (or why it could not run); from the quick tier's results.json: "clustergate: <verdict>:
<failed tests>: <first line of the first failure>" (or the run's error); else why there is no usable
file. launch/slurm/healthcheck.sh drains the node with it
(`scontrol update ... state=drain reason=...`), so `sinfo -R` says what failed; every reason starts
"clustergate: ", the prefix by which healthcheck.sh knows the drains it may undo.
Standard library only: it runs in a Slurm prolog or epilog, before or after any job.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _first_line(text: str) -> str:
    """The first line that says something (failure messages start with a '[call] ...' header)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    for line in lines:
        if not line.startswith("[") or not line.endswith(":"):
            return line
    return lines[0] if lines else ""


def _unattested(results: dict[str, Any]) -> str:
    """Why the run does not attest the shipped suite ('' where it does), as it recorded it
    (clustergate.trust.attestation derives the same from the record's fields; this script keeps to the standard
    library)."""
    attestation = results.get("attestation")
    if not isinstance(attestation, dict):
        return "the run does not say which code and plugins it ran (no attestation)"
    problems = attestation.get("problems")
    return str(problems[0]) if isinstance(problems, list) and problems else ""


def reason(results: dict[str, Any] | None, why_missing: str = "") -> str:
    """Empty for an accept; else what a person reading `sinfo -R` needs first."""
    if results is None:
        return f"clustergate: no results ({why_missing})"
    verdict = results.get("verdict", "unknown")
    failed = [t for t in results.get("tests", []) if t.get("outcome") in ("failed", "error")]
    unattested = _unattested(results)
    if verdict == "accept" or (verdict == "partial" and not failed and not results.get("error") and not unattested):
        # partial: the site narrowed its own check (-k, -m) and every test it asked for passed. A health check
        # judges what it was asked to run; only merge, sign-off and calibrate need a complete run. A run of other
        # code or plugins than the shipped suite's judged nothing the site asked for: never healthy.
        return ""
    if verdict == "partial" and not failed and unattested:
        return f"clustergate: {verdict}: {_first_line(unattested)}"
    names = [t.get("nodeid", "?").split("::")[-1] for t in failed]
    if failed:
        more = f" (+{len(names) - 2} more)" if len(names) > 2 else ""
        detail = _first_line(failed[0].get("message", ""))
        return f"clustergate: {verdict}: {', '.join(names[:2])}{more}: {detail}".rstrip(": ")
    if results.get("error"):
        return f"clustergate: {verdict}: {_first_line(results['error'])}"
    return f"clustergate: {verdict}: no test failed, but the run did not finish (see its report)"


def health_reason(report: dict[str, Any]) -> str:
    """Empty for a healthy node; else its failures, the first in full (each names host, GPU, check and values)."""
    if report.get("status") == "healthy":
        return ""
    if report.get("status") == "could not run":
        return f"clustergate: health could not run: {_first_line(str(report.get('error') or ''))}"
    failures = [str(f) for f in report.get("failures") or []]
    if not failures:
        return f"clustergate: health: {report.get('status', 'no verdict')} (see its report)"
    count = f"{len(failures)} failure{'s' if len(failures) > 1 else ''}"
    return f"clustergate: health: {count}: {failures[0]}"


def _load(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        return json.loads(path.read_text()), ""
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"{path} is not JSON: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report_dir", type=Path, help="the health check's report directory")
    parser.add_argument("--max-chars", type=int, default=250, help="cut the reason to this length")
    args = parser.parse_args(argv)
    health = args.report_dir / "health.json"
    if health.exists():
        report, why = _load(health)
        text = health_reason(report) if isinstance(report, dict) else f"clustergate: health: no verdict ({why})"
    else:
        results, why = _load(args.report_dir / "results.json")
        text = reason(results, why)
    if not text:
        return 0
    # A drain reason is one line; Slurm shows it in sinfo -R and scontrol show node.
    text = " ".join(text.split())
    print(text if len(text) <= args.max_chars else text[: args.max_chars - 3] + "...")
    return 1


if __name__ == "__main__":
    sys.exit(main())
