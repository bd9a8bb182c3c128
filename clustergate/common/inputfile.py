"""Reading a file a command or a rank was given: the one reader of every input (thresholds, results.json and
merge's node files, progress.jsonl, health's --state, --baseline, the results store, a key file).

Only a regular file is read, and no more of it than its kind can be: the path is opened without blocking
(``O_NONBLOCK``: opening a FIFO for reading would wait for a writer forever), then checked on the open
descriptor (``fstat``), so nothing can be swapped in between. A FIFO, a device, a socket, or a file larger than
its kind's cap is an ``InputFileError`` naming the path and what it is, raised at once: the command says it in
one line and exits 2, where a read would have hung or filled the memory. A path that does not exist, a directory,
or one that cannot be opened raises the ``OSError`` the caller already words (``FileNotFoundError``, ...).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MiB = 1 << 20

MAX_BYTES: dict[str, int] = {
    "thresholds": 16 * MiB,  # the shipped file is under 40 KB; a site file with every profile a few hundred KB
    "results": 512 * MiB,  # a results.json of a 1,000-node merge with every curve is tens of MB
    "progress": 256 * MiB,  # one line per test phase: a few KB a run
    "state": 1 * MiB,  # health's --state: one small JSON object
    "hmac": 64 * 1024,  # the site key of the records' HMAC (--key-file): bytes, not a document
    "hosts": 16 * MiB,  # a host list: one name a line
    "outcome": 1 * MiB,  # what rank 0 tells `clustergate run`: a few fields
}
"""How large each kind of input may be."""


class InputFileError(ValueError):
    """The path names something that is not a file of its kind (a FIFO, a device, too large); the message says
    which path and what it is."""


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def _open(path: Path) -> int:
    """A descriptor of ``path``, which must be a regular file (checked on the descriptor)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if not stat.S_ISREG(mode):
            raise InputFileError(f"{path}: {_kind_of(mode)}, not a regular file: not read (it could block or never "
                                 "end)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | Path, kind: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``MAX_BYTES[kind]`` bytes."""
    path = Path(path)
    limit = MAX_BYTES[kind]
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise InputFileError(f"{path}: {size} bytes, more than a {kind} file can be ({limit}): not read")
        chunks, read = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - read)):
            chunks.append(chunk)
            read += len(chunk)
            if read > limit:  # it grew while being read, or reports no size (a file of /proc)
                raise InputFileError(f"{path}: more than {limit} bytes, more than a {kind} file can be: not read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | Path, kind: str) -> str:
    """``read_bytes`` as UTF-8 text (``UnicodeDecodeError`` where it is not)."""
    return read_bytes(path, kind).decode("utf-8")


def head(path: str | Path, size: int) -> bytes:
    """The first ``size`` bytes of ``path``, a regular file, for a file another library then opens by its path
    (SQLite's store): anything else there is an ``InputFileError``, found without blocking."""
    fd = _open(Path(path))
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)
