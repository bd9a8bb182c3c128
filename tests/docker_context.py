"""The Dockerfile's build context: the checkout's files that ``.dockerignore`` lets through, copied elsewhere.

Docker's rules, as far as the file uses them: each line a pattern (``*`` and ``?`` within one path part, ``**``
across parts), ``!`` lets through what an earlier line kept out, the last line that matches a path decides, and a
pattern that matches a directory decides for everything under it.
"""

from __future__ import annotations

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
    return [(line.startswith("!"), _regex(line.lstrip("!"))) for line in lines if line and not line.startswith("#")]


def sent(rel: str, ruled: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the path ``rel`` (relative to the checkout, with '/') is in the build context."""
    parts = rel.split("/")
    verdict = True
    for through, pattern in ruled:
        if any(pattern.match("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            verdict = through
    return verdict


def copy_context(dest: Path, root: Path = ROOT) -> Path:
    """The build context of ``root`` copied to ``dest`` (links kept as links, as Docker sends them)."""
    ruled = rules(root)
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] == ".git" or path.is_dir() and not path.is_symlink() or not sent(rel, ruled):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            target.symlink_to(path.readlink())
        else:
            shutil.copy2(path, target)
    return dest
