"""The Python files this process imported from its environment, checked against what their distribution installed:
every module in ``sys.modules`` whose file is not the suite's (``clustergate.trust.suitefiles`` attests those) nor
Python's own standard library, each checked against the RECORD (a sha256 per file) of the distribution that lists
it in the directory of ``sys.path`` it was found under. The one rule for a file of an installed distribution:
pytest's, pytest-html's and pytest-metadata's plugin files are checked by it too (``clustergate.trust.attestation``).

A module's source file is what is checked, also where Python ran its ``__pycache__`` bytecode (RECORD gives the
bytecode no hash: pip writes it after the wheel, or the image's ``compileall`` does; checking that bytecode compiles
from the source would compile every module of torch). A file is *unattested*, named with why, where
- its bytes are not the ones its RECORD gives (an edited file of torch),
- no RECORD in its directory lists it (a file planted in site-packages; a module loaded from bytecode alone),
- its RECORD lists it without a sha256 (a distribution installed by something other than a wheel),
- it lies in a directory of ``sys.path`` that holds no distribution with a RECORD (a folder on ``PYTHONPATH``, an
  editable install's source folder added by its ``.pth``, an egg or a Debian package's egg-info): nothing says what
  it should be, as with a copy of the suite without git.
Python's own library and a virtual environment's ``_virtualenv.py`` stay out; a file in no directory of
``sys.path`` (torch.compile's generated kernels, a module an importer of its own loads) is no distribution's: counted
as ``outside``, not checked.
Compiled extensions (``.so``) are not checked: they, the driver and the kernel stay out (docs/contract.md says what a
site can do about it).

Results are kept for this process alone (a module's code does not change once it is loaded); nothing is written.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import os
import re
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clustergate.trust import source_import, suitefiles

SOURCE_SUFFIXES = (".py", ".pyc")
"""What a Python module is loaded from (``.pyc``: bytecode without its source); extensions stay out."""
SHOWN = 6
VIRTUALENV_FILE = "_virtualenv.py"
"""What virtualenv and uv write at the top of a virtual environment's site-packages (with a ``.pth`` that imports
it), listed by no RECORD: the environment's own, left out as Python's own library is."""


@dataclass(frozen=True, slots=True)
class Listing:
    """A file as a distribution's RECORD lists it."""

    distribution: str
    version: str
    sha256: str
    """urlsafe base64, unpadded, as RECORD writes it; ``''`` where it gives none."""


@dataclass(frozen=True, slots=True)
class Checked:
    """This process's imported environment files, checked."""

    files: int
    """How many were checked."""
    unattested: tuple[tuple[str, str], ...]
    """(file, why) of each that is not as its distribution installed it."""
    outside: int = 0
    """How many lie in no directory of ``sys.path``: code made at run time (torch.compile's kernels under
    ``TORCHINDUCTOR_CACHE_DIR``) or loaded by an importer of its own; no distribution's files, not checked."""

    def section(self) -> dict[str, object]:
        """results.json's ``attestation.environment_code``."""
        return {"checked": self.files, "unattested": [{"file": f, "why": w} for f, w in self.unattested],
                "outside": self.outside}


def record_hash(data: bytes) -> str:
    """The sha256 of ``data`` as RECORD writes it."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


_NAME = re.compile(r"[-_.]+")


def _normal(name: str) -> str:
    return _NAME.sub("-", name).lower()


@functools.cache
def _stdlib() -> tuple[str, ...]:
    """Where Python's own library lies (its site-packages excepted: ``_directory`` finds those first)."""
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib") if key in paths})


@functools.cache
def _directories(path: tuple[str, ...]) -> tuple[str, ...]:
    """The directories of ``sys.path`` (resolved), the longest first: a file belongs to the first that holds it."""
    return tuple(sorted({os.path.realpath(p or os.curdir) for p in path}, key=len, reverse=True))


@functools.cache
def _dist_infos(directory: str) -> tuple[str, ...]:
    try:
        with os.scandir(directory) as entries:
            return tuple(sorted(e.name for e in entries if e.name.endswith(".dist-info") and e.is_dir()))
    except OSError:
        return ()


