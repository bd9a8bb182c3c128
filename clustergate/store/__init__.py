"""The results store: what clustergate remembers of a cluster over its life (one SQLite file, ``--store``).
It never changes a verdict: a store that cannot be used costs the record or the drift judgement, never the run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from clustergate.store.db import Decision, Recorded, Store, StoredFigure
from clustergate.store.lock import DocumentError, StoreBusy, StoreError

STORE_ENV = "CLUSTERGATE_STORE"

__all__ = ["STORE_ENV", "Decision", "DocumentError", "Recorded", "Store", "StoreBusy", "StoreError", "StoredFigure",
           "store_path", "store_problem"]


def store_path(option: str | Path | None, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The store a command uses: ``--store`` when given, else ``$CLUSTERGATE_STORE``; None when neither says
    (an empty value is none)."""
    chosen = str(option) if option is not None else environ.get(STORE_ENV, "")
    return Path(chosen).expanduser() if chosen.strip() else None


def store_problem(path: Path | None) -> str | None:
    """Why ``path`` can never be a store here (a usage error before a command does anything: a FIFO, a device, a
    directory, a link, a file that is not SQLite, a directory that does not exist), or None. A store that is only
    busy or fails later is not refused: it never changes a verdict."""
    if path is None:
        return None
    try:
        Store(path).check()
    except StoreError as exc:
        return f"--store (or {STORE_ENV}): {exc}"
    return None
