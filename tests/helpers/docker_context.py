"""The Dockerfile's build context: the checkout's files that ``.dockerignore`` lets through, copied elsewhere.

Docker's rules, as far as the file uses them: each line a pattern (``*`` and ``?`` within one path part, ``**``
across parts), ``!`` lets through what an earlier line kept out, the last line that matches a path decides, and a
pattern that matches a directory decides for everything under it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from torchrun_job import ROOT


def _regex(pattern: str) -> re.Pattern[str]:
    out = ""
    for token in re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/")):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return re.compile(out + r"\Z")


def rules(root: Path = ROOT) -> list[tuple[bool, re.Pattern[str]]]:
    """(lets through, pattern) per line of ``root``'s .dockerignore."""
    lines = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if nested := [line for line in lines if line.startswith("!") and "/" in line.strip("/")]:
        raise ValueError(f".dockerignore: {nested[0]}: copy_context prunes a directory kept out, so a '!' line may "
                         "name only a top-level path")
    return [(line.startswith("!"), _regex(line.lstrip("!"))) for line in lines]


def sent(rel: str, ruled: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the path ``rel`` (relative to the checkout, with '/') is in the build context."""
    parts = rel.split("/")
    verdict = True
    for through, pattern in ruled:
        if any(pattern.match("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            verdict = through
    return verdict


def copy_context(dest: Path, root: Path = ROOT) -> Path:
    """The build context of ``root`` copied to ``dest`` (links kept as links, as Docker sends them). A directory
    kept out is not walked (a virtual environment in the checkout holds thousands of files): no line of the file
    lets a path under one through again."""
    ruled = rules(root)
    for top, dirs, files in os.walk(root):
        here = Path(top).relative_to(root).as_posix()
        dirs[:] = [d for d in dirs if sent(f"{d}" if here == "." else f"{here}/{d}", ruled)]
        for name in files:
            path = Path(top) / name
            rel = path.relative_to(root).as_posix()
            if not sent(rel, ruled):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink():
                target.symlink_to(path.readlink())
            else:
                shutil.copy2(path, target)
    return dest