@functools.cache
def _record(directory: str, info: str) -> Mapping[str, Listing]:
    """The Python files ``info`` (a dist-info folder in ``directory``) lists: path relative to ``directory`` (as
    RECORD writes it) -> its listing."""
    name, _, version = info[: -len(".dist-info")].partition("-")
    try:
        with open(os.path.join(directory, info, "RECORD"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    out = {}
    for line in lines:
        # Most rows need no CSV quoting (torch's RECORD has tens of thousands): split those by hand.
        row = next(csv.reader([line]), []) if '"' in line else line.rsplit(",", 2)
        if len(row) < 2 or not row[0].endswith(SOURCE_SUFFIXES):
            continue
        algorithm, _, value = row[1].partition("=")
        out[row[0]] = Listing(name, version, value if algorithm == "sha256" else "")
    return out


@functools.cache
def _top_level(directory: str, info: str) -> frozenset[str]:
    try:
        with open(os.path.join(directory, info, "top_level.txt"), encoding="utf-8") as f:
            return frozenset(line.strip() for line in f if line.strip())
    except (OSError, UnicodeDecodeError):
        return frozenset()


@functools.cache
def _candidates(directory: str, top: str) -> tuple[str, ...]:
    """The dist-info folders of ``directory`` in the order they likely list a file of the top-level ``top``: by name
    (``torch``, ``pytest-html``), by top_level.txt, then every other one (only a file none lists reads them all)."""
    infos = _dist_infos(directory)
    wanted = {_normal(top.lstrip("_")), _normal(top)}
    named = [i for i in infos if _normal(i[: -len(".dist-info")].partition("-")[0]) in wanted]
    listed = [i for i in infos if i not in named and top in _top_level(directory, i)]
    return (*named, *listed, *(i for i in infos if i not in named and i not in listed))


def _directory(real: str) -> str | None:
    return next((d for d in _directories(tuple(sys.path)) if real.startswith(d + os.sep)), None)


def listing(path: str) -> Listing | None:
    """How the RECORD of a distribution installed in ``path``'s directory of ``sys.path`` lists it (``path``:
    resolved); None where none does."""
    directory = _directory(path)
    if directory is None:
        return None
    relative = path[len(directory) + 1:].replace(os.sep, "/")
    top = relative.split("/", 1)[0].removesuffix(".py").removesuffix(".pyc")
    for info in _candidates(directory, top):
        if (listed := _record(directory, info).get(relative)) is not None:
            return listed
    return None


@functools.cache
def problem(path: str) -> str | None:
    """Why the file ``path`` (resolved) is not one a distribution installed as it installed it; None where it is, or
    where it is Python's own library."""
    directory = _directory(path)
    if directory is None or directory in _stdlib() or path == os.path.join(directory, VIRTUALENV_FILE):
        return None  # Python's own library, or no distribution's file (``check`` counts those ``outside``)
    if not _dist_infos(directory):
        return (f"no distribution in {directory} has a RECORD (a folder on PYTHONPATH, an egg or a system package): "
                "nothing says what it should be")
    listed = listing(path)
    if listed is None:
        return f"no distribution installed it (no RECORD in {directory} lists it)"
    if not listed.sha256:
        return f"{listed.distribution} {listed.version}'s RECORD gives it no sha256: nothing says what it should be"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if record_hash(data) != listed.sha256:
        return (f"not the file {listed.distribution} {listed.version} installed (its sha256 is not the one its "
                "RECORD gives)")
    return None


def imported(skip: Iterable[str] = ()) -> list[str]:
    """The source (or sourceless bytecode) file of every module this process imported, resolved and sorted, less the
    files ``skip`` (the suite's own, resolved), the suite's packages (``clustergate.trust.loaded_code`` judges them
    wherever they come from) and what pytest compiled with its assertion rewriting: the test modules, conftest files
    and plugins it was given, judged as the suite's tests (``clustergate.trust.completeness``) and as plugins
    (``clustergate.trust.attestation.plugin_entry``: pytest-html's files by this module's rule)."""
    skipped = set(skip)
    out = set()
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if name.partition(".")[0] in suitefiles.PACKAGES or source_import.rewriter_of(getattr(spec, "loader", None)):
            continue
        origin = getattr(spec, "origin", None) if spec is not None else getattr(module, "__file__", None)
        if spec is not None and not getattr(spec, "has_location", False):
            continue  # built in, frozen, a namespace package, made at run time: no file
        if not isinstance(origin, str) or not origin.endswith(SOURCE_SUFFIXES) or not os.path.isabs(origin):
            continue
        real = source_import.real_path(origin)
        if real not in skipped:
            out.add(real)
    return sorted(out)


def check(skip: Iterable[str] = ()) -> Checked:
    """Every file this process imported from its environment (``imported``) that lies in a directory of
    ``sys.path``, checked (``problem``); those outside every one are counted."""
    files = imported(skip)
    inside = [f for f in files if _directory(f) is not None]
    bad = tuple((f, why) for f in inside if (why := problem(f)) is not None)
    return Checked(len(inside), bad, len(files) - len(inside))


def named(unattested: list[tuple[str, str]]) -> str:
    """The files, for a one-line problem: the first ``SHOWN`` with why, the rest counted."""
    said = ", ".join(f"{f} ({w})" for f, w in unattested[:SHOWN])
    return said + (f" (and {len(unattested) - SHOWN} more)" if len(unattested) > SHOWN else "")

