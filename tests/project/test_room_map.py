"""The one map of the rooms (docs/how-it-works.md, "The map of the rooms") names every module of clustergate/ and
nothing that is not there; each room's ``__init__`` says in two or three lines what it owns and must not do, so
that the map is written once and cannot drift from the tree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from torchrun_job import ROOT

PACKAGE = ROOT / "clustergate"
DOC = ROOT / "docs" / "how-it-works.md"


def map_section(text: str) -> str:
    start = text.index("### The map of the rooms")
    end = text.find("\n## ", start)
    return text[start:end if end >= 0 else None]


def named(section: str) -> set[str]:
    """Every module path the map names in backticks (``run/plugin.py``, ``cli.py``)."""
    return {m for m in re.findall(r"`([\w/]+\.py)`", section) if not m.startswith("tests/")}


def modules() -> set[str]:
    """Every module under clustergate/, relative to it; a room's ``__init__.py`` is the room's own line."""
    found = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    return {m for m in found if not (m.endswith("/__init__.py"))}


def rooms() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def test_the_map_names_every_module_and_nothing_else() -> None:
    said = named(map_section(DOC.read_text()))
    assert not modules() - said, f"modules the map in {DOC.name} does not name: {sorted(modules() - said)}"
    assert not said - modules(), f"the map in {DOC.name} names modules that are not there: {sorted(said - modules())}"


def test_the_map_names_every_room() -> None:
    section = map_section(DOC.read_text())
    missing = [r.relative_to(PACKAGE).as_posix() for r in rooms()
               if f"`{r.relative_to(PACKAGE).as_posix()}/`" not in section]
    assert not missing, f"rooms the map does not name: {missing}"


def test_every_room_says_in_three_lines_at_most_what_it_owns() -> None:
    long = {}
    for room in rooms():
        doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
        if not doc or len(doc.splitlines()) > 3:
            long[room.relative_to(PACKAGE).as_posix()] = len(doc.splitlines())
    assert not long, f"rooms whose __init__ docstring is missing or longer than three lines: {long}"


def test_the_check_bites(tmp_path: Path) -> None:
    """A map that lacks a module, or names one that is gone, is seen."""
    section = map_section(DOC.read_text())
    assert "run/plugin.py" in named(section)
    assert "run/plugin.py" not in named(section.replace("`run/plugin.py`", "`plugin`"))
    assert "run/gone.py" in named(section + " `run/gone.py`") - modules()
