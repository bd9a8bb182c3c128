"""The ``clustergate health`` command line.

    clustergate health [--profile NAME] [--thresholds FILE] [--json] [--report-dir DIR] [--state FILE]
                       [--skip CHECK ...] [-v]

Prints one line per failure, naming the host, the GPU's index and serial, the check, what was seen and what
the profile expects, then one summary line; ``--json`` prints the same as one JSON object instead. Writes
nothing unless asked: ``--report-dir DIR`` keeps DIR/health.json (with everything read), ``--state FILE``
keeps where the kernel log stood after a healthy check, so that the next one counts only newer XIDs.
Exit status (clustergate.common.exit_codes): 0 healthy, 1 not healthy, 2 usage or unusable input (an option, the
thresholds file, the state file; a profile without GPUs on a GPU node; --skip leaving nothing to check), 4 could not
run (NVML absent where the profile judges GPUs and no NVIDIA device shows; nothing the profile judges could be read
here; a report directory that cannot be written). Nothing is healthy unchecked: a check that judged nothing is never
0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clustergate.common import files, inputfile
from clustergate.common.exit_codes import Exit
from clustergate.common.terminal import error_text, main_guarded
from clustergate.criteria.profile_choice import choose_profile
from clustergate.criteria.thresholds import ThresholdsError, expects_gpus, load, shipped_thresholds
from clustergate.health.checks import CHECKS, Finding, judge_node
from clustergate.health.read import mark, read_node
from clustergate.record import reportdir
from clustergate.record.outputs import Parser
from workloads.node import gpu_presence
from workloads.node.discovery import HOST_ROOT_ENV, host_root
from workloads.node.name import NodeNameError, node_name

PROG = "clustergate health"
SCHEMA = 1
REPORT_NAME = "health.json"
QUIET = {"unreadable": "not readable", "skip": "not judged", "ok": "ok"}
"""Findings printed only with -v, and the word each is printed with."""
JUDGED = ("ok", "fail", "warn")
"""Finding statuses that judged something: a health check with none of them checked nothing."""


class CannotRun(Exception):
    """The check could not run at all (exit 4); the message says why and what to do."""

    def __init__(self, message: str, profile: str | None = None) -> None:
        super().__init__(message)
        self.profile = profile
        """The profile it would have judged by, where one was chosen."""


class Unusable(Exception):
    """An input cannot be used (exit 2); the message names it and what to do."""


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG, allow_abbrev=False,
        description="This node's state from NVML and sysfs alone (no torch, no torchrun), judged by the profile a "
                    "run would use: GPU count, model and memory; ECC, row remapping; XIDs in the kernel log; NVLink; "
                    "PCIe; clock slowdown; processes of other jobs; persistence mode, driver and CUDA and the rest of "
                    "the profile's expect: section; the fabric manager; InfiniBand ports. "
                    f"Files are read under ${HOST_ROOT_ENV} (default /).",
        epilog="Exit status: 0 healthy, 1 not healthy, 2 usage or unusable input, 4 could not run.")
    p.add_argument("--thresholds", default=None, metavar="FILE",
                   help="pass criteria per profile (default: the thresholds.yaml shipped with clustergate)")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help="profile to judge by (default: chosen from the GPU model NVML reports, as a run chooses; "
                        "'cpu' only where no NVIDIA device exists)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.add_argument("--report-dir", default=None, metavar="DIR",
                   help=f"write DIR/{REPORT_NAME}: the verdict, every finding and everything read")
    p.add_argument("--state", default=None, metavar="FILE",
                   help="count only XIDs logged after the last check that found this node healthy, and keep that "
                        "mark in FILE (default: every XID since boot; nothing is kept)")
    p.add_argument("--skip", action="append", default=[], metavar="CHECK",
                   help=f"leave a check out (repeatable): {', '.join(CHECKS)}, or expect for every expect: key")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also list what was not readable or not judged, and every check that passed")
    return p


def _since(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(inputfile.read_text(path, "state"))
    except FileNotFoundError:  # no healthy check has kept a mark there yet
        return None
    except (OSError, ValueError) as exc:  # unreadable, not a regular file (a FIFO), too large, not JSON
        raise Unusable(f"--state {path}: cannot be read as a state file clustergate health wrote "
                       f"({error_text(exc)}); remove it to count XIDs since boot again") from None
    if not isinstance(data, dict) or not isinstance(data.get("marker"), (int, float)):
        raise Unusable(f"--state {path}: not a state file clustergate health wrote (no 'marker'); remove it")
    return data


def check_node(args: argparse.Namespace) -> tuple[Exit, dict[str, Any], dict[str, Any] | None]:
    """(exit status, the report, what the kernel log's mark is now) for the options given."""
    unknown = sorted(set(args.skip) - {*CHECKS, "expect"})
    if unknown:
        raise Unusable(f"--skip {unknown[0]}: no such check; the checks are {', '.join(CHECKS)}")
    try:
        host = node_name()
        thresholds = load(args.thresholds or shipped_thresholds())
    except (NodeNameError, ThresholdsError) as exc:
        raise Unusable(str(exc)) from None
    since = _since(Path(args.state) if args.state else None)
    root = host_root()
    nvml, nvml_error = gpu_presence.open_nvml()
    try:
        presence = gpu_presence.find(root, nvml, nvml_error)
        try:
            profile = choose_profile(thresholds, args.profile, presence)
        except ThresholdsError as exc:
            raise Unusable(str(exc)) from None
        gpus = expects_gpus(profile.setting("gpus_per_node", None))
        if not gpus and presence.present:
            raise Unusable(f"--profile {profile.name} on a GPU node ({presence.evidence()}): that profile judges no "
                           "GPU, so the node would read healthy with its GPUs unchecked; leave out --profile (it is "
                           "chosen from the GPU model) or name the GPU model's")
        if gpus and nvml is None and not gpu_presence.nvml_installed():
            raise CannotRun(f"{host}: profile {profile.name!r} judges GPUs, but nvidia-ml-py (the pynvml module) is "
                            "not installed: install it in this Python (pip install nvidia-ml-py)")
        if gpus and nvml is None and not presence.present:
            raise CannotRun(f"{host}: profile {profile.name!r} judges GPUs, but {nvml_error} and this node shows no "
                            f"NVIDIA device (no /dev/nvidia*, none on the PCI bus under {root}): run it on a GPU "
                            "node")
        node = read_node(host, root, presence, nvml, nvml_error, profile, gpus_expected=gpus, kernel_since=since)
    finally:
        if nvml is not None:
            nvml.nvmlShutdown()
    findings = judge_node(node, profile, gpus_expected=gpus, skip=frozenset(args.skip))
    if not any(f.status in JUDGED for f in findings):
        raise _nothing_checked(host, profile.name, findings, judge_node(node, profile, gpus_expected=gpus), args.skip)
    status = Exit.NOT_ACCEPTED if any(f.status == "fail" for f in findings) else Exit.ACCEPT
    report = {
        "schema": SCHEMA, "command": "health", "host": host,
        "status": "healthy" if status == Exit.ACCEPT else "not healthy", "exit_status": int(status), "error": None,
        "profile": profile.name, "sign_off": profile.sign_off, "thresholds": str(profile.source),
        "thresholds_digest": profile.run_digest,
        "gpus": [g.identity for g in node.gpus], "presence": asdict(presence),
        "kernel_log": None if node.kernel is None else {k: getattr(node.kernel, k) for k in (
            "readable", "reason", "source", "since", "marker")},
        "findings": [f.as_dict() for f in findings],
        **{key: [f.line(host) for f in findings if f.status == want] for key, want in (
            ("failures", "fail"), ("warnings", "warn"), ("unreadable", "unreadable"))},
        "read": node.as_dict(),
    }
    return status, report, mark(node.kernel) if node.kernel is not None and status == Exit.ACCEPT else None


def _nothing_checked(host: str, profile: str, findings: list[Finding], unskipped: list[Finding],
                     skip: list[str]) -> Exception:
    """A check that judged nothing says nothing of the node: never "healthy". Where --skip left every judged check
    out, a usage error (2); where the profile judges nothing this node lets health read, it could not run (4)."""
    if skip and any(f.status in JUDGED for f in unskipped):
        return Unusable(f"--skip {' --skip '.join(skip)} leaves nothing to check on {host}: a check of nothing is not "
                        "healthy; skip fewer checks")
    seen = ", ".join(f"{sum(f.status == s for f in findings)} {word}" for s, word in QUIET.items()
                     if s != "ok" and any(f.status == s for f in findings))
    return CannotRun(f"{host}: profile {profile!r} judges nothing clustergate health can read on this node"
                     + (f" ({seen})" if seen else " (no GPU, no InfiniBand port and no expect: key to check)")
                     + ": a check of nothing is not healthy; run the acceptance suite here instead (clustergate run)",
                     profile)


def _write(directory: Path, report: dict[str, Any]) -> Path:
    why = reportdir.problem(directory)
    if why:
        raise CannotRun(f"--report-dir {directory}: {why}")
    path = directory / REPORT_NAME
    try:
        files.write_atomic(path, json.dumps(report, indent=1) + "\n")
    except files.NotAFile as exc:
        raise Unusable(f"--report-dir {directory}: {exc}") from None
    except OSError as exc:
        raise CannotRun(f"--report-dir {directory}: cannot write {path.name} ({error_text(exc)})") from None
    return path


def _print(report: dict[str, Any], verbose: bool) -> None:
    host = report["host"]
    for line in report["failures"]:
        print(line)
    for line in report["warnings"]:
        print(f"warn: {line}")
    if verbose:
        for raw in report["findings"]:
            f = Finding(**raw)
            if f.status in QUIET:
                print(f"{QUIET[f.status]}: {f.line(host)}")
    counts = [f"{len(report[k])} {word if len(report[k]) == 1 else plural}" for k, word, plural in (
        ("failures", "failure", "failures"), ("warnings", "warning", "warnings"),
        ("unreadable", "not readable", "not readable")) if report[k]]
    verdict = "healthy" if report["exit_status"] == 0 else "NOT HEALTHY"
    print(f"{PROG}: {host} {verdict}" + (f": {', '.join(counts)}" if counts else "") +
          f" (profile {report['profile']}, {len(report['findings'])} checks, {report['duration_s']:.2f} s)"
          + ("; -v lists what was not readable" if report["unreadable"] and not verbose else "")
          + ("" if report["sign_off"] else f"; profile {report['profile']} has no criteria of its own: only the checks "
                                           "every profile makes were judged"))


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error argparse has printed (2)
        return int(exc.code or 0)
    return main_guarded(PROG, lambda: _main(args, t0, started))


def _main(args: argparse.Namespace, t0: float, started: str) -> int:
    try:
        status, report, kernel_mark = check_node(args)
        report.update(started=started, duration_s=round(time.monotonic() - t0, 3))
        if args.report_dir:
            _write(Path(args.report_dir), report)
        if args.state and kernel_mark is not None:
            try:
                files.write_atomic(Path(args.state), json.dumps(kernel_mark) + "\n")
            except OSError as exc:
                raise Unusable(f"--state {args.state}: cannot be written ({error_text(exc)})") from None
    except Unusable as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return Exit.USAGE
    except CannotRun as exc:
        print(f"{PROG}: could not run: {exc}", file=sys.stderr)
        report = {"schema": SCHEMA, "command": "health", "status": "could not run",
                  "exit_status": int(Exit.COULD_NOT_RUN), "error": str(exc), "profile": exc.profile,
                  "started": started, "duration_s": round(time.monotonic() - t0, 3)}
        if args.report_dir:
            with contextlib.suppress(CannotRun, Unusable, OSError):  # the directory itself may be why it could not run
                _write(Path(args.report_dir), report)
        if args.json:
            print(json.dumps(report, indent=1))
        return Exit.COULD_NOT_RUN
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "read"}, indent=1))
    else:
        _print(report, args.verbose)
    return status


if __name__ == "__main__":
    sys.exit(main())
