"""Which of the suite's own tests start a torchrun job: found from their code, so no test is marked by hand.

A test starts one where its function, a fixture it uses, or a function of the suite's tests either reaches (through
the names their code uses, module attributes included: ``report_runs.shared``) names a command that starts torchrun:
``python -m torch.distributed.run`` (torchrun_job's launchers, a test's own ``subprocess.run``) or ``clustergate
run``; or torchrun_job.start_ranks, a job's ranks started as torchrun would. The shared runs (conftest.SHARED_RUNS)
count as well: a test that only reads one still waits for the job that makes it. conftest.py marks each such test
``slow``, and ``command`` each test that runs one of clustergate's commands in a process of its own (``python -m
clustergate merge``), so ``-m "not slow and not command"`` is the suite's fast tier of unit and pytester tests
(docs/development.md).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import torchrun_job

TESTS = Path(__file__).resolve().parents[1]
TORCHRUN = "torch.distributed.run"


def _ours(filename: str | None) -> bool:
    """Code of the suite's own tests (not the product's, nor a library's: neither starts a job on its own here)."""
    return filename is not None and Path(filename).resolve().is_relative_to(TESTS)


def _names_a_launch(words: list[str]) -> bool:
    """A command line that starts torchrun: ``-m torch.distributed.run`` or ``clustergate run``."""
    return TORCHRUN in words or any(a == "clustergate" and b == "run" for a, b in zip(words, words[1:], strict=False))


def _names_a_command(words: list[str]) -> bool:
    """A command line that starts one of clustergate's commands in a process of its own (``python -m clustergate
    merge``): a second of start-up and more each (the suite's code compiled from source, the secret scanner)."""
    return any(a == "-m" and b == "clustergate" for a, b in zip(words, words[1:], strict=False))


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


Spelling = Callable[[list[str]], bool]
_known: dict[tuple[types.CodeType, Spelling], bool] = {}


def _starts(obj: Any, spelled: Spelling = _names_a_launch) -> bool:
    """Whether calling ``obj`` (a function or a class of the suite's tests) may start a process whose command line
    ``spelled`` knows (a torchrun job by default)."""
    if isinstance(obj, type):
        return any(_starts(member, spelled) for member in vars(obj).values() if inspect.isfunction(member))
    if not inspect.isfunction(obj):
        return False
    if obj is torchrun_job.start_ranks and spelled is _names_a_launch:
        return True  # a job's ranks started as torchrun would, without its agent
    func = inspect.unwrap(obj)
    code = func.__code__
    if not _ours(code.co_filename):
        return False
    if (code, spelled) in _known:
        return _known[code, spelled]
    _known[code, spelled] = False  # while it is read: a cycle of calls adds nothing
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, SyntaxError):
        return False
    names = func.__globals__
    found = False
    for node in _commands_and_names(tree):
        if isinstance(node, ast.List | ast.Tuple):
            found = spelled(_words(node, names))
        elif isinstance(node, ast.Name):
            value = names.get(node.id)
            found = (isinstance(value, list | tuple) and spelled([w for w in value if isinstance(w, str)])
                     ) or _starts(value, spelled)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = names.get(node.value.id)  # report_runs.shared: a helper module's function
            if isinstance(module, types.ModuleType) and _ours(getattr(module, "__file__", None)):
                found = _starts(getattr(module, node.attr, None), spelled)
        if found:
            break
    _known[code, spelled] = found
    return found


def _reaches(item: pytest.Item, spelled: Spelling) -> bool:
    """Whether the test ``item``, or a fixture it uses, may start a process whose command line ``spelled`` knows."""
    if _starts(getattr(item, "function", None), spelled):
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else []
    return any(_starts(fixture.func, spelled) for chain in defs for fixture in chain)


def starts_torchrun(item: pytest.Item, shared_runs: tuple[str, ...]) -> bool:
    """Whether the test ``item`` starts a torchrun job or waits for a shared run's."""
    return any(name in item.fixturenames for name in shared_runs) or _reaches(item, _names_a_launch)


def starts_a_command(item: pytest.Item) -> bool:
    """Whether the test ``item`` runs one of clustergate's commands in a process of its own."""
    return _reaches(item, _names_a_command)
