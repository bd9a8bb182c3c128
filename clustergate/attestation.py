"""What code ran: the suite's digest, and what a record's ``attestation`` section says is wrong with it.

Stand-in of the cluster branch for the run branch's module of the same name (which owns it: on a merge, take
theirs). It gives the two functions the cluster side builds on, to the contract both branches share:

- ``suite_digest()``: ``sha256:<hex>`` over every file of the suite this clustergate runs (the packages
  ``clustergate``, ``acceptance`` and ``workloads``: code, the shipped thresholds and manifest), by path and
  content: merge and sign-off take only node and fabric runs that recorded the same digest;
- ``problems(results)``: what the record's own ``attestation`` section names (modified, extra or missing files,
  a plugin that is not the suite's, its recorded problems); [] where the section is absent (a record without
  a suite digest is refused by merge and sign-off for that).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

PACKAGES = ("clustergate", "acceptance", "workloads")
SUFFIXES = (".py", ".json", ".yaml", ".ini")


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts)


@cache
def suite_digest() -> str:
    """``sha256:<hex>`` of the suite this clustergate runs (computed once per process)."""
    here = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in _files(here / package):
            digest.update(path.relative_to(here).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()}"


def problems(results: Mapping[str, Any]) -> list[str]:
    """Why the code a record ran is not the shipped suite, as its ``attestation`` section says; [] where it says
    nothing wrong or is absent."""
    section = results.get("attestation")
    if not isinstance(section, Mapping):
        return []
    out = [f"{what} files: {', '.join(map(str, section.get(key) or []))}"
           for key, what in (("modified", "modified"), ("extra", "extra"), ("missing", "missing"))
           if section.get(key)]
    foreign = [p for p in section.get("plugins") or [] if isinstance(p, Mapping) and not p.get("suite")]
    if foreign:
        out.append("plugins that are not the suite's: " + ", ".join(f"{p.get('name')} ({p.get('file')})"
                                                                   for p in foreign))
    return out + [str(p) for p in section.get("problems") or []]
