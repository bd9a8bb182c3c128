"""Where this rank is in every process group's collectives, from torch's own records.

Every collective a rank calls gets the next sequence number of its process group, the same on every rank
(``ProcessGroup._get_sequence_number_for_group``). torch's flight recorder (one for gloo, one for NCCL) keeps,
per process group, the last collective enqueued, the last whose device work started (NCCL, with
``TORCH_NCCL_ENABLE_TIMING``) and the last completed; its entries say what each was (``gloo:all_reduce``).

From these a rank knows, without any exchange, which collective it waits in and since when; its peers, reading
what it publishes, know which of them never entered that collective, or entered it and never started it on the
device. Every call here is guarded: torch's private API moves between versions (the recorder's dump functions
came in torch 2.4 for NCCL and later for gloo), and what could not be read is None, never an error. ``SOURCE``
says which of torch's records this process could read.
"""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

DUMPS: dict[str, tuple[str, ...]] = {
    "gloo": ("_dump_fr_trace_json",),
    "nccl": ("_dump_nccl_trace_json", "_dump_nccl_trace"),
}
"""torch's flight-recorder dump functions per backend (``torch._C._distributed_c10d``), the JSON one first; the
pickled one is this process's own record, read back by this process."""


@dataclass(frozen=True, slots=True)
class Group:
    """One process group as this rank sees it."""

    name: str
    """The group's name (``ProcessGroup.group_name``), the same on every rank."""
    ranks: tuple[int, ...]
    """Its members, as global ranks."""
    backend: str
    entered: int
    """The sequence number of the last collective this rank called in it (0: none yet)."""
    started: int | None = None
    """The last whose device work started (NCCL with timing only); None where not known."""
    done: int | None = None
    """The last completed; None where not known."""

    @property
    def open(self) -> int | None:
        """The oldest collective this rank entered and that has not completed; None when none (or not known)."""
        if self.done is None or self.entered <= self.done:
            return None
        return self.done + 1

    @property
    def waiting(self) -> int | None:
        """The collective this rank waits in for its peers: entered, not completed and, where the recorder says
        when device work starts, started (one entered but not started waits for this rank's own device)."""
        seq = self.open
        if seq is None or (self.started is not None and self.started >= 0 and self.started < seq):
            return None
        return seq

    def as_beat(self) -> list[int]:
        """[entered, started, done] (-1 where not known): what a beat publishes of it."""
        return [self.entered, -1 if self.started is None else self.started, -1 if self.done is None else self.done]


def _c10d() -> dict[str, Any]:
    """torch's C++ distributed bindings, as a namespace of functions ({} where torch has none)."""
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return {}
    return vars(c10d)


def _dump(backend: str, collectives: bool) -> dict[str, Any] | None:
    """The backend's flight-recorder dump of this process (without its entries unless ``collectives``), or None."""
    functions = _c10d()
    for name in DUMPS.get(backend, ()):
        fn: Callable[..., Any] | None = functions.get(name)
        if fn is None:
            continue
        try:
            if name.endswith("_json"):
                return json.loads(fn(collectives, not collectives))  # type: ignore[no-any-return]
            return _plain(pickle.loads(fn(collectives, False, not collectives)))  # noqa: S301 (this process's own)
        except Exception:  # a version that takes other arguments, or a recorder that is off
            continue
    return None


def _plain(data: Any) -> Any:
    """The pickled dump's bytes keys as text, as the JSON dump has them."""
    if isinstance(data, dict):
        return {(k.decode() if isinstance(k, bytes) else str(k)): _plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_plain(v) for v in data]
    return data.decode(errors="replace") if isinstance(data, bytes) else data


