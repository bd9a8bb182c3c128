"""The plugin's own collectives, over the gloo control group: every exchange says what it is for.

Each exchange starts with the same small header on every rank: the tag of its ``Step`` (which test,
which phase), a value and a payload size, reduced with MAX. When the tags disagree a rank is at
another step (it left the test, or the run) and every rank learns it at once, with each rank's
step named, instead of pairing one rank's "call of test A" with another's "end of the session".
Every wait has a deadline: a peer that never arrives is reported, not waited on forever. A peer
that died is seen at once (gloo closes its connections).

What travels is JSON (UTF-8, its length first), never pickle: a rank unpickling what a peer sends would
run whatever the bytes say. What arrives is decoded and, where the caller gives a ``check``, turned into
its type by it; bytes that are not JSON, or JSON of the wrong shape, are one ``ControlMalformed`` naming
the rank that sent them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from clustergate.run import interrupts
from clustergate.run.ranks.world import World
from clustergate.secrets.redact import outgoing

T = TypeVar("T")

LABEL_BYTES = 256
"""How much of each rank's step label is shared when ranks disagree (enough for a test id and phase)."""


@dataclass(frozen=True, slots=True)
class Step:
    """What an exchange is for: a test and phase (``test`` None: the session), and until when to wait."""

    test: str | None
    phase: str
    deadline: float | None = None
    """time.monotonic() by which every rank must have arrived; None: the control group's own timeout."""
    note: str = ""
    """Said to the other ranks if they are elsewhere (why this rank is here); not part of the tag."""

    def __str__(self) -> str:
        where = f"{self.test} [{self.phase}]" if self.test else self.phase
        return f"{where} ({self.note})" if self.note else where

    @property
    def tag(self) -> int:
        digest = hashlib.blake2b(f"{self.test}\0{self.phase}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1  # non-negative int64


def within(seconds: float) -> float:
    """A deadline ``seconds`` from now."""
    return time.monotonic() + seconds


class ControlLost(RuntimeError):
    """A control exchange failed: a peer rank died, or did not arrive before the deadline."""

    timed_out = False
    """True when the deadline passed (a peer never arrived); False when a peer died or stopped answering."""
    waited_s = 0.0


class ControlMalformed(ControlLost):
    """A rank sent a control message that is not JSON or not of the expected shape (``rank`` sent it)."""

    def __init__(self, step: Step, rank: int, why: str) -> None:
        self.rank = rank
        super().__init__(f"control exchange '{step}': rank {rank} sent a malformed message ({why}); refused "
                         "(every rank must run the same clustergate: see clustergate.version in results.json)")


class ControlMismatch(ControlLost):
    """Ranks arrived at different steps: ``labels[r]`` is where rank r is."""

    def __init__(self, step: Step, labels: list[str]) -> None:
        self.labels = labels
        groups: dict[str, list[int]] = {}
        for rank, label in enumerate(labels):
            groups.setdefault(label, []).append(rank)
        said = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))} at '{label}'"
                         for label, r in groups.items())
        super().__init__(f"ranks are at different steps (a rank left the test or the run): {said}")


