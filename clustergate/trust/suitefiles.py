"""The files of the suite a rank runs, as it finds them, checked against the reference they came with.

The suite's files are every file of the packages ``clustergate``, ``acceptance`` and ``workloads`` (``__pycache__``
left out; the shipped thresholds and manifest are among them), and in a checkout the root ``conftest.py`` and the
root ``thresholds.yaml`` the package links to. Where each package was imported from decides where they are found.

The reference is, in this order:
- ``RECORD``: the installed distribution's RECORD (a sha256 per file), where the packages are installed from a
  wheel (the dist-info beside them lists ``clustergate/__init__.py``);
- ``git``: the checkout's tree at HEAD (a blob id per file), where they are a git checkout (an editable install is
  one); a clone another user owns is read all the same (``safe.directory`` for that one repository, nothing of
  its configuration run);
- ``none``: neither (a copy of the suite, a checkout without git): nothing says what the files should be.

A file found that the reference does not list is *extra*; one it lists that is not there, *missing*; one whose
bytes differ, *modified*. Only a regular file (or a link) is read: a FIFO or a device planted among the files is
never opened for reading, and counts as differing.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("clustergate", "acceptance", "workloads")
CHECKOUT_FILES = ("conftest.py", "thresholds.yaml")
"""Files of the suite at a checkout's root (a wheel has none: its thresholds are the package's own copy)."""
MAX_FILE_BYTES = 64 << 20
"""No file of the suite is near this; a larger one planted among them is not read (it differs, whatever it holds)."""
GIT_TIMEOUT_S = 20.0
GIT_LINK_MODE = "120000"
GIT_SUBMODULE_MODE = "160000"


@dataclass(frozen=True, slots=True)
class Checked:
    """The suite's files checked against their reference."""

    digest: str
    """``sha256:<hex>`` over the sorted (relative path, sha256 of the bytes) of every file found."""
    reference: str
    """``RECORD``, ``git`` or ``none``."""
    modified: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    why_none: str | None = None
    """Why there is no reference (``reference`` is ``none``), in words."""
    paths: Mapping[str, Path] = field(default_factory=dict, compare=False, repr=False)
    """Where each file digested was found (relative path -> path), for what the process loaded to be checked
    against (``clustergate.trust.loaded_code``)."""
    sha256: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """The sha256 (hex) of each file's bytes as digested (``unreadable`` for one never read)."""


def package_dirs() -> dict[str, Path]:
    """Where each package of the suite is imported from (found without importing one not imported yet)."""
    out = {}
    for name in PACKAGES:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module is not None else None
        if origin is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
        if origin:
            out[name] = Path(origin).resolve().parent
    return out


def suite_root() -> Path:
    """The directory holding the suite's packages: a checkout's root, or site-packages of an installed wheel."""
    return package_dirs()["clustergate"].parent


