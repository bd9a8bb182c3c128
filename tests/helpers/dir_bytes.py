"""Every byte under a directory, to show a refused command changed nothing there."""

from __future__ import annotations

import hashlib
from pathlib import Path


def tree(directory: Path) -> dict[str, str]:
    """Each path under ``directory`` (relative, directories and links included) and what it is: a file's sha256, a
    link's target, or "dir". Equal before and after: nothing was written, moved (no earlier/), made or removed."""
    out: dict[str, str] = {}
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if path.is_symlink():
            out[name] = f"link -> {path.readlink()}"
        elif path.is_dir():
            out[name] = "dir"
        else:
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out