def _label(step: Step) -> torch.Tensor:
    raw = str(step).encode()[:LABEL_BYTES]
    out = torch.zeros(LABEL_BYTES, dtype=torch.uint8)
    out[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return out


def _wait(work: Any, step: Step, world: World) -> None:
    """Wait for ``work`` until the step's deadline; ControlLost naming the step on failure."""
    left = None if step.deadline is None else max(step.deadline - time.monotonic(), 0.001)
    try:
        if left is None:
            work.wait()
        else:
            work.wait(timeout=timedelta(seconds=left))
    except Exception as exc:  # gloo raises RuntimeError/DistError subclasses
        # gloo may give up a moment before the deadline, saying "timed out"; a dead peer closes its connection
        timed_out = step.deadline is not None and ("timed out" in str(exc).lower()
                                                   or time.monotonic() >= step.deadline - 0.5)
        if timed_out:
            lost = ControlLost(f"control exchange '{step}' did not complete within {left:.0f} s on rank "
                               f"{world.rank}: a peer rank never arrived")
            lost.timed_out, lost.waited_s = True, left or 0.0
            raise lost from exc
        first = str(exc).splitlines()[0].split(". ")[0] if str(exc) else ""  # gloo adds advice and a palm tree
        raise ControlLost(f"control exchange '{step}' failed on rank {world.rank}: a peer rank died or "
                          f"stopped answering ({type(exc).__name__}: {first})") from exc


def _header(world: World, step: Step, value: int, size: int) -> tuple[int, int]:
    """Every rank's header reduced: (max value, max payload size); ControlMismatch if steps differ."""
    t = torch.tensor([step.tag, -step.tag, value, size], dtype=torch.int64)
    _wait(dist.all_reduce(t, op=dist.ReduceOp.MAX, group=world.control, async_op=True), step, world)
    if int(t[0]) != -int(t[1]):  # the largest tag is not the smallest: not every rank is here
        labels = [torch.zeros(LABEL_BYTES, dtype=torch.uint8) for _ in range(world.world_size)]
        _wait(dist.all_gather(labels, _label(step), group=world.control, async_op=True), step, world)
        raise ControlMismatch(step, [x.numpy().tobytes().rstrip(b"\0").decode(errors="replace") for x in labels])
    return int(t[2]), int(t[3])


def encode(obj: Any) -> bytes:
    """``obj`` as a control message: JSON text. A value JSON cannot carry is a TypeError naming it."""
    def refuse(value: Any) -> Any:
        raise TypeError(f"a control message carries JSON only (dicts with str keys, lists, str, numbers, bools, "
                        f"None), not {type(value).__name__}: {value!r:.80}")
    return json.dumps(obj, default=refuse, separators=(",", ":")).encode()


def decode(raw: bytes) -> Any:
    """A control message's value; ValueError saying why when it is not JSON (pickle, say: never loaded)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}; its first bytes are {raw[:12].hex(' ')}") from None


def _pack(raw: bytes, size: int) -> torch.Tensor:
    """``raw`` in a ``size``+8 byte buffer, its own length first."""
    buf = torch.zeros(size + 8, dtype=torch.uint8)
    buf[:8] = torch.frombuffer(bytearray(len(raw).to_bytes(8, "little")), dtype=torch.uint8)
    if raw:
        buf[8: 8 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return buf


def _unpack(buf: torch.Tensor, rank: int, step: Step, check: Callable[[Any], Any] | None) -> Any:
    """The value rank ``rank`` sent, decoded and checked; ControlMalformed naming that rank otherwise."""
    data = buf.numpy().tobytes()
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ControlMalformed(step, rank, f"its length prefix says {n} bytes, the buffer holds {len(data) - 8}")
    try:
        value = decode(data[8: 8 + n])
        return check(value) if check is not None else value
    except (ValueError, TypeError, KeyError) as exc:
        raise ControlMalformed(step, rank, str(exc)) from None


def max_int(world: World, value: int, step: Step) -> int:
    """The largest ``value`` over all ranks (one small collective: the header alone)."""
    if world.control is None:
        return value
    with interrupts.deferred():
        return _header(world, step, value, 0)[0]


def all_gather(world: World, obj: Any, step: Step | str, check: Callable[[Any], T] | None = None) -> list[T]:
    """Every rank's ``obj`` on every rank, in rank order (as JSON carries it: tuples arrive as lists),
    each turned into its type by ``check`` (which raises ValueError, TypeError or KeyError on a bad shape)."""
    step = _as_step(step)
    raw = encode(outgoing(obj))  # this rank's secrets never leave it: no other rank knows them to scrub
    if world.control is None:
        return [_unpack(_pack(raw, len(raw)), 0, step, check)]
    with interrupts.deferred():
        _, size = _header(world, step, 0, len(raw))
        out = [torch.zeros(size + 8, dtype=torch.uint8) for _ in range(world.world_size)]
        _wait(dist.all_gather(out, _pack(raw, size), group=world.control, async_op=True), step, world)
    return [_unpack(b, r, step, check) for r, b in enumerate(out)]


def gather_to_leader(world: World, obj: Any, step: Step, check: Callable[[Any], T] | None = None) -> list[T] | None:
    """Every rank's ``obj``, in rank order, on rank 0 (checked as in ``all_gather``); None on other ranks."""
    raw = encode(outgoing(obj))
    if world.control is None:
        return [_unpack(_pack(raw, len(raw)), 0, step, check)]
    with interrupts.deferred():
        _, size = _header(world, step, 0, len(raw))
        out = [torch.zeros(size + 8, dtype=torch.uint8) for _ in range(world.world_size)] if world.is_leader else None
        _wait(dist.gather(_pack(raw, size), out, dst=0, group=world.control, async_op=True), step, world)
    return None if out is None else [_unpack(b, r, step, check) for r, b in enumerate(out)]


def broadcast_from_leader(world: World, obj: Any, step: Step | str, check: Callable[[Any], T] | None = None) -> T:
    """Rank 0's ``obj`` on every rank (checked as in ``all_gather``)."""
    step = _as_step(step)
    raw = encode(outgoing(obj)) if world.is_leader else b""
    if world.control is None:
        return _unpack(_pack(raw, len(raw)), 0, step, check)  # type: ignore[no-any-return]
    with interrupts.deferred():
        _, size = _header(world, step, 0, len(raw))
        buf = _pack(raw, size) if world.is_leader else torch.zeros(size + 8, dtype=torch.uint8)
        _wait(dist.broadcast(buf, src=0, group=world.control, async_op=True), step, world)
    return _unpack(buf, 0, step, check)  # type: ignore[no-any-return]


def _as_step(step: Step | str) -> Step:
    """A bare name (callers outside the plugin: ``cg.all_ranks``) is a step of its own, no deadline of its own."""
    return step if isinstance(step, Step) else Step(None, step)