def _walk(directory: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(directory):
        here = Path(dirpath)
        for d in list(dirnames):
            if d == "__pycache__":
                dirnames.remove(d)
            elif (here / d).is_symlink():  # a link to a directory is one entry, as git keeps it
                dirnames.remove(d)
                yield here / d
        for f in filenames:
            yield here / f


def find(dirs: dict[str, Path], checkout: Path | None = None) -> dict[str, Path]:
    """Every file of the suite: each package's (``dirs``: name -> where it is imported from) and, in a
    ``checkout``, its root files; by path relative to the directory holding the packages, sorted."""
    files: dict[str, Path] = {}
    for name, directory in dirs.items():
        for path in _walk(directory):
            files[f"{name}/{path.relative_to(directory).as_posix()}"] = path
    for name in CHECKOUT_FILES if checkout is not None else ():
        if os.path.lexists(checkout / name):
            files[name] = checkout / name
    return dict(sorted(files.items()))


def content(path: Path) -> bytes | None:
    """The bytes of a regular file (through a link); a link to anything else: its target, as git keeps a link;
    None for what is never read (a FIFO, a device, a file too large)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return os.readlink(path).encode() if path.is_symlink() else None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return os.readlink(path).encode() if path.is_symlink() else None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def hashes(contents: dict[str, bytes | None]) -> dict[str, str]:
    """Each file's sha256 (hex), ``unreadable`` for one never read."""
    return {rel: hashlib.sha256(data).hexdigest() if data is not None else "unreadable"
            for rel, data in contents.items()}


def digest(seen: Mapping[str, str]) -> str:
    """``sha256:<hex>`` over the sorted (relative path, sha256) of the files ``seen`` (their ``hashes``)."""
    h = hashlib.sha256()
    for rel in sorted(seen):
        h.update(f"{rel}\0{seen[rel]}\n".encode())
    return "sha256:" + h.hexdigest()


# ---- references -------------------------------------------------------------------------------------------------
def record_of(root: Path) -> dict[str, str] | None:
    """The RECORD of the distribution installed at ``root`` that holds ``clustergate/__init__.py``: relative path ->
    its urlsafe-base64 sha256 (``''`` for a file RECORD lists without a hash); None where none is installed there."""
    for info in sorted(root.glob("clustergate-*.dist-info")):
        try:
            text = (info / "RECORD").read_text(encoding="utf-8")
        except OSError:
            continue
        rows = {}
        for row in csv.reader(io.StringIO(text)):
            if row and row[0].split("/", 1)[0] in PACKAGES and "__pycache__" not in row[0].split("/"):
                algorithm, _, value = (row[1] if len(row) > 1 else "").partition("=")
                rows[row[0]] = value if algorithm == "sha256" else ""
        if "clustergate/__init__.py" in rows:
            return rows
    return None


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def git_repository(root: Path) -> Path | None:
    """The work tree ``root`` lies in (a ``.git`` directory, or a worktree's ``.git`` file), or None."""
    for directory in (root, *root.parents):
        if os.path.lexists(directory / ".git"):
            return directory
    return None


class NoReference(Exception):
    """Why the reference cannot be read, in words."""


def git_tree(root: Path, repository: Path) -> dict[str, tuple[str, str]]:
    """The tree at HEAD under ``root``: relative path -> (mode, blob id), for the suite's packages and root files."""
    # Only the object database is read: no index, no hooks, no pager, no fsmonitor. A clone another user owns is
    # "dubious" to git, which then refuses to read it: this one repository is declared safe for this command alone.
    command = ["git", "--no-pager", "-c", f"safe.directory={repository}", "-c", "core.fsmonitor=false",
               "ls-tree", "-r", "-z", "HEAD", "--", *PACKAGES, *CHECKOUT_FILES]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        proc = subprocess.run(command, cwd=root, env=env, capture_output=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise NoReference(f"{root} is a git checkout but git is not installed to read its tree") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoReference(f"git could not read the tree of {repository}: {exc}") from None
    if proc.returncode != 0:
        said = next((line for line in proc.stderr.decode(errors="replace").splitlines() if line.strip()), "")
        raise NoReference(f"git could not read the tree at HEAD of {repository} ({said.strip() or proc.returncode})")
    tree = {}
    for entry in proc.stdout.split(b"\0"):
        if not entry:
            continue
        meta, _, raw = entry.partition(b"\t")
        mode, _, rest = meta.decode().partition(" ")
        path = raw.decode(errors="surrogateescape")
        if "__pycache__" not in path.split("/"):  # never a suite file, committed or not
            tree[path] = (mode, rest.rpartition(" ")[2])
    return tree


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's object id, not a secret


def _differences(contents: dict[str, bytes | None], expected: dict[str, str],
                 same: dict[str, bool]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    modified = tuple(rel for rel in contents if rel in expected and not same[rel])
    extra = tuple(rel for rel in contents if rel not in expected)
    missing = tuple(sorted(rel for rel in expected if rel not in contents))
    return modified, extra, missing


def check(dirs: dict[str, Path] | None = None) -> Checked:
    """The suite's files, digested and checked against their reference: this installation's, or those of the
    packages at ``dirs`` (name -> directory)."""
    dirs = package_dirs() if dirs is None else dirs
    roots = {d.parent for d in dirs.values()}
    if len(dirs) != len(PACKAGES) or len(roots) != 1:
        files = find(dirs)
        contents = {rel: content(path) for rel, path in files.items()}
        seen = hashes(contents)
        where = ", ".join(f"{name} from {d}" for name, d in dirs.items()) or "none of them found"
        return Checked(digest(seen), "none", paths=files, sha256=seen,
                       why_none=f"the suite's packages do not come from one directory ({where})")
    [root] = roots
    record = record_of(root)
    repository = None if record is not None else git_repository(root)
    files = find(dirs, checkout=root if repository is not None else None)
    contents = {rel: content(path) for rel, path in files.items()}
    seen = hashes(contents)
    found = {"paths": files, "sha256": seen}
    total = digest(seen)
    if record is not None:
        same = {rel: data is not None and record.get(rel) == _record_hash(data) for rel, data in contents.items()}
        return Checked(total, "RECORD", *_differences(contents, record, same), **found)
    if repository is None:
        return Checked(total, "none", why_none=f"{root} is neither an installed wheel (no clustergate-*.dist-info "
                                               "with a RECORD) nor a git checkout", **found)
    try:
        tree = git_tree(root, repository)
    except NoReference as exc:
        return Checked(total, "none", why_none=str(exc), **found)
    blobs = {rel: blob for rel, (mode, blob) in tree.items() if mode != GIT_SUBMODULE_MODE}
    same = {}
    for rel, data in contents.items():
        if tree.get(rel, ("",))[0] == GIT_LINK_MODE:  # git keeps a link as its target
            same[rel] = files[rel].is_symlink() and _blob_id(os.readlink(files[rel]).encode()) == blobs[rel]
        else:
            same[rel] = data is not None and _blob_id(data) == blobs.get(rel)
    return Checked(total, "git", *_differences(contents, blobs, same), **found)
