"""Every `from <project module> import name` in the project names something that exists.

Many imports of the GPU paths sit inside functions (NVML, CUDA-only helpers) and never run on a CPU
machine, so a rename in one module can leave another module's import broken until a GPU run hits it
(a GPU session found three such after a merge). This reads every import statement, module-level or
not, and resolves it without running the code around it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("acceptance", "benchmarks", "clustergate", "launch", "workloads")
"""The project's own top-level names; imports of anything else are other projects' business."""


def _project_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, module, name) for every ``from <project module> import name``."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                        and node.module.split(".")[0] in PACKAGES):
                    found += [(str(path.relative_to(ROOT)), node.lineno, node.module, a.name) for a in node.names]
    return found


IMPORTS = _project_imports()


def test_the_project_imports_something() -> None:
    # Guards the test below against passing on an empty list (a moved package, a changed ROOT).
    assert len(IMPORTS) > 100


@pytest.mark.parametrize("module", sorted({m for _, _, m, _ in IMPORTS}))
def test_every_imported_name_exists(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [f"{file}:{line} imports {name!r}" for file, line, m, name in IMPORTS
               if m == module and name != "*" and not hasattr(mod, name) and not _is_submodule(module, name)]
    assert not missing, f"{module} has no such name: " + "; ".join(missing)


def _is_submodule(module: str, name: str) -> bool:
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True
