"""The fleet compiles once: torch.compile's kernels, saved by the first node that compiles them, loaded by the rest.

Every node of a cluster compiles the same graphs for the same GPU model with the same torch: on an H200 the GPT
test's first run paid about 20 s of compiling that a warm run does not. torch's own cache artifacts
(``torch.compiler.save_cache_artifacts``: the FX graph cache with its Triton kernels bundled, AOTAutograd's cache,
autotuning) are one blob; loading it (``load_cache_artifacts``) before the compile fills this node's caches, so the
compile finds its kernels there instead of building them.

Where: ``DIR/compiled/<what>-<key hash>.bin`` beside ``.json``, its sidecar, in a directory every node reads (the
shared directory). The key is everything that makes kernels differ or wrong: the GPU model, torch's, Triton's and
CUDA's versions, the suite's digest (a changed suite may compile other graphs) and what was compiled (the shape and
compile mode). An artifact is loaded only when its sidecar names exactly this key, its bytes have the sidecar's
sha256, and neither file is a link, owned by another user or writable by anyone but its owner (loaded kernels run
as code: whoever can write the file could run code on every node). Anything else is refused, never loaded: the
node compiles itself and its record says why (``Kernels``). An artifact for another key is never even opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import socket
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

SUBDIR = "compiled"
MAX_BYTES = 1 << 30
"""A GPT's artifacts are tens of MB; a larger file is refused unread."""


@dataclass(frozen=True, slots=True)
class Share:
    """Where a workload's compiled kernels are shared (None: nowhere) and the suite digest they are keyed by."""

    directory: str | None
    suite_digest: str


def key(device: torch.device, suite_digest: str, what: str) -> dict[str, str]:
    """What an artifact must have been made with to be loaded here."""
    try:
        import triton  # noqa: PLC0415 - absent on CPU-only installs; imported only to read its version
        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "none"
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        model = f"{gpu} (sm {cap})"
    else:
        model = f"cpu {platform.machine()}"
    return {"gpu": model, "torch": str(torch.__version__), "triton": triton_version,
            "cuda": str(torch.version.cuda or "none"), "suite_digest": suite_digest, "what": what}


def path_for(directory: str | os.PathLike[str], k: dict[str, str]) -> Path:
    """The artifact's file for key ``k`` (its sidecar is the same name with ``.json``)."""
    h = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:20]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in k["what"])[:80]
    return Path(directory) / SUBDIR / f"{safe}-{h}.bin"


@dataclass
class Kernels:
    """What a node's record says of its compiled kernels (a workload's ``details["kernels"]``)."""

    source: str = "compiled"
    """compiled (this node built them) | loaded (from ``artifact``) | off (nothing compiled)."""
    artifact: str | None = None
    """The file looked for (None: no shared directory named)."""
    note: str = ""
    """Why they were compiled here: no directory, none saved yet, or why the one there was refused."""
    refused: bool = False
    saved: bool = False
    """This node wrote ``artifact`` after compiling."""
    compiled_for: dict[str, str] = field(default_factory=dict)
    """The key (GPU, torch, Triton, CUDA, suite digest, shape); not named ``key``: the record redacts such fields."""
    cache_hits: int = 0
    cache_misses: int = 0
    """torch's FX graph and AOTAutograd cache lookups during the run: a load that did not serve shows misses."""

    def as_details(self) -> dict[str, Any]:
        return asdict(self)


def _unsafe(path: Path) -> str | None:
    """Why ``path`` may not be loaded as code, or None."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file (a link or a directory)"
    if info.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {info.st_uid}, neither this user ({os.geteuid()}) nor root"
    if stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    if info.st_size > MAX_BYTES:
        return f"is {info.st_size} bytes, over {MAX_BYTES}"
    return None


def _read_checked(blob: Path, k: dict[str, str]) -> tuple[bytes | None, str]:
    """The artifact's bytes where every check holds, else (None, why it is refused)."""
    sidecar = blob.with_suffix(".json")
    for p in (blob, sidecar):
        if (why := _unsafe(p)) is not None:
            return None, f"{p} {why}"
    try:
        meta = json.loads(sidecar.read_text())
        data = blob.read_bytes()
    except (OSError, ValueError) as exc:
        return None, f"{sidecar} or {blob} could not be read: {exc}"
    theirs = meta.get("compiled_for") if isinstance(meta, dict) else None
    if not isinstance(theirs, dict):
        return None, f"{sidecar} has no key"
    wrong = [f"{name} {theirs.get(name)!r}, here {value!r}" for name, value in k.items() if theirs.get(name) != value]
    if wrong or set(theirs) != set(k):
        return None, f"{sidecar} is for another key: " + "; ".join(wrong or ["other fields"])
    if meta.get("sha256") != hashlib.sha256(data).hexdigest():
        return None, f"{blob}'s sha256 is not its sidecar's: the file is damaged or was replaced"
    return data, ""


def _counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters  # noqa: PLC0415 - dynamo's import is paid only where it compiles
    hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    misses = counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"]
    return int(hits), int(misses)


def load(directory: str | os.PathLike[str] | None, k: dict[str, str]) -> Kernels:
    """Before compiling: load the artifact for ``k`` from ``directory`` where every check holds, and say so."""
    got = Kernels(compiled_for=k)
    got.cache_hits, got.cache_misses = (-x for x in _counts())  # the run's own lookups, from here on
    if directory is None:
        got.note = "no shared directory named (--shared-dir): every node compiles its own kernels"
        return got
    blob = path_for(directory, k)
    got.artifact = str(blob)
    if not blob.exists() and not blob.is_symlink():
        got.note = "no artifact for this key yet: compiled here"
        return got
    data, why = _read_checked(blob, k)
    if data is None:
        got.note, got.refused = f"refused: {why}; compiled here", True
        return got
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as exc:  # noqa: BLE001 - torch's loader raises what it likes; never fatal: compile instead
        info, why = None, f": {type(exc).__name__}: {exc}"
    else:
        why = " (it logged why)"  # torch returns None for bytes it cannot read
    if info is None:
        got.note, got.refused = f"refused: torch could not load {blob}{why}; compiled here"[:400], True
        return got
    got.source = "loaded"
    return got


def finish(got: Kernels, writer: bool) -> Kernels:
    """After the compiles: count the cache lookups and, where this rank is the ``writer`` and compiled itself,
    save the kernels for the nodes after it (a file another node is writing meanwhile is replaced whole)."""
    hits, misses = _counts()
    got.cache_hits += hits
    got.cache_misses += misses
    if got.source == "loaded" and got.cache_misses:
        got.note = f"loaded, but {got.cache_misses} lookups missed and compiled here"
    if not writer or got.artifact is None or got.source == "loaded":
        return got
    saved = torch.compiler.save_cache_artifacts()
    if not saved:
        got.note += "; torch had no artifacts to save"
        return got
    data = saved[0]
    blob = Path(got.artifact)
    meta = {"compiled_for": got.compiled_for, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
            "saved_by": socket.gethostname(), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp: Path | None = None
    try:
        blob.parent.mkdir(parents=True, exist_ok=True)
        for target, content in ((blob, data), (blob.with_suffix(".json"), json.dumps(meta, indent=1).encode())):
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            os.replace(tmp, target)  # whole or not at all: a reader never sees half a file
        got.saved = True
    except OSError as exc:  # a directory this node cannot write: it keeps what it compiled, and says so
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        got.note += f"; could not save {blob}: {exc.strerror or exc}"
    return got
