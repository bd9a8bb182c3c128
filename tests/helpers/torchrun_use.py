"""Which of the suite's own tests start a torchrun job: found from their code, so no test is marked by hand.

A test starts one where its function, a fixture it uses, or a function of the suite's tests either reaches
(through the names their code uses, module attributes included: ``report_runs.shared``) names a command that
starts torchrun: ``python -m torch.distributed.run`` (torchrun_job's launchers, a test's own ``subprocess.run``)
or ``clustergate run``. The shared runs (conftest.SHARED_RUNS) count as well: a test that only reads one still
waits for the job that makes it. conftest.py marks each such test ``slow``, so ``-m "not slow"`` is the suite's
fast tier (docs/development.md).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
TORCHRUN = "torch.distributed.run"


def _ours(filename: str | None) -> bool:
    """Code of the suite's own tests (not the product's, nor a library's: neither starts a job on its own here)."""
    return filename is not None and Path(filename).resolve().is_relative_to(TESTS)


def _names_a_launch(words: list[str]) -> bool:
    """A command line that starts torchrun: ``-m torch.distributed.run`` or ``clustergate run``."""
    return TORCHRUN in words or any(a == "clustergate" and b == "run" for a, b in zip(words, words[1:], strict=False))


def _words(node: ast.List | ast.Tuple, names: dict[str, Any]) -> list[str]:
    """The words of a list or tuple written in the code, a starred global list (``*CARD``) spelled out."""
    words: list[str] = []
    for elt in node.elts:
        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
            words.append(elt.value)
        elif isinstance(elt, ast.Starred) and isinstance(elt.value, ast.Name):
            value = names.get(elt.value.id)
            words += [w for w in value if isinstance(w, str)] if isinstance(value, list | tuple) else []
        else:
            words.append("")  # sys.executable, a path: a word that is no part of the two spellings
    return words


def _commands_and_names(tree: ast.AST) -> Iterator[ast.AST]:
    """The lists, tuples, names and attributes of ``tree``, less what an assertion compares with (``cmd == [...,
    "torch.distributed.run", ...]`` checks a printed command, it starts nothing)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.Compare):
            continue
        if isinstance(child, ast.List | ast.Tuple | ast.Name | ast.Attribute):
            yield child
        yield from _commands_and_names(child)


_known: dict[types.CodeType, bool] = {}


def _starts(obj: Any) -> bool:
    """Whether calling ``obj`` (a function or a class of the suite's tests) may start a torchrun job."""
    if isinstance(obj, type):
        return any(_starts(member) for member in vars(obj).values() if inspect.isfunction(member))
    if not inspect.isfunction(obj):
        return False
    func = inspect.unwrap(obj)
    code = func.__code__
    if not _ours(code.co_filename):
        return False
    if code in _known:
        return _known[code]
    _known[code] = False  # while it is read: a cycle of calls adds nothing
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, SyntaxError):
        return False
    names = func.__globals__
    found = False
    for node in _commands_and_names(tree):
        if isinstance(node, ast.List | ast.Tuple):
            found = _names_a_launch(_words(node, names))
        elif isinstance(node, ast.Name):
            value = names.get(node.id)
            found = (isinstance(value, list | tuple) and _names_a_launch([w for w in value if isinstance(w, str)])
                     ) or _starts(value)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = names.get(node.value.id)  # report_runs.shared: a helper module's function
            if isinstance(module, types.ModuleType) and _ours(getattr(module, "__file__", None)):
                found = _starts(getattr(module, node.attr, None))
        if found:
            break
    _known[code] = found
    return found


def starts_torchrun(item: pytest.Item, shared_runs: tuple[str, ...]) -> bool:
    """Whether the test ``item`` starts a torchrun job or waits for a shared run's."""
    if any(name in item.fixturenames for name in shared_runs):
        return True
    if _starts(getattr(item, "function", None)):
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else []
    return any(_starts(fixture.func) for chain in defs for fixture in chain)
