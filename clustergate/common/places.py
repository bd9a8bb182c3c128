"""A path of this machine as a page may show it: relative to a root it lies in, never absolute."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def shown_path(path: str | Path, roots: Iterable[Path]) -> str:
    """``path`` relative to the first of ``roots`` it lies in (``thresholds.yaml``, ``site/h100.yaml``); its name
    alone where it lies in none: what a page handed to another person says of it (a file is known by its digest
    beside it, not by a directory of the machine that ran)."""
    target = Path(path).resolve()
    for root in roots:
        try:
            return target.relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            continue
    return target.name
