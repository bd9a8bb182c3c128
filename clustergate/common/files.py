"""Files written whole or not at all, and never in place of what is not a regular file.

- ``atomic_file``/``write_atomic``: a file written whole or not at all, through a private temporary file of a random
  name (``tempfile.mkstemp``) renamed over it: a link planted under any name is never written through;
- ``not_a_file``: what a name is where a writer must not replace it: a directory, a FIFO, a device, a socket
  (``NotAFile``, refused before anything is written). A rename replaces whatever has the name, and root may
  replace anything: ``-o /dev/null`` would swap the device for a regular file;
- ``umask``: this process's umask, read without changing it (a file written gets the user's umask).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_a_file(path: Path) -> str | None:
    """What ``path`` is where it exists and is not a regular file ("a FIFO (named pipe)", "a character device",
    ...), else None: absent, a regular file, or a symbolic link (a writer replaces a link's name, never what it
    points to). The name itself is looked at (``lstat``), never followed."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None  # absent, or its directory cannot be read: the write says so itself
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return None
    return next((kind for test, kind in KINDS if test(mode)), "not a regular file")


class NotAFile(OSError):
    """An output name that exists as something no writer of clustergate replaces (``not_a_file``): its message
    names it, and it reads as that message alone (no errno in front)."""

    def __init__(self, path: Path, kind: str, wanted: str = "a regular file") -> None:
        self.kind = kind
        rule = ("writes an output only as a new or a regular file and leaves this one as it is; name a file"
                if wanted == "a regular file" else
                "writes its outputs only into a directory (made where none is) and leaves this one as it is; name one")
        super().__init__(errno.EEXIST, f"{path} is {kind}, not {wanted}: clustergate {rule}", str(path))

    def __str__(self) -> str:
        return str(self.strerror)


def refuse_not_a_file(path: Path) -> None:
    """NotAFile where ``path`` exists and is not a regular file or a link (``not_a_file``)."""
    kind = not_a_file(path)
    if kind is not None:
        raise NotAFile(path, kind)


def refuse_not_a_directory(path: Path) -> None:
    """NotAFile where ``path`` exists and is neither a directory nor a link (a directory an output goes into)."""
    kind = not_a_file(path)
    if kind not in (None, "a directory"):
        raise NotAFile(path, kind, "a directory")
    if kind is None and path.exists() and not path.is_dir():  # a regular file, or a link to one
        raise NotAFile(path, "a file", "a directory")


def not_files(path: Path, names: tuple[str, ...]) -> list[NotAFile]:
    """A refusal (NotAFile) for each of ``names`` in the directory ``path`` that is there as something other than
    a regular file or a link (an output or lock name a writer would replace)."""
    return [NotAFile(path / name, kind) for name in names if (kind := not_a_file(path / name)) is not None]


def umask() -> int:
    """This process's umask, read without changing it (os.umask sets it: a race with other threads)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """A file to write that becomes ``path`` whole when the block ends, or not at all (an exception in the
    block, or a failed write, leaves the previous file). ``mode`` is "w" (UTF-8 text) or "wb".

    The temporary file has a random name (``mkstemp``: O_EXCL, 0600), so a link planted under a
    predictable name such as ``results.json.tmp`` is never written through; ``os.replace`` then swaps
    the name itself, a link there included, never what a link points to. The file gets the user's umask.
    A ``path`` that is a directory, a FIFO, a device or a socket is never replaced (NotAFile, nothing written).
    """
    refuse_not_a_file(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # named by the file asked for, not by a temporary name the user never gave
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~umask())
        refuse_not_a_file(path)  # again: made while the file was written
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.filename is not None:
            raise
        # A write or flush that failed (a full disk, a quota) names no file: name the one asked for.
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (``atomic_file``)."""
    with atomic_file(path) as f:
        f.write(text)
