"""An evidence bundle: everything a vendor ticket needs about one excluded host, in one .tar.gz.

    build(REPORTS/RUN_ID/nodes/gpu07, REPORTS/RUN_ID/, thresholds=site.yaml) -> REPORTS/RUN_ID/evidence-gpu07.tar.gz

The archive holds one folder named after the host:

- ``results.json``, ``report.html``, ``progress.jsonl`` and ``junit.xml`` of its node run, as they are but for
  any secret in them (``clustergate.secrets.redact.scrub_output``: a bundle leaves the site, and a node's files may be
  older than the redaction that writes them now);
- ``nvidia-smi-q.txt``, where the node's directory has one (``nvidia-smi -q`` captured on the node), scrubbed too;
- ``xid-lines.txt``: the XID lines the run recorded (the kernel log's before the run; the kernel log's and
  NVML's during it, per GPU), or why there are none;
- ``profile.json``: the profile the run was judged by, resolved from the thresholds file (criteria,
  settings, expect), and whether its digest is the one the run recorded;
- ``hang.txt``, where the run ended on a rank that stopped making progress: what was found, the collective, and
  every rank's place, process state and Python stack (results.json's ``hang``, for reading);
- ``summary.txt``: the host, why it was excluded (the exclusion's reasons, where merge gives them), its GPUs
  (index, serial, UUID, PCI address), driver and CUDA, its own run's verdict, and each failure with what to do
  (``clustergate.record.actions``);
- ``MANIFEST.json``: why the host was excluded (``excluded_because``), what is in it (size and sha256 of each file)
  and what is not, and why.

Nothing in the node's directory is read through a symbolic link or as anything but a regular file (a link
or a FIFO planted under one of those names is left out and named in the manifest), and the archive is
written through a temporary file of a random name renamed into place: whole or not at all, never through
a link planted under its name.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
import tarfile
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clustergate.common.files import atomic_file
from clustergate.common.terminal import error_text
from clustergate.criteria.thresholds import ThresholdsError, load, shipped_thresholds
from clustergate.record import actions
from clustergate.secrets.redact import Scrubber, scrub_output
from workloads.node.name import problem as name_problem

NODE_FILES = ("results.json", "report.html", "progress.jsonl", "junit.xml")
"""What a node run writes that goes into its bundle as it is."""
NVIDIA_SMI = "nvidia-smi-q.txt"
"""``nvidia-smi -q`` of the node, where whoever ran the node phase captured it into the node's directory."""
MAX_FILE_BYTES = 256 * 2**20
"""A node's results.json is a few hundred KB and its report a few MB: far beyond this is not one of them."""
XID_TEST = "test_no_xid_errors_during_run"


class BundleError(ValueError):
    """The bundle cannot be made; the message names the path and why."""


