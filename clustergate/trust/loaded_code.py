"""What this process runs of the suite, checked against the files the run attested (``clustergate.trust.suitefiles``):
every module of clustergate, acceptance and workloads it has imported, and the checkout's ``conftest.py``.

- A module ``clustergate.trust.source_import`` loaded was compiled from the bytes of its source: their sha256 must be
the
  attested file's (a source changed between its import and the digest is named).
- A module loaded before that hook was installed (the package's ``__init__``, the hook and what it imports, the
  checkout's ``conftest.py``), or by another importer, ran the bytecode its loader takes where the header of a
  ``__pycache__`` file matches the source (Python's rule, or pytest's for what it rewrites), else the source. Where it
  takes one, that bytecode's code object must equal the code compiled (or rewritten) from the attested source: code
  objects compare their instructions, constants, names and lines, not the path they were compiled under, so the
  image's ``compileall`` and a site's count as the suite's; anything else is named.
- A module of the suite's packages from anywhere but the attested files, or from bytecode alone, is named.

``foreign`` lists them as results.json's ``attestation.foreign_code`` (``{"module", "file", "why"}``); any makes the
run partial (``clustergate.trust.attestation``). The bytecode files are read when the check runs, at the run's start and
collection: one swapped back before then is not seen (docs/contract.md says what that leaves open).
"""

from __future__ import annotations

import _imp
import functools
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import types
from pathlib import Path
from typing import Any

from clustergate.trust import source_import, suitefiles

_NOT_SOURCE = "bytecode not compiled from its source, under a header that matches the source"
FROM_ARCHIVE = "imported from an archive on the import path, not from the suite's files"
"""The why of a module whose file is inside a zip: its ``file`` is the archive, which the advice names."""


def foreign(checked: suitefiles.Checked) -> list[dict[str, str]]:
    """Each module this process loaded of the suite whose code is not compiled from the attested files ``checked``."""
    by_path = {str(path): rel for rel, path in checked.paths.items()}
    out = []
    for name, module in sorted(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None)
        ours = name.partition(".")[0] in suitefiles.PACKAGES
        if not ours and not (isinstance(origin, str) and origin.endswith("conftest.py")):
            continue  # not the suite's (a conftest.py may be the checkout's, loaded as ``conftest``)
        located = isinstance(origin, str) and getattr(spec, "has_location", False)
        real = source_import.real_path(origin) if located else None
        rel = by_path.get(real) if real else None
        if not ours and rel is None:
            continue  # another conftest.py: a plugin, judged as one (clustergate.trust.attestation)
        if spec is not None and spec.origin is None and spec.submodule_search_locations is not None:
            continue  # a namespace package: no code
        why = _why(spec, real, rel, checked)
        if why is not None:
            out.append({"module": name, "file": why[0] or str(origin), "why": why[1]})
    return out


def _why(spec: Any, real: str | None, rel: str | None, checked: suitefiles.Checked) -> tuple[str | None, str] | None:
    """(the file it names, why) where the module's code is not the attested source's; None where it is."""
    loader = getattr(spec, "loader", None)
    if spec is None or real is None:
        return None, "not loaded from a file of the suite (no import spec or location)"
    if (archive := _archive(loader, spec.origin)) is not None:
        return archive, FROM_ARCHIVE
    if rel is None:
        return None, "loaded from outside the files the run attested"
    if isinstance(loader, source_import.SourceLoader):
        if loader.sha256 is not None and loader.sha256 != checked.sha256.get(rel):
            return None, "compiled from bytes that are not the attested file's (it changed while the run started)"
        return None
    rewriter = source_import.rewriter_of(loader)
    if rewriter is None and not isinstance(loader, importlib.machinery.SourceFileLoader):
        return None, f"loaded by {type(loader).__name__}, not compiled from its source"
    try:
        source = Path(real).read_bytes()
    except OSError as exc:
        return None, f"its source cannot be read to check its bytecode ({exc.strerror or exc})"
    return _taken(real, source, rewriter)


@functools.lru_cache(maxsize=64)
def _checked_once(path: str, data: bytes, source: bytes, rewriter: Any | None) -> bool:
    """Whether the bytecode ``data`` (a pyc's body) is the code ``source`` (the file ``path``) compiles to, rewritten
    by ``rewriter`` where pytest rewrites it (the same bytes are checked once a process: the attestation is written
    more than once)."""
    try:
        code = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return False
    return isinstance(code, types.CodeType) and code == source_import.compiled(source, path, rewriter)


def _archive(loader: Any, origin: str) -> str | None:
    """The archive a module was imported from (zipimport's, or the regular file its path runs through); None for a
    module of a regular file. No __pycache__ is involved there: the advice is to import the suite's own files."""
    archive = getattr(loader, "archive", None)  # zipimport.zipimporter
    if isinstance(archive, str):
        return archive
    for parent in Path(origin).parents:
        if parent.is_file():
            return str(parent)
        if parent.exists():
            return None
    return None


def _taken(path: str, source: bytes, rewriter: Any | None) -> tuple[str | None, str] | None:
    """What the module at ``path`` ran, by its loader's rule: None where that is ``source``'s code."""
    if rewriter is not None:
        try:
            from _pytest.assertion.rewrite import PYC_TAIL, get_cache_dir
        except ImportError:
            return None, "pytest rewrote it, and this pytest does not say where it keeps the bytecode to check"
        pyc = get_cache_dir(Path(path)) / (Path(path).name[:-3] + PYC_TAIL)
        body = _pytest_pyc(path, str(pyc))
    else:
        pyc = Path(importlib.util.cache_from_source(path))
        body = _python_pyc(path, str(pyc), source)
    if body is None:
        return None  # no bytecode its loader would take: the source was compiled
    if _checked_once(path, body, source, rewriter):
        return None
    return str(pyc), _NOT_SOURCE


def _read(pyc: str) -> bytes | None:
    try:
        with open(pyc, "rb") as f:
            return f.read(suitefiles.MAX_FILE_BYTES)
    except OSError:
        return None


def _header_matches_stat(header: bytes, path: str) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    return (int.from_bytes(header[8:12], "little") == int(info.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == info.st_size & 0xFFFFFFFF)


def _pytest_pyc(path: str, pyc: str) -> bytes | None:
    """The body of pytest's rewritten bytecode for ``path`` where pytest takes it (``_read_pyc``: magic, no flags, the
    source's time and size), else None."""
    data = _read(pyc)
    if data is None or len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER or data[4:8] != b"\0\0\0\0":
        return None
    return data[16:] if _header_matches_stat(data, path) else None


def _python_pyc(path: str, pyc: str, source: bytes) -> bytes | None:
    """The body of Python's bytecode for ``path`` where Python's importer takes it (PEP 552: a timestamp header that
    matches the source's time and size, a checked hash that matches its source hash, or an unchecked hash, as
    ``--check-hash-based-pycs`` says), else None."""
    data = _read(pyc)
    if data is None or len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags = int.from_bytes(data[4:8], "little")
    if flags & ~0b11:
        return None
    if not flags & 0b01:
        return data[16:] if _header_matches_stat(data, path) else None
    checks = _imp.check_hash_based_pycs
    if checks != "never" and (flags & 0b10 or checks == "always"):
        return data[16:] if data[8:16] == importlib.util.source_hash(source) else None
    return data[16:]
