"""The suite's modules run from their source: an import hook that compiles every module of clustergate, acceptance and
workloads from the bytes of its source file, never from a ``__pycache__`` file beside it.

Python takes a module's bytecode from ``__pycache__`` when its header matches the source (its time and size, or a
hash it may be told not to check), and pytest takes the rewritten tests' the same way. None of those files is in the
suite's digest (``clustergate.trust.suitefiles``), and any header can be written: bytecode compiled from another source,
left there under a matching header, would run under the shipped digest. This hook takes each module whose file lies
in the suite's packages (beside this one) and compiles it from the bytes it reads, rewritten as pytest rewrites it
where pytest would (the tests, conftest files, the plugins pytest was asked for). The compiled code is kept in
clustergate's own cache (``clustergate.trust.bytecode_cache``), named by those bytes: a warm start reads bytecode as
fast as from ``__pycache__``.

It records what it compiled (each module's file and the sha256 of the bytes) for ``clustergate.trust.loaded_code`` to
check against the files the run attested; once they are attested (``attested``), a module whose source no longer has its
attested bytes is not loaded at all (an ImportError naming it: the test that imports it fails).

The package's ``__init__`` installs it: the first module of the suite that any run, command or test imports. That
module, this one and what it imports (``clustergate.trust.bytecode_cache``, ``clustergate.trust.suitefiles``), and the
checkout's ``conftest.py`` load before it: ``clustergate.trust.loaded_code`` checks their bytecode afterwards.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from clustergate.trust import bytecode_cache
from clustergate.trust.suitefiles import PACKAGES

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
"""The directory holding clustergate, and the suite's other packages beside it."""
_attested: dict[str, str] | None = None
"""The attested files' sha256 by their real path, from ``attested`` on (None before)."""


def attested(sha256_by_path: Mapping[str, str]) -> None:
    """The suite's files are attested: their sha256 (hex) by path (``real_path``'s form). A module loaded from here
    on must have its attested bytes."""
    global _attested
    _attested = dict(sha256_by_path)


def real_path(path: str) -> str:
    """``path`` with its directory's links resolved, as the suite's files are found
    (``clustergate.trust.suitefiles``)."""
    directory, base = os.path.split(path)
    return os.path.join(_real_dir(directory), base)


@functools.cache
def _real_dir(directory: str) -> str:
    return os.path.realpath(directory)


def rewriter_of(loader: Any) -> Any | None:
    """``loader`` where it is pytest's assertion-rewriting hook, else None."""
    kind = type(loader)
    if kind.__name__ == "AssertionRewritingHook" and kind.__module__ == "_pytest.assertion.rewrite":
        return loader
    return None


def flavour(rewriter: Any | None) -> str:
    """How a module is compiled: ``plain``, or rewritten by this pytest with its configuration's pass hook."""
    if rewriter is None:
        return "plain"
    from _pytest.assertion import rewrite

    return f"{rewrite.PYTEST_TAG}-passhook={bool(rewriter.config.getini('enable_assertion_pass_hook'))}"


def compiled(source: bytes, path: str, rewriter: Any | None) -> types.CodeType:
    """``source`` (the file ``path``) compiled as Python would, or rewritten as pytest's hook ``rewriter`` would."""
    if rewriter is None:
        return compile(source, path, "exec", dont_inherit=True)
    from _pytest.assertion.rewrite import rewrite_asserts

    tree = ast.parse(source, filename=path)
    rewrite_asserts(tree, source, path, rewriter.config)
    return compile(tree, path, "exec", dont_inherit=True)


class SourceLoader(importlib.machinery.SourceFileLoader):
    """Loads a module of the suite from its source's bytes (through clustergate's cache, never ``__pycache__``)."""

    def __init__(self, fullname: str, path: str, rewriter: Any | None) -> None:
        super().__init__(fullname, path)
        self.rewriter = rewriter
        """pytest's hook, where pytest rewrites this module."""
        self.sha256: str | None = None
        """The sha256 (hex) of the bytes the module was compiled from, once loaded."""

    def get_code(self, fullname: str) -> types.CodeType:
        source = self.get_data(self.path)
        sha256 = hashlib.sha256(source).hexdigest()
        if _attested is not None:
            real = real_path(self.path)
            if _attested.get(real) != sha256:
                said = "is not one of the files" if real not in _attested else "has changed since"
                raise ImportError(f"{self.path} {said} this run attested at its start (clustergate.trust.attestation): "
                                  "not loaded; the suite's files must not change while it runs", name=fullname,
                                  path=self.path)
        name = bytecode_cache.key(source, flavour(self.rewriter))
        code = bytecode_cache.read(name, self.path)
        if code is None:
            code = compiled(source, self.path, self.rewriter)
            bytecode_cache.write(name, code)
        if self.rewriter is not None:  # pytest's own account of what it rewrote (its resource reader reads it)
            getattr(self.rewriter, "_rewritten_names", {})[fullname] = self.path
        self.sha256 = sha256
        return code


class SourceFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: asks the finders after it, and takes the suite's modules they find."""

    def _after(self) -> Iterator[Any]:
        seen = False
        for finder in list(sys.meta_path):
            if seen:
                yield finder
            seen = seen or finder is self

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in PACKAGES:
            return None
        spec = None
        for finder in self._after():
            find = getattr(finder, "find_spec", None)
            if find is not None and (spec := find(fullname, path, target)) is not None:
                break
        if spec is None or not spec.has_location or not isinstance(spec.origin, str):
            return spec
        rewriter = rewriter_of(spec.loader)
        if rewriter is None and not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec  # bytecode without source, an extension: loaded_code names it
        real = real_path(spec.origin)
        if os.path.relpath(real, _ROOT).partition(os.sep)[0] != fullname.partition(".")[0]:
            return spec  # a package of the same name elsewhere: not the suite's (suitefiles says why)
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=SourceLoader(fullname, spec.origin, rewriter),
            submodule_search_locations=spec.submodule_search_locations)


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once a process)."""
    if not any(isinstance(finder, SourceFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder())