def _read_regular(dir_fd: int, name: str) -> tuple[bytes | None, str | None]:
    """(the file's bytes, None) or (None, why it is left out): no link followed, no FIFO or device opened."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, "not in the node's directory"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "a symbolic link in the node's directory: left out (no link is followed)"
        return None, f"cannot be read ({exc.strerror or exc})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file: left out"
        if st.st_size > MAX_FILE_BYTES:
            return None, f"{st.st_size} bytes, more than a node's {name} can be ({MAX_FILE_BYTES}): left out"
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_FILE_BYTES + 1), None
    finally:
        os.close(fd)


def xid_lines(results: Mapping[str, Any] | None) -> str:
    """The XID lines a run recorded, as text for a ticket; or why there are none."""
    if results is None:
        return "No results.json: the run recorded no XID lines that can be read.\n"
    lines = []
    for node in (results.get("hardware_inventory") or {}).get("nodes") or []:
        before = node.get("xids_before_run") or []
        lines.append(f"Kernel log of {node.get('host')} before the run ({node.get('kernel_log') or 'not read'}): "
                     f"{len(before)} XID line(s)")
        lines += [f"  {x.get('text', x)}" for x in before]
    test = next((t for t in results.get("tests") or [] if str(t.get("nodeid", "")).endswith(f"::{XID_TEST}")), None)
    if test is None:
        lines.append(f"During the run: {XID_TEST} did not run in this run, so no XIDs were read.")
    elif test.get("outcome") == "skipped":
        lines.append(f"During the run: {XID_TEST} was skipped ({test.get('message', '').strip()}).")
    else:
        details = test.get("details") or {}
        rows = [r for r in details.get("evidence") or [] if str(r.get("metric", "")).startswith("xid_")]
        said = [(r.get("where") or r.get("label"), e) for r in rows for e in r.get("evidence") or []]
        lines.append(f"During the run (the kernel log's NVRM: Xid lines and NVML's XID events): {len(said)} XID(s)")
        lines += [f"  {where}: {e}" for where, e in said]
        outside = details.get("xids_on_gpus_outside_the_job") or []
        if outside:
            lines.append(f"On GPUs no rank of the job used: {len(outside)}")
            lines += [f"  node {x.get('node_rank')} {x.get('bus_id')}: {x.get('text')}" for x in outside]
    return "\n".join(lines) + "\n"


def hang_text(results: Mapping[str, Any] | None) -> str | None:
    """results.json's ``hang`` (a rank that stopped making progress) for reading; None where the run had none."""
    hang = (results or {}).get("hang")
    if not isinstance(hang, Mapping):
        return None
    lines = [str(hang.get("cause") or (results or {}).get("error") or "a rank stopped making progress"), ""]
    c = hang.get("collective") or {}
    if c:
        lines.append(f"Collective {c.get('seq')} ({c.get('op') or 'operation not recorded'}) of {c.get('group')}: "
                     f"joined by ranks {c.get('joined')}, not by {c.get('missing')}")
    lines.append(f"Found by rank {hang.get('found_by')} ({hang.get('kind')}); torch's records read: "
                 f"{hang.get('source')}")
    for rank in hang.get("ranks") or []:
        if not isinstance(rank, Mapping):
            continue
        lines += ["", f"Rank {rank.get('rank')} ({rank.get('host')}): {rank.get('stage')} {rank.get('test') or ''} "
                      f"[{rank.get('phase') or ''}], main thread at {rank.get('main')}, waiting in {rank.get('wait')}, "
                      f"process state {rank.get('process_state') or 'not read'}",
                  str(rank.get("stack") or "(no stack: the rank could not answer)")]
    return "\n".join(lines) + "\n"


def profile_json(results: Mapping[str, Any] | None, thresholds: Path) -> tuple[bytes | None, str | None]:
    """The profile the run names, resolved from ``thresholds`` (or why it cannot be given)."""
    if results is None or not results.get("profile"):
        return None, "no results.json naming a profile"
    try:
        profile = load(thresholds).profile(str(results["profile"]))
    except (ThresholdsError, OSError) as exc:
        return None, f"the profile could not be read from {thresholds}: {error_text(exc)}"
    recorded = (results.get("clustergate") or {}).get("thresholds_digest")
    data = {"name": profile.name, "thresholds": str(profile.source), "description": profile.description,
            "run_digest": profile.run_digest, "recorded_digest": recorded,
            "digest_matches": recorded == profile.run_digest, "sign_off": profile.sign_off,
            "settings": profile.settings, "metrics": {k: c.as_json() for k, c in profile.metrics.items()},
            "expect": {k: e.text for k, e in profile.expect.items()}}
    return (json.dumps(data, indent=2, default=str) + "\n").encode(), None


def excluded_lines(reasons: tuple[str, ...]) -> list[str]:
    """Why the host was excluded (merge's reasons), for the summary: a run its own verdict accepts can be excluded
    for what merge found (judged by other thresholds, a fleet outlier), and the bundle must say which."""
    return ["Excluded because:", *(f"  {r}" for r in reasons)] if reasons else []


