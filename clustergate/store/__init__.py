"""The results store: what clustergate remembers of a cluster over its life.

Every run's results.json, every merge's cluster results.json and every signoff.json can be recorded into
one SQLite file (``--store PATH``, else ``$CLUSTERGATE_STORE``; without either nothing is stored and
nothing changes). A stored run keeps its document whole and one indexed row per part and metric (run,
host, GPU index, serial and UUID, metric, value, unit, criterion, verdict); a merge and a sign-off keep
what they decided of each host. From it come each part's history (``clustergate history``) and the first
accepted figure each GPU or node is held to when drift is judged (``clustergate.store.drift``).

- ``db``: ``Store`` (record, history, decisions, first accepted figures);
- ``lock``: the lock every access holds, safe on a file system many hosts share;
- ``schema``: the tables and their migrations;
- ``rows``: what is stored of a document (pure);
- ``drift``: figures that fell below their own first accepted figure (pure, given a store);
- ``history_cli`` and ``record_cli``: the ``history`` and ``record`` commands (``command``: what they share).
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
