"""Exact integer data for collectives: what each rank sends, what it must receive, and the check.

Every rank's data repeats a short tile of random non-zero integers, rolled by a rank-specific
offset (so ranks send different data and a no-op collective is caught). Sums stay exact: values
are bounded so that a partial sum over n ranks never leaves the dtype's exact-integer range
(2^24 for fp32, 2^8 for bf16). The check compares every element, exactly, on the device.
"""

from __future__ import annotations

import torch

from workloads.result import WorkloadError

EXACT = {"fp32": 1 << 24, "bf16": 1 << 8}
"""Every integer of magnitude up to this is exact in the dtype (24 and 8 significand bits)."""
TILE = 4096


def chunked(collective: str) -> bool:
    """Collectives whose size column is n chunks, one per rank."""
    return collective in ("all_gather", "reduce_scatter", "all_to_all")


def shape(collective: str, size: int, n: int, elt: int) -> tuple[int, int]:
    """(unit, tile): elements of a rank's buffer (of one chunk, for chunked collectives), rounded down
    to a multiple of the tile length (a power of two, at most 4096) the data repeats with."""
    unit = size // elt // (n if chunked(collective) else 1)
    if unit < 1:
        raise WorkloadError(f"{collective} of {size} bytes over {n} ranks leaves less than one element per rank; "
                            "sweep larger sizes")
    tile = min(TILE, 1 << (unit.bit_length() - 1))
    return unit // tile * tile, tile


def size_bytes(collective: str, unit: int, n: int, elt: int) -> int:
    """S, the size column nccl-tests prints for a buffer (chunk) of ``unit`` elements."""
    return unit * elt * (n if chunked(collective) else 1)


def offset(rank: int, tile: int, peer: int = 0) -> int:
    """How far rank's data (for ``peer``, in all_to_all) is rolled: distinct ranks get distinct data."""
    return (rank * 977 + peer * 331 + 13) % tile


def make_tile(tile: int, amplitude: int, seed: int) -> torch.Tensor:
    """Random non-zero integers in [-amplitude, amplitude] (float64 on the CPU); never zeros."""
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.randint(1, amplitude + 1, (tile,), generator=g)
    sign = torch.randint(0, 2, (tile,), generator=g) * 2 - 1
    return (magnitude * sign).to(torch.float64)


def amplitude(collective: str, dtype: str, n: int) -> int:
    """Largest value such that every partial sum of n ranks stays an exact integer in the dtype."""
    if collective in ("all_reduce", "reduce_scatter"):
        if n > EXACT[dtype]:
            raise WorkloadError(f"{dtype} sums of {n} ranks are not exact even for +-1 data; use fp32")
        return max(1, EXACT[dtype] // n)
    return min(EXACT[dtype], 1 << 12)


def expected(collective: str, base: torch.Tensor, n: int, rank: int) -> torch.Tensor:
    """(k, tile) float64: the rows rank's output repeats (k = n for all_gather and all_to_all)."""
    tile = base.numel()

    def roll(r: int, peer: int = 0) -> torch.Tensor:
        return torch.roll(base, -offset(r, tile, peer))

    if collective in ("all_reduce", "reduce_scatter"):
        return torch.stack([roll(s) for s in range(n)]).sum(0, keepdim=True)
    if collective == "all_gather":
        return torch.stack([roll(s) for s in range(n)])
    if collective == "all_to_all":
        return torch.stack([roll(s, rank) for s in range(n)])
    if collective == "broadcast":
        return roll(0)[None]
    return roll((rank - 1) % n)[None]  # sendrecv: from the previous rank of the ring


def inputs(collective: str, base: torch.Tensor, n: int, rank: int, unit: int, dtype: torch.dtype,
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(send, out) for group rank ``rank``; ``out`` starts as rank's own data, never the expected one."""
    tile = base.numel()
    reps = unit // tile
    own = torch.roll(base, -offset(rank, tile)).to(device=device, dtype=dtype)
    if collective == "all_to_all":
        send = torch.cat([torch.roll(base, -offset(rank, tile, p)).to(device=device, dtype=dtype).repeat(reps)
                          for p in range(n)])
        return send, send.clone()
    send = own.repeat(reps * (n if collective == "reduce_scatter" else 1))
    if collective in ("all_reduce", "broadcast"):
        return send, send  # in place
    if collective == "all_gather":
        return send, own.repeat(reps * n)
    return send, own.repeat(reps)


def mismatch(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Compare ``got`` (flat; repeats of ``want``'s rows in order) with ``want`` (k, tile), exactly."""
    k, tile = want.shape
    view = got.view(k, -1, tile)
    bad = view != want.to(device=got.device, dtype=got.dtype)[:, None, :]
    nbad = int(bad.sum())
    if nbad == 0:
        return None
    first = int(torch.argmax(bad.flatten().to(torch.uint8)))
    row, col = first // (view.shape[1] * tile), first % tile
    return (f"{nbad} of {got.numel()} elements wrong, first at element {first} (chunk {row}): got "
            f"{float(got.flatten()[first])}, expected {float(want[row, col])}")