def summary(host: str, results: Mapping[str, Any] | None, steps: list[actions.Step],
            reasons: tuple[str, ...] = ()) -> str:
    """What a vendor reads first: the host, why it was excluded (``reasons``), its parts, the software, the verdict
    and each failure's step."""
    if results is None:
        return "\n".join([f"Host {host}: no results.json in its report directory (the run never wrote one).",
                          *excluded_lines(reasons)]) + "\n"
    env = results.get("environment") or {}
    lines = [f"Host {host}", *excluded_lines(reasons),
             f"verdict {results.get('verdict')}: {results.get('reason') or ''}".rstrip(": "),
             f"run started {results.get('started')}, profile {results.get('profile')}, level {results.get('level')}",
             "software: " + ", ".join(f"{k} {env[k]}" for k in ("driver", "cuda", "nccl", "torch", "python")
                                      if env.get(k)), "GPUs (index, serial, UUID, PCI address, model):"]
    for node in results.get("nodes") or []:
        lines += [f"  {g.get('index')}  {g.get('serial')}  {g.get('uuid')}  {g.get('pci_bus_id')}  {g.get('name')}"
                  for g in node.get("gpus") or []]
    if results.get("error"):
        lines.append(f"run error: {results['error']}")
    lines.append("What failed and what to do:" if steps else "No failure recorded by its own run.")
    lines += [f"  {s.text()}" + (f" ({s.test})" if s.test else "") for s in steps]
    return "\n".join(lines) + "\n"


def _write_tar(out: Path, members: dict[str, bytes], created: float) -> None:
    """The archive, written whole or not at all (a random temporary name renamed over ``out``)."""
    with atomic_file(out, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(created), 0o644
            tar.addfile(info, io.BytesIO(data))


def build(node_dir: Path, out_dir: Path, *, thresholds: Path | None = None, host: str | None = None,
          reasons: tuple[str, ...] = ()) -> Path:
    """Write ``out_dir/evidence-HOST.tar.gz`` for the node run in ``node_dir`` (its name is the host unless
    ``host`` says); returns its path. ``thresholds``: the file the run was held to (default the shipped one);
    ``reasons``: why the host was excluded (summary.txt and MANIFEST.json say them)."""
    host = host or node_dir.name
    if why := name_problem(host):
        raise BundleError(f"{node_dir}: {host!r} cannot name a host's bundle: {why}")
    if not out_dir.is_dir():
        raise BundleError(f"{out_dir}: not a directory; the bundle is written into an existing one")
    try:
        dir_fd = os.open(node_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        what = "a symbolic link (no link is followed)" if exc.errno in (errno.ELOOP, errno.ENOTDIR) and \
            node_dir.is_symlink() else exc.strerror or str(exc)
        raise BundleError(f"{node_dir}: not a node's report directory ({what})") from None
    files: dict[str, bytes] = {}
    absent: list[dict[str, str]] = []
    scrub = Scrubber.from_environment()
    try:
        for name in (*NODE_FILES, NVIDIA_SMI):
            data, why = _read_regular(dir_fd, name)
            if data is None:
                absent.append({"name": name, "why": str(why)})
            else:
                files[name] = scrub_output(name, data, scrub)  # what the summary and the profile read, too
    finally:
        os.close(dir_fd)
    results: dict[str, Any] | None = None
    if "results.json" in files:
        try:
            parsed = json.loads(files["results.json"])
            results = parsed if isinstance(parsed, dict) else None
        except (ValueError, RecursionError) as exc:  # nested past the parser's depth: not a results file either
            absent.append({"name": "summary of results.json", "why": f"results.json is not JSON ({exc})"})
    steps = actions.steps(results) if results is not None else [actions.step("no_result")]
    files["xid-lines.txt"] = xid_lines(results).encode()
    if (hang := hang_text(results)) is not None:
        files["hang.txt"] = hang.encode()
    profile, why = profile_json(results, thresholds or shipped_thresholds())
    if profile is None:
        absent.append({"name": "profile.json", "why": str(why)})
    else:
        files["profile.json"] = profile
    files["summary.txt"] = summary(host, results, steps, reasons).encode()
    created = time.time()
    urgent = actions.most_urgent(steps)
    manifest = {"host": host, "node_directory": str(node_dir),
                "created": datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="seconds"),
                "verdict": (results or {}).get("verdict"), "excluded_because": list(reasons),
                "action": urgent.value if urgent else None,
                "steps": [s.as_json() for s in steps],
                "files": [{"name": n, "bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                          for n, d in files.items()],
                "absent": absent}
    files["MANIFEST.json"] = (json.dumps(manifest, indent=2) + "\n").encode()
    out = out_dir / f"evidence-{host}.tar.gz"
    _write_tar(out, {f"{host}/{name}": data for name, data in files.items()}, created)
    return out
