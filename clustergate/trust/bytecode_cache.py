"""clustergate's own bytecode cache: the code ``clustergate.trust.source_import`` compiled from the suite's source, kept
between runs so that a warm start reads bytecode rather than compiling every module again.

An entry is named by what it was compiled from: the sha256 of the Python's bytecode magic, the kind of compilation
(plain, or rewritten by a given pytest) and the source's bytes. It is never found by a file's name, its time or a
header it carries (Python's own ``__pycache__`` is found that way, which is why the suite never reads it): only
code compiled from exactly those bytes is stored under that name. The file's path is not in the name (a clone of the
same commit shares the entries); the code is given the path it is loaded from.

The cache is ``$XDG_CACHE_HOME/clustergate/bytecode/<cache tag>`` (else ``~/.cache/...``), the running user's: the
directory and every entry must be owned by this user and writable by no one else, and an entry is opened without
following a link. Anything else is a miss, and the module is compiled from its source as if there were no cache.
Whoever can write files as the running user can put code there (as they can write a ``.pth`` file or
``sitecustomize``): docs/contract.md says so.

Standard library only: it is loaded before the import hook it serves.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import marshal
import os
import stat
import sys
import tempfile
import time
import types
from pathlib import Path

MAX_ENTRY_BYTES = 64 << 20
"""No module of the suite compiles to more than a fraction of this; a larger entry is not read."""
STALE_S = 30 * 24 * 3600.0
"""Entries not written for this long are removed when the cache is next written to: each change of a source file
leaves the old entry behind, and a run recompiles the few it still uses once."""
_HEADER = importlib.util.MAGIC_NUMBER


def key(source: bytes, flavour: str) -> str:
    """The entry's name for the code compiled from ``source`` the way ``flavour`` says (plain, or pytest's rewrite)."""
    h = hashlib.sha256(_HEADER)
    h.update(f"\0{flavour}\0{sys.flags.optimize}\0".encode())
    h.update(source)
    return h.hexdigest()


def _private(path: Path) -> bool:
    """``path`` is a directory (not a link) of this user's that no one else can write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
            and not stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH))


@functools.cache
def directory() -> Path | None:
    """The cache's directory, made (mode 0700) where missing; None where it cannot be used."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    path = Path(base) / "clustergate" / "bytecode" / (sys.implementation.cache_tag or "python")
    with contextlib.suppress(OSError):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path if _private(path) else None


def _refiled(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` as compiled from ``filename`` (tracebacks, pytest's locations and the plugins' check read it)."""
    if code.co_filename == filename:
        return code
    consts = tuple(_refiled(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def read(name: str, filename: str) -> types.CodeType | None:
    """The code stored as ``name`` (``key``), given ``filename`` as its file; None where there is none to trust."""
    where = directory()
    if where is None:
        return None
    try:
        fd = os.open(where / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > MAX_ENTRY_BYTES
                or stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH)):
            return None
        with open(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    if data[:len(_HEADER)] != _HEADER:
        return None
    try:
        code = marshal.loads(data[len(_HEADER):])
    except (ValueError, EOFError, TypeError):
        return None
    return _refiled(code, filename) if isinstance(code, types.CodeType) else None


def write(name: str, code: types.CodeType) -> None:
    """Store ``code`` as ``name``; nothing where the cache cannot be used or Python is told not to write bytecode."""
    where = directory()
    if where is None or sys.dont_write_bytecode:
        return
    _prune_once(where)
    try:
        fd, temporary = tempfile.mkstemp(dir=where, prefix=".new-")
    except OSError:
        return
    try:
        with open(fd, "wb") as f:
            f.write(_HEADER + marshal.dumps(code))
        os.replace(temporary, where / name)  # whole or not at all: a rank reading it meanwhile sees one or the other
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


@functools.cache
def _prune_once(where: Path) -> None:
    """Remove the entries (and temporary files a killed process left) not written for ``STALE_S``."""
    stale = time.time() - STALE_S
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < stale:
                    os.unlink(entry.path)
