"""What clustergate installs is bounded by what it was tested with."""

from __future__ import annotations

import importlib.metadata

import tomllib
from packaging.requirements import Requirement

from torchrun_job import ROOT


def _constraints() -> dict[str, Requirement]:
    lines = [line.split("#")[0].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    return {(r := Requirement(line)).name.lower(): r for line in lines if line}


def test_every_dependency_has_an_upper_bound_in_the_constraints() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    bounds = _constraints()
    missing = [r.name for r in wanted if r.name.lower() not in bounds and r.name != "ruff"]
    assert not missing, f"add these to constraints.txt with the newest tested version: {missing}"
    unbounded = [n for n, r in bounds.items() if not any(s.operator in ("<=", "<", "==") for s in r.specifier)]
    assert not unbounded, f"constraints.txt must bound these from above: {unbounded}"


def test_pytest_html_is_pinned_to_the_version_the_escaping_was_tested_with() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [pin] = [Requirement(r) for r in project["dependencies"] if r.startswith("pytest-html")]
    assert [s.operator for s in pin.specifier] == ["=="]
    assert pin.specifier == _constraints()["pytest-html"].specifier


def test_what_is_installed_here_meets_the_constraints() -> None:
    for name, req in _constraints().items():
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an extra this environment does not have (deepspeed, say)
        assert req.specifier.contains(version, prereleases=True), f"{name} {version} is outside {req}"
