"""This machine's directories out of a report: a path under the suite's root, the report directory, the working
directory or the home directory is shown relative to it (``acceptance/test_node.py``, ``~/site.yaml``), so a
report handed to another person names no directory of the machine that ran."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from clustergate.trust.suitefiles import suite_root


class Unplaced:
    """Rewrites the absolute paths of known roots in a text: each root, and each way it is written (as given and
    resolved), with what stands for it; the longest first, so a report directory inside the checkout is itself."""

    def __init__(self, report_dir: Path | None = None) -> None:
        roots: list[tuple[str, str]] = []
        for root, shown in ((report_dir, "./"), (suite_root(), ""), (Path.cwd(), ""), (Path.home(), "~/")):
            if root is None:
                continue
            for written in {str(root), os.path.realpath(root)}:
                if written not in ("", "/"):
                    roots.append((written.rstrip("/"), shown))
        self.roots = sorted(roots, key=lambda r: -len(r[0]))
        # A root, then a path under it or the root alone (``/root`` is not the start of ``/rootfs``).
        self.patterns = [(re.compile(re.escape(root) + r"(/|(?![\w.-]))"), shown) for root, shown in self.roots]

    def __call__(self, text: str) -> str:
        for (root, _), (pattern, shown) in zip(self.roots, self.patterns, strict=True):
            if root in text:
                text = pattern.sub(lambda m, s=shown: s if m.group(1) else s.rstrip("/") or ".", text)
        return text

    def of(self, value: Any) -> Any:
        """A copy of JSON-like ``value`` with every string (keys too) rewritten."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {self.of(k): self.of(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.of(v) for v in value]
        return value

