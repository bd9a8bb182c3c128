"""The plugins of a run: those it cannot do without, refused where disabled (the report's own load where pytest's
autoload is off: ``clustergate.report.hooks``); and every plugin pytest loaded, listed for the attestation
(``clustergate.trust.attestation`` says which are the suite's).
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any

import pytest

from clustergate.trust import attestation

REQUIRED = {"junitxml": ("_pytest.junitxml", "pytest's junitxml (junit.xml)"),
            "html": ("pytest_html.plugin", "pytest-html (report.html)"),
            "metadata": ("pytest_metadata.plugin", "pytest-metadata (the report's environment)")}
"""Each plugin the run cannot do without: its module, and what it gives the run."""


def disabled(manager: pytest.PytestPluginManager) -> str | None:
    """Why the run cannot go on without a plugin it needs that was disabled (a usage error), or None."""
    for name, (module_name, what) in REQUIRED.items():
        module = sys.modules.get(module_name)
        if module is None or not manager.is_registered(module):
            return (f"the run needs {what}, which is disabled (-p no:{name}, on the command line, in PYTEST_ADDOPTS or "
                    f"in addopts): remove that option")
    return None


def _module_of(plugin: Any) -> ModuleType | None:
    """Where a plugin is defined: a module, a class registered as itself, or an object's class."""
    if isinstance(plugin, ModuleType):
        return plugin
    return sys.modules.get((plugin if isinstance(plugin, type) else type(plugin)).__module__)


def _code_files(manager: pytest.PytestPluginManager, plugin: Any) -> list[str]:
    """The files the plugin's hook functions were compiled from (what its code says, not its module)."""
    files = []
    for caller in manager.get_hookcallers(plugin) or ():
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin:
                code = getattr(inspect.unwrap(impl.function), "__code__", None)
                if code is not None:
                    files.append(code.co_filename)
    return sorted(set(files))


def listed(manager: pytest.PytestPluginManager) -> list[dict[str, Any]]:
    """Every plugin pytest has loaded, as results.json's ``attestation.plugins`` lists them."""
    places = attestation.suite_places()
    out = []
    for name, plugin in manager.list_name_plugin():
        if plugin is None:  # blocked
            continue
        module = _module_of(plugin)
        if str(name).isdigit():  # registered without a name: pluggy names it by id(), which says nothing
            kind = plugin if isinstance(plugin, type) else type(plugin)
            name = f"{kind.__module__}.{kind.__qualname__}"
        out.append(attestation.plugin_entry(str(name), getattr(module, "__name__", None),
                                            getattr(module, "__file__", None), places, _code_files(manager, plugin)))
    return sorted(out, key=lambda entry: entry["name"])


def foreign(plugins: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plugins of ``plugins`` that are not the suite's."""
    return [p for p in plugins if not p["suite"]]
