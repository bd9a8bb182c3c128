"""The results store: every run, merge and sign-off recorded into one SQLite file.

    store = Store(Path("/shared/clustergate/fleet.db"))
    store.record(results, path=report_dir / "results.json")   # idempotent
    store.history("1652823054300", "matmul_bf16_tflops")      # that GPU's figures, wherever it was
    store.first_accepted("1652823054300", "matmul_bf16_tflops", level="standard")

Every call opens the database, does its work in one transaction and closes it, all while holding the
store's lock (``clustergate.store.lock``): on a network file system, close-to-open consistency then hands
each caller what the previous one wrote, and no two hosts ever write at once even where SQLite's own
locks do not reach across hosts. The journal is SQLite's rollback journal (``journal_mode=DELETE``; WAL
needs memory shared between processes, which two hosts never share): a writer killed mid-transaction leaves
a journal that the next caller rolls back. Where the lock file cannot be made (a store on a read-only
mount, or a directory the reader may not write) reads go ahead under SQLite's own locks alone.

A file that is not a clustergate store (not SQLite, another program's database, a damaged one, one of a
newer schema) is refused with one ``StoreError`` naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import clustergate
from clustergate.common import inputfile
from clustergate.record import resultsfile
from clustergate.record.verdict import of_record
from clustergate.secrets.redact import redact_by_value
from clustergate.store import rows as rows_mod
from clustergate.store.lock import DocumentError, LockNotWritable, StoreError, StoreLock
from clustergate.store.schema import MIGRATIONS, Migration, check_kind, check_version, migrate

TIMEOUT_S = 120.0
"""How long a caller waits for the store: a write takes milliseconds, so even a thousand nodes recording at
once are through well within it."""
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True, slots=True)
class Recorded:
    run: int
    """The stored document's number in the store."""
    new: bool
    """False when the same document was stored before (recording is idempotent)."""
    kind: str


@dataclass(frozen=True, slots=True)
class StoredFigure:
    """One part's figure as the store gives it back."""

    time: str | None
    """When its run started (ISO-8601, as results.json says)."""
    run: int
    path: str | None
    run_verdict: str | None
    """The run's verdict as computed again from its records when it was stored."""
    level: str | None
    profile: str | None
    test: str
    metric: str
    scope: str
    host: str | None
    gpu_index: int | None
    serial: str | None
    uuid: str | None
    value: float
    unit: str
    verdict: str
    """pass | warn | fail | unjudged: the figure against its criterion."""
    rank: int | None = None
    """The rank that measured it: what names a per-rank figure of a CPU run, which has no GPU index."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a merge or sign-off decided of one host."""

    time: str | None
    run: int
    kind: str
    path: str | None
    host: str
    status: str
    phase: str | None
    reasons: list[str]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


FIGURE_COLUMNS = ("r.started, r.id, r.path, r.judged, r.level, r.profile, f.test, f.metric, f.scope, f.host, "
                  "f.gpu_index, f.gpu_serial, f.gpu_uuid, f.value, f.unit, f.verdict, f.rank")
ORDER = "ORDER BY r.started_s IS NULL, r.started_s, r.id, f.host, f.gpu_index, f.rank, f.metric"


FIGURE_TYPES = (str, int, str, str, str, str, str, str, str, str, int, str, str, float, str, str)
"""What each of FIGURE_COLUMNS holds, as StoredFigure's fields say (a number may come back as an int)."""
FIGURE_REQUIRED = frozenset({"run", "test", "metric", "scope", "value", "unit", "verdict"})
"""StoredFigure's fields that are never None."""
DECISION_TYPES = (str, int, str, str, str, str, str)
DECISION_REQUIRED = frozenset({"run", "kind", "host", "status"})


def _damaged(path: Path, where: str, field: str, value: Any) -> StoreError:
    return StoreError(f"{path}: {where} holds {value!r} as its {field}, which is no value clustergate stores there: "
                      "the store was changed by another program or by hand, or is damaged; restore it from a backup, "
                      "or choose another --store")