class FlightRecorder:
    """This process's collectives, read on every beat (a few microseconds: the recorder's per-group status alone);
    the recorder's entries are read only to learn which group a status belongs to, and what a collective was."""

    def __init__(self) -> None:
        self._names: dict[tuple[str, str], str] = {}
        """(backend, the recorder's group id) -> the group's name."""
        self.source = "sequence numbers"
        """Which of torch's records were read (said in the evidence of a hang)."""

    def groups(self) -> list[Group]:
        """Every process group this rank is a member of, where it is in each."""
        members = _members()
        status: dict[str, dict[str, list[int]]] = {}
        sources = []
        for backend in sorted({b for _, _, b in members.values()}):
            by_id = self._status(backend)
            if by_id is not None:
                status[backend] = by_id
                sources.append(f"{backend} flight recorder")
        self.source = ", ".join(sources) or "sequence numbers"
        out = []
        for name, (pg, ranks, backend) in members.items():
            entered = _sequence(pg)
            started = done = None
            recorded = status.get(backend, {}).get(name)
            if recorded is not None:
                entered = max(entered, recorded[0])
                started = recorded[1] if recorded[1] >= 0 else None
                done = recorded[2]
            elif backend in status:  # recorded nothing of it: it never ran a collective here
                done = entered if entered == 0 else None
            out.append(Group(name, ranks, backend, entered, started, done))
        return out

    def _status(self, backend: str) -> dict[str, list[int]] | None:
        """The recorder's status of each group of ``backend``, by group name: [enqueued, started, completed]."""
        dump = _dump(backend, collectives=False)
        if dump is None or not isinstance(dump.get("pg_status"), dict):
            return None
        raw: dict[str, Any] = dump["pg_status"]
        if any((backend, pg_id) not in self._names for pg_id in raw):
            self._learn(backend)
        out = {}
        for pg_id, fields in raw.items():
            name = self._names.get((backend, pg_id))
            if name is None:
                continue
            with contextlib.suppress(KeyError, TypeError, ValueError):
                out[name] = [int(fields["last_enqueued_collective"]), int(fields["last_started_collective"]),
                             int(fields["last_completed_collective"])]
        return out

    def _learn(self, backend: str) -> None:
        """Which group each of the recorder's group ids is, from its entries (each names its group)."""
        dump = _dump(backend, collectives=True) or {}
        for entry in dump.get("entries") or []:
            with contextlib.suppress(KeyError, TypeError, IndexError):
                self._names[(backend, str(entry["pg_id"]))] = str(entry["process_group"][0])

    def describe(self, name: str, seq: int) -> dict[str, Any] | None:
        """What collective ``seq`` of group ``name`` was, as this rank's recorder has it: its operation, state,
        sizes and when it was made (wall clock, ns); None where the recorder does not have it."""
        return next((e for e in self._collectives(name) if e["seq"] == seq), None)

    def open_collective(self, name: str, done: int, entered: int) -> dict[str, Any] | None:
        """The oldest collective of group ``name`` after ``done`` and up to ``entered`` that this rank's recorder
        has and has not seen complete (as ``describe`` says it); None where there is none. The recorder's status
        counts point-to-point operations too, and may never see a batched send or receive complete: only a
        collective's entry says a rank waits in it."""
        waiting = [e for e in self._collectives(name) if done < e["seq"] <= entered and not e["completed"]]
        return min(waiting, key=lambda e: e["seq"], default=None)

    def _collectives(self, name: str) -> list[dict[str, Any]]:
        """Group ``name``'s collectives (not its point-to-point operations) in this rank's recorder, newest first:
        a full dump of its entries (tens of ms for the 2000 it keeps): read once for a wait that lasts."""
        backend = _members().get(name, (None, (), ""))[2]
        out = []
        for b in [backend] if backend in DUMPS else list(DUMPS):
            dump = _dump(b, collectives=True) or {}
            for entry in reversed(dump.get("entries") or []):
                try:
                    if str(entry["process_group"][0]) != name or entry.get("is_p2p"):
                        continue
                    state = str(entry.get("state", ""))
                    out.append({"seq": int(entry["collective_seq_id"]), "op": str(entry.get("profiling_name", "")),
                                "state": state, "input_sizes": entry.get("input_sizes"),
                                "bytes": _bytes(entry.get("input_sizes"), entry.get("input_dtypes")),
                                "created_ns": entry.get("time_created_ns"),
                                "completed": bool(entry.get("retired")) or state == "completed"})
                except (KeyError, TypeError, ValueError, IndexError):
                    continue
        return out


DTYPE_BYTES = {"Double": 8, "Long": 8, "ComplexFloat": 8, "ComplexDouble": 16, "Float": 4, "Int": 4, "Half": 2,
               "BFloat16": 2, "Short": 2, "UInt16": 2, "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1,
               "Float8_e5m2": 1}
"""Bytes per element of the recorder's dtype names (c10's); one it does not list counts 4."""


def _bytes(sizes: Any, dtypes: Any) -> int:
    """A collective's input in bytes, from the recorder's ``input_sizes`` (each tensor's shape) and
    ``input_dtypes``; 0 where it does not say."""
    try:
        total = 0
        for shape, dtype in zip(sizes or [], dtypes or [], strict=False):
            count = 1
            for n in shape:
                count *= int(n)
            total += count * DTYPE_BYTES.get(str(dtype), 4)
        return total
    except (TypeError, ValueError):
        return 0


def _members() -> dict[str, tuple[Any, tuple[int, ...], str]]:
    """Every process group this rank is a member of: name -> (group, its global ranks, its backend)."""
    if not dist.is_available() or not dist.is_initialized():
        return {}
    out = {}
    try:
        world = dist.distributed_c10d._world
        for pg, ranks in list(world.pg_group_ranks.items()):
            if not isinstance(pg, dist.ProcessGroup):
                continue  # the marker of a group this rank is not in
            with contextlib.suppress(Exception):
                out[pg.group_name] = (pg, tuple(sorted(ranks)), str(dist.get_backend(pg)).lower())
    except Exception:
        return {}
    return out


def _sequence(pg: Any) -> int:
    try:
        return int(pg._get_sequence_number_for_group())
    except Exception:
        return 0


def default_group_name() -> str | None:
    """The workloads' process group's name (the default group's)."""
    try:
        return str(dist.distributed_c10d._get_default_group().group_name)
    except Exception:
        return None
