"""The store's tables, versioned: ``PRAGMA user_version`` is the number of migrations applied.

A migration is a list of SQL statements run in the writer's transaction, so a store is upgraded whole or
not at all; a store written by a newer clustergate (more migrations than this one knows) is refused,
naming the file and both versions, never read by rules that do not know its tables. Add a migration at
the end of ``MIGRATIONS``; never edit one that has shipped.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clustergate.store.lock import StoreError

APPLICATION_ID = 0x43475354
"""``PRAGMA application_id`` of a clustergate store ("CGST"): an SQLite file of another program is not one."""


@dataclass(frozen=True, slots=True)
class Migration:
    what: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration("runs, figures and per-host decisions", (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        # One row per stored file: a run's results.json, a merge's cluster results.json, a signoff.json.
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            digest TEXT NOT NULL UNIQUE,
            identity TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL CHECK (kind IN ('run', 'cluster', 'signoff')),
            path TEXT,
            recorded TEXT NOT NULL,
            started TEXT,
            started_s REAL,
            verdict TEXT,
            judged TEXT,
            profile TEXT,
            level TEXT,
            hosts TEXT NOT NULL,
            document TEXT NOT NULL)""",
        # One row per part and metric of a run: a GPU's figure, a node's, or the whole job's (host NULL).
        """CREATE TABLE figures (
            run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            test TEXT NOT NULL,
            metric TEXT NOT NULL,
            scope TEXT NOT NULL,
            host TEXT,
            node_rank INTEGER,
            rank INTEGER,
            gpu_index INTEGER,
            gpu_serial TEXT,
            gpu_uuid TEXT,
            value REAL NOT NULL,
            unit TEXT NOT NULL,
            criterion TEXT NOT NULL,
            verdict TEXT NOT NULL CHECK (verdict IN ('pass', 'warn', 'fail', 'unjudged')))""",
        "CREATE INDEX figures_by_serial ON figures (gpu_serial, metric)",
        "CREATE INDEX figures_by_uuid ON figures (gpu_uuid, metric)",
        "CREATE INDEX figures_by_host ON figures (host, metric)",
        "CREATE INDEX figures_by_metric ON figures (metric)",
        "CREATE INDEX figures_by_run ON figures (run)",
        # What a merge or sign-off decided of each host.
        """CREATE TABLE decisions (
            run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            host TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('accepted', 'excluded')),
            phase TEXT,
            reasons TEXT NOT NULL)""",
        "CREATE INDEX decisions_by_host ON decisions (host)",
        "CREATE INDEX runs_by_started ON runs (started_s)",
    )),
)
VERSION = len(MIGRATIONS)


def version_of(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check_kind(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse an SQLite file that is not a clustergate store (another program's database)."""
    app = int(conn.execute("PRAGMA application_id").fetchone()[0])
    if app == APPLICATION_ID:
        return
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' LIMIT 3")]
    if app != 0 or tables:
        raise StoreError(f"{path}: an SQLite database of another program (application_id {app}, tables "
                         f"{', '.join(tables) or 'none'}), not a clustergate store; choose another --store")


def check_version(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """The store's version; StoreError when it is newer than this code knows."""
    have = version_of(conn)
    if have > len(migrations):
        raise StoreError(f"{path}: the store is at schema version {have}, newer than this clustergate knows "
                         f"(version {len(migrations)}); record and read it with the newer clustergate that wrote it")
    return have


def migrate(conn: sqlite3.Connection, path: Path, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Bring the store up to ``len(migrations)`` inside the caller's write transaction; the version before."""
    check_kind(conn, path)
    have = check_version(conn, path, migrations)
    if have == 0:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    for n in range(have, len(migrations)):
        for statement in migrations[n].statements:
            conn.execute(statement)
    if have != len(migrations):
        conn.execute(f"PRAGMA user_version = {len(migrations)}")
    return have