def _checked(path: Path, what: type, row: Sequence[Any], types: Sequence[type], required: frozenset[str],
             where: str) -> list[Any]:
    """``row`` as ``what``'s fields, each of its type (StoreError naming the row and the field where one is not: a
    store edited by hand, a text in a numeric column)."""
    names = [f.name for f in dataclasses.fields(what)]
    for name, want, value in zip(names, types, row, strict=False):
        ok = value is None and name not in required
        ok = ok or (isinstance(value, (int, float)) and not isinstance(value, bool) if want is float
                    else isinstance(value, want) and not isinstance(value, bool))
        if not ok:
            raise _damaged(path, where.format(**{n: repr(v) for n, v in zip(names, row, strict=False)}), name, value)
    return list(row)


def _figure(row: Sequence[Any], path: Path) -> StoredFigure:
    return StoredFigure(*_checked(path, StoredFigure, row, FIGURE_TYPES, FIGURE_REQUIRED,
                                  "run #{run}'s figure {metric} of {host}"))


def _decision(row: Sequence[Any], path: Path) -> Decision:
    where = "run #{run}'s decision on host {host}"
    fields = _checked(path, Decision, row[:7], DECISION_TYPES, DECISION_REQUIRED, where)
    try:
        reasons = json.loads(row[7]) if isinstance(row[7], str) else None
    except ValueError:
        reasons = None
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise _damaged(path, where.format(run=repr(row[1]), host=repr(row[4])), "reasons", row[7])
    return Decision(*fields, reasons)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    """One store file. Cheap to make: nothing is opened until a call needs it."""

    def __init__(self, path: Path, *, timeout_s: float = TIMEOUT_S,
                 migrations: Sequence[Migration] = MIGRATIONS) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.migrations = migrations

    # ---- opening ---------------------------------------------------------------------------------
    def _check_file(self, *, creating: bool) -> None:
        if not self.path.parent.is_dir():
            raise StoreError(f"{self.path}: its directory {self.path.parent} does not exist; create it (a "
                             "directory every node mounts, for a store of the whole cluster)")
        if self.path.is_symlink():
            raise StoreError(f"{self.path}: a symbolic link; give the store's own path (clustergate writes no store "
                             "through a link)")
        try:
            head = inputfile.head(self.path, len(SQLITE_MAGIC))
        except inputfile.InputFileError as exc:
            raise StoreError(f"{exc}; --store names the store's file") from None
        except FileNotFoundError:
            if creating:
                return
            raise StoreError(f"{self.path}: no store there (nothing has been recorded into it); check --store or "
                             "CLUSTERGATE_STORE") from None
        except IsADirectoryError:
            raise StoreError(f"{self.path}: a directory; --store names the store's file, e.g. "
                             f"{self.path / 'clustergate.db'}") from None
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        if head and head != SQLITE_MAGIC:
            raise StoreError(f"{self.path}: not a clustergate store (not an SQLite database: it starts with "
                             f"{head[:8]!r}); choose another --store")

    def check(self) -> None:
        """StoreError when the path can never be a store here (its directory missing, a directory, a link, a file
        that is not SQLite); nothing is opened or locked, so a store another process holds passes."""
        self._check_file(creating=True)

    def _connect(self, *, write: bool, locked: bool) -> sqlite3.Connection:
        # A reader holding the lock opens the file read-write (without creating it): a journal left by a writer
        # killed mid-transaction is then rolled back, which a read-only connection cannot do.
        mode = "rwc" if write else "rw" if locked else "ro"
        try:
            conn = sqlite3.connect(f"file:{quote(str(self.path))}?mode={mode}", uri=True, timeout=self.timeout_s,
                                   isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot be opened ({exc})") from None
        try:
            if write:
                mode = conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
                if str(mode).lower() != "delete":
                    raise StoreError(f"{self.path}: SQLite kept journal mode {mode!r}; the store needs its rollback "
                                     "journal (no other program may hold it open in WAL mode)")
                conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """The database inside one transaction, under the store's lock; every SQLite error as StoreError."""
        self._check_file(creating=write)
        lock = StoreLock(self.path, self.timeout_s)
        try:
            lock.acquire()
        except LockNotWritable:
            if write:
                raise  # a reader of a read-only store goes ahead under SQLite's own locks
        try:
            conn = self._connect(write=write, locked=lock.held)
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                if write:
                    self._intact(conn)
                    migrate(conn, self.path, self.migrations)
                else:
                    self._readable(conn)
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise StoreError(self._damaged(exc)) from None
        finally:
            lock.release()

    def _intact(self, conn: sqlite3.Connection) -> None:
        """StoreError where SQLite's quick_check finds the file damaged. A write touches only the pages it needs, so
        a store whose other pages are garbage took a record ("recorded as run #9") that no reader could then read
        back; checked under the write's lock, before anything is written."""
        found = [str(row[0]) for row in conn.execute("PRAGMA quick_check").fetchall()]
        if found != ["ok"]:
            raise StoreError(f"{self.path}: damaged (SQLite's quick_check: {found[0]}); nothing was recorded: restore "
                             "it from a backup, or choose another --store")

    def _readable(self, conn: sqlite3.Connection) -> None:
        check_kind(conn, self.path)
        have = check_version(conn, self.path, self.migrations)
        if have < len(self.migrations):
            raise StoreError(f"{self.path}: the store is at schema version {have} and this clustergate reads version "
                             f"{len(self.migrations)}; record a run into it once (which upgrades it) with write "
                             "access to its directory")

    def _damaged(self, exc: sqlite3.DatabaseError) -> str:
        text = str(exc)
        if "readonly" in text:
            return (f"{self.path}: a writer was stopped mid-transaction and left its journal, which only a caller "
                    "with write access to the store's directory can roll back; record into the store once with that "
                    "access")
        if "locked" in text or "busy" in text:
            return (f"{self.path}: SQLite found the store locked for {self.timeout_s:g} s ({text}); another program "
                    "holds it open: clustergate's own callers take its lock file first")
        return (f"{self.path}: not a usable clustergate store (SQLite: {text}); if it was one, it is damaged: restore "
                "it from a backup, or choose another --store")

    # ---- writing ---------------------------------------------------------------------------------
    def record(self, document: Mapping[str, Any], kind: str | None = None,
               path: str | Path | None = None) -> Recorded:
        """Store a run's results.json, a merge's cluster results.json or a signoff.json (``kind``: run, cluster,
        signoff; default what the document says), redacted (``redact_by_value``: any secret in it is found by
        its value or its name, whichever host records it). Idempotent: the same document again returns its first
        record. A document that still says "running" is refused (it is not a finished run), as is one that
        breaks its schema, and another document of a run already stored (a re-judged or edited file)."""
        where = str(path) if path is not None else "the document"
        document = redact_by_value(document)  # a file written before a rule existed, or edited, keeps no secret here
        try:
            found = rows_mod.kind_of(document)
        except ValueError as exc:
            raise DocumentError(f"{where}: {exc}") from None
        if kind is not None and kind != found:
            raise DocumentError(f"{where}: recorded as kind {kind!r} but the document is a {found!r}")
        resultsfile.checked(document, Path(where), rows_mod.FILE_KINDS[found])
        if found == "run" and document.get("verdict") == "running":
            raise DocumentError(f"{where}: the run still says 'running' (under way, or killed before it ended); the "
                             "store keeps finished runs only")
        try:
            text = rows_mod.canonical(document)
        except ValueError as exc:
            raise DocumentError(f"{where}: not strict JSON ({exc})") from None
        digest, identity = rows_mod.digest(text), rows_mod.identity(document)
        judged = of_record(document).verdict if found == "run" else document.get("verdict")
        when = rows_mod.started(document)
        with self._transaction(write=True) as conn:
            before = conn.execute("SELECT id, digest, path FROM runs WHERE digest = ? OR identity = ?",
                                  (digest, identity)).fetchall()
            same = [r for r in before if r[1] == digest]
            if same:
                return Recorded(int(same[0][0]), False, found)
            if before:
                run, _, other = before[0]
                raise DocumentError(f"{where}: the store already holds this {found} as #{run} (from {other}) with "
                                    "other content (re-judged or edited since); the store keeps the first record of "
                                    "each")
            cur = conn.execute(
                "INSERT INTO runs (digest, identity, kind, path, recorded, started, started_s, verdict, judged, "
                "profile, level, hosts, document) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (digest, identity, found, None if path is None else str(path), _now(), when, rows_mod.seconds(when),
                 document.get("verdict"), judged, document.get("profile"), document.get("level"),
                 json.dumps(rows_mod.hosts(document)), text))
            run = int(cur.lastrowid or 0)
            conn.executemany(
                "INSERT INTO figures (run, test, metric, scope, host, node_rank, rank, gpu_index, gpu_serial, "
                "gpu_uuid, value, unit, criterion, verdict) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run, f.test, f.metric, f.scope, f.host, f.node_rank, f.rank, f.gpu_index, f.gpu_serial, f.gpu_uuid,
                  f.value, f.unit, f.criterion, f.verdict) for f in rows_mod.figure_rows(document)])
            conn.executemany("INSERT INTO decisions (run, host, status, phase, reasons) VALUES (?, ?, ?, ?, ?)",
                             [(run, d.host, d.status, d.phase, d.reasons) for d in rows_mod.decision_rows(document)])
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('written_by', ?)",
                         (f"clustergate {clustergate.__version__}",))
            return Recorded(run, True, found)

    def record_file(self, path: Path) -> Recorded:
        """Read ``path`` (a results.json, cluster results.json or signoff.json) and record it."""
        data = resultsfile.load_json(path)
        if not isinstance(data, dict):
            raise resultsfile.ResultsFileError(f"{path}: a JSON {type(data).__name__}, not a results file")
        return self.record(data, None, os.path.abspath(path))

    # ---- reading ---------------------------------------------------------------------------------
    def version(self) -> int:
        with self._transaction(write=False) as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def count(self) -> dict[str, int]:
        """How many documents of each kind the store holds."""
        with self._transaction(write=False) as conn:
            found = dict(conn.execute("SELECT kind, count(*) FROM runs GROUP BY kind").fetchall())
        return {k: int(found.get(k, 0)) for k in rows_mod.KINDS}

    def document(self, run: int) -> dict[str, Any]:
        """A stored document, whole."""
        with self._transaction(write=False) as conn:
            row = conn.execute("SELECT document FROM runs WHERE id = ?", (run,)).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no run #{run} in the store")
        return dict(json.loads(row[0]))

    def history(self, who: str | None = None, metric: str | None = None) -> list[StoredFigure]:
        """Every stored figure, oldest run first: of ``who`` (a host, a GPU serial or a GPU UUID; None: every
        part) and of ``metric`` (None: every metric)."""
        where, args = [], []
        if who is not None:
            where.append("(f.host = ? OR f.gpu_serial = ? OR f.gpu_uuid = ?)")
            args += [who, who, who]
        if metric is not None:
            where.append("f.metric = ?")
            args.append(metric)
        sql = (f"SELECT {FIGURE_COLUMNS} FROM figures f JOIN runs r ON r.id = f.run "
               f"{'WHERE ' + ' AND '.join(where) if where else ''} {ORDER}")
        with self._transaction(write=False) as conn:
            return [_figure(r, self.path) for r in conn.execute(sql, args)]

    def decisions(self, host: str | None = None) -> list[Decision]:
        """What every stored merge and sign-off decided of ``host`` (None: of every host), oldest first."""
        sql = ("SELECT r.started, r.id, r.kind, r.path, d.host, d.status, d.phase, d.reasons FROM decisions d "
               "JOIN runs r ON r.id = d.run " + ("WHERE d.host = ? " if host is not None else "") +
               "ORDER BY r.started_s IS NULL, r.started_s, r.id, d.host")
        with self._transaction(write=False) as conn:
            found = conn.execute(sql, [] if host is None else [host]).fetchall()
        return [_decision(r, self.path) for r in found]

    def baselines(self, metrics: Iterable[str], *, serials: Iterable[str] = (), hosts: Iterable[str] = (),
                  level: str | None = None, before: str | None = None) -> dict[tuple[str, str, str], StoredFigure]:
        """The first accepted figure of each metric of each GPU serial and of each node (host), in one read:
        ``{("gpu", serial, metric) | ("node", host, metric): figure}``, found only where one exists.

        Accepted: from a run whose records were judged accept when stored, and not a figure that missed its
        criterion. ``level``: only runs of that level (figures of different levels measure differently).
        ``before``: only runs that started before that time (the run being judged, and later ones, are not
        its own past)."""
        metrics, serials, hosts = sorted(set(metrics)), sorted(set(serials)), sorted(set(hosts))
        found: dict[tuple[str, str, str], StoredFigure] = {}
        if not metrics or not (serials or hosts):
            return found
        common = ["r.kind = 'run'", "r.judged = 'accept'", "f.verdict != 'fail'"]
        args: list[Any] = []
        if level is not None:
            common.append("r.level = ?")
            args.append(level)
        if before is not None and (limit := rows_mod.seconds(before)) is not None:
            common.append("r.started_s < ?")
            args.append(limit)
        chunk = 400  # well under SQLite's limit on bound values in one statement
        with self._transaction(write=False) as conn:
            for scope, column, keys in (("gpu", "f.gpu_serial", serials), ("node", "f.host", hosts)):
                part = "f.scope = 'gpu'" if scope == "gpu" else "f.scope != 'gpu'"
                for i in range(0, len(keys), chunk):
                    some = keys[i:i + chunk]
                    sql = (f"SELECT {FIGURE_COLUMNS} FROM figures f JOIN runs r ON r.id = f.run WHERE "
                           f"{' AND '.join(common)} AND {part} AND {column} IN ({', '.join('?' * len(some))}) "
                           f"AND f.metric IN ({', '.join('?' * len(metrics))}) {ORDER}")
                    for row in conn.execute(sql, [*args, *some, *metrics]):
                        fig = _figure(row, self.path)
                        key = fig.serial if scope == "gpu" else fig.host
                        found.setdefault((scope, str(key), fig.metric), fig)
        return found

    def accepted_runs(self, profile: str, level: str, *, nodes: int, world_size: int,
                      newest: int) -> list[dict[str, Any]]:
        """The documents of the ``newest`` runs of ``profile`` at ``level`` with ``world_size`` ranks on ``nodes``
        nodes that were judged accept when stored, newest first (a site's healthy durations are read from them)."""
        found = []
        with self._transaction(write=False) as conn:
            runs = conn.execute("SELECT id, hosts FROM runs WHERE kind = 'run' AND judged = 'accept' AND profile = ? "
                                "AND level = ? ORDER BY started_s IS NULL, started_s DESC, id DESC",
                                (profile, level)).fetchall()
            for run, hosts in runs:
                if len(found) >= newest:
                    break
                if len(json.loads(hosts)) != nodes:
                    continue
                document = json.loads(conn.execute("SELECT document FROM runs WHERE id = ?", (run,)).fetchone()[0])
                if document.get("world_size") == world_size:
                    found.append(document)
        return found

    def first_accepted(self, serial: str, metric: str, *, level: str | None = None,
                       before: str | None = None) -> StoredFigure | None:
        """The first accepted figure of ``metric`` of the GPU with this serial, on whichever host it was."""
        return self.baselines([metric], serials=[serial], level=level, before=before).get(("gpu", serial, metric))

    def first_accepted_node(self, host: str, metric: str, *, level: str | None = None,
                            before: str | None = None) -> StoredFigure | None:
        """The first accepted per-node figure of ``metric`` of ``host``."""
        return self.baselines([metric], hosts=[host], level=level, before=before).get(("node", host, metric))

