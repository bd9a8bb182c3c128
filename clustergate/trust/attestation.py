"""What a run attests about itself beyond its tests: that its code is the shipped suite and ran from its source,
that only the suite's plugins were loaded, and whether it was a dry run. The one home of that rule.

Every rank, at its start, digests every file of the suite it runs and checks them against the reference they
came with (``clustergate.trust.suitefiles``: the wheel's RECORD, or the checkout's git tree); at collection it checks
what it loaded of the suite against those files (``clustergate.trust.loaded_code``: the suite's modules are compiled
from their source by ``clustergate.trust.source_import``) and lists every plugin pytest loaded, each marked as the
suite's or not (``plugin_entry``). results.json keeps them as its ``attestation`` section:

    {"suite_digest": "sha256:<hex>", "reference": "RECORD" | "git" | "none",
     "modified": [path], "extra": [path], "missing": [path], "foreign_code": [{"module", "file", "why"}],
     "plugins": [{"name", "version", "file", "suite", "why"?}], "dry_run": bool, "problems": [str]}

``problems`` derives, from those fields alone, why a record is not attested ([] when it is); the completeness
rule (``clustergate.trust.completeness.partial``) adds them to its reasons, so the run's own verdict, the re-render,
merge, sign-off and calibrate all call such a run ``partial``, whatever its tests did. The section's own
``problems`` list is for people to read: a hand edit that empties it changes nothing.

The suite's plugins are pytest's own, clustergate's (its plugin and its opt-in entry point), pytest-html and
pytest-metadata (which the report needs), and the suite's conftest files; any other (``-p``, ``PYTEST_ADDOPTS``,
an installed entry point, a ``conftest.py`` outside the suite) is named with its file. In pytest's, pytest-html's and
pytest-metadata's folders, a plugin is theirs only where each file it loads hooks from is one its distribution
shipped, with the sha256 its RECORD gives: a file planted there, or one changed, is another plugin.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clustergate.trust import distfiles, loaded_code, manifest, source_import, suitefiles
from workloads.node.gpu_presence import NvidiaDevices

REFERENCES = ("RECORD", "git")
"""What the code can be checked against; ``none`` is no reference."""
PLUGIN_DISTRIBUTIONS = {"_pytest": "pytest", "pytest": "pytest", "pytest_html": "pytest-html",
                        "pytest_metadata": "pytest-metadata"}
"""The top-level packages of the suite's plugins that are not the suite's files, and the distribution of each: their
files are checked against its RECORD."""
SUITE_DISTRIBUTIONS = {**PLUGIN_DISTRIBUTIONS, **{p: "clustergate" for p in suitefiles.PACKAGES}}
"""The top-level modules of the suite's plugins, and the distribution each comes with."""
SHOWN = 6
"""How many paths or plugins a problem names (the rest are counted)."""
RUN_CLEAN = ("run with the suite's plugins alone: PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 (the checkout's pytest "
             "configuration and `clustergate run` set it), no -p or plugins in PYTEST_ADDOPTS, no conftest.py "
             "outside the suite")
REINSTALL = ("pytest's, pytest-html's and pytest-metadata's folders hold only what they installed: remove any other "
             "file there, and reinstall one whose files changed (pip install --force-reinstall)")
REINSTALL_DEPENDENCY = ("reinstall each from its wheel (pip install --force-reinstall --no-deps NAME==VERSION), "
                        "remove a file no distribution installed, and run from installed distributions, not a folder "
                        "on PYTHONPATH or an editable install")
RUN_FROM_SOURCE = "remove the suite's __pycache__ folders and run again"
RUN_INSTALLED = "run the installed suite (or the checkout): take {archives} off PYTHONPATH"
"""The advice for modules imported from an archive (``loaded_code.FROM_ARCHIVE``): no __pycache__ is involved."""
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@functools.cache
def code() -> suitefiles.Checked:
    """This installation's suite files, checked against their reference (once a process); from here on a module of
    the suite is loaded only with its attested bytes (``clustergate.trust.source_import``)."""
    checked = suitefiles.check()
    source_import.attested({str(path): checked.sha256[rel] for rel, path in checked.paths.items()})
    return checked


def suite_digest() -> str:
    """This installation's suite digest: ``sha256:<hex>`` over every suite file as found."""
    return code().digest


# ---- plugins ----------------------------------------------------------------------------------------------------
def suite_places() -> tuple[Path, ...]:
    """Where the suite's own plugins may live: its packages, a checkout's root conftest.py, the acceptance suite's
    directory, and pytest's, pytest-html's and pytest-metadata's packages."""
    dirs = suitefiles.package_dirs()
    places = list(dirs.values())
    if code().reference == "git" and "clustergate" in dirs:
        places.append(dirs["clustergate"].parent / "conftest.py")
    suite = manifest.shipped().suite_dir()
    if suite is not None:
        places.append(Path(suite).resolve())
    places += _plugin_packages()
    return tuple(places)


@functools.cache
def _plugin_packages() -> dict[Path, str]:
    """Where pytest's, pytest-html's and pytest-metadata's packages are imported from: folder -> distribution."""
    out = {}
    for top, distribution in PLUGIN_DISTRIBUTIONS.items():
        spec = importlib.util.find_spec(top)
        if spec is not None and spec.origin:
            out[Path(spec.origin).resolve().parent] = distribution
    return out


@functools.cache
def unshipped(path: Path) -> str | None:
    """Why ``path`` (resolved), in pytest's, pytest-html's or pytest-metadata's folder, is not a file its distribution
    shipped as it shipped it (``clustergate.trust.distfiles``: the rule for every installed file); None where it is,
    or where it lies in none of those folders."""
    for folder, distribution in _plugin_packages().items():
        if folder not in path.parents:
            continue
        version = _version(distribution)
        listed = distfiles.listing(str(path))
        if listed is None or _normal(listed.distribution) != _normal(distribution):
            return f"not a file {distribution} {version} installed (its RECORD does not list it)"
        return distfiles.problem(str(path))
    return None


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()  # reads every installed distribution: 0.4 s here


def _foreign_version(top: str) -> str | None:
    """The version of the distribution a foreign plugin's top-level module ``top`` comes with: by the names such a
    distribution usually has (``xdist``: pytest-xdist), else by every distribution's list of modules."""
    dashed = top.replace("_", "-")
    for guess in (top, dashed, f"pytest-{dashed}"):
        if (version := _version(guess)) is not None:
            return version
    return next((v for d in _distributions().get(top, []) if (v := _version(d))), None)


def plugin_entry(name: str, module: str | None, file: str | None, places: Sequence[Path],
                 code_files: Sequence[str] = ()) -> dict[str, Any]:
    """One plugin as the record lists it: registered as ``name``, defined in ``module`` (its file ``file``), its
    hook functions compiled from ``code_files``. It is the suite's where its file and every hook's code lie in one
    of ``places`` (``suite_places``) and, in pytest's, pytest-html's or pytest-metadata's folder, are files their
    distribution shipped (``unshipped``: ``why`` says which is not). A module's ``__file__`` is its own to say; the
    code of its hooks records the file it was compiled from, so a plugin that names a file of pytest's as its own is
    listed with its real file."""
    path = Path(file).resolve() if file else None
    top = (module or "").split(".", 1)[0]

    def within(p: Path) -> bool:
        return any(p == place or place in p.parents for place in places)

    # Code compiled from a string ("<string>") comes from no file: never the suite's.
    coded = [Path(f) if f.startswith("<") else Path(f).resolve() for f in code_files if f]
    elsewhere = [c for c in coded if str(c).startswith("<") or not within(c)]
    if elsewhere:
        path = elsewhere[0]
    why = None
    if path is not None and not elsewhere:
        why, path = next(((said, p) for p in (path, *coded) if (said := unshipped(p)) is not None), (None, path))
    suite = path is not None and within(path) and not elsewhere and why is None
    if suite:  # a conftest, or a harness standing in for the suite, comes with no distribution
        version = _version(SUITE_DISTRIBUTIONS[top]) if top in SUITE_DISTRIBUTIONS else None
    elif why is not None or (path is not None and path.name == "conftest.py"):
        version = None  # planted among a distribution's files, or changed: no distribution's
    else:
        version = _foreign_version(top)
    entry = {"name": name, "version": version, "file": str(path) if path else None, "suite": suite}
    return {**entry, "why": why} if why is not None else entry


# ---- the cpu profile is a dry run ----------------------------------------------------------------------------
def profile_problem(cpu: bool, found: NvidiaDevices, dry_run: bool) -> str | None:
    """Why a run may not go on with its profile (a usage error), or None. ``cpu``: the profile is the cpu profile;
    ``found``: this node's evidence of GPUs (NVIDIA devices, or the site's or launcher's word). On a GPU node the
    cpu profile measures none of the GPUs: it is a dry run, and the run must say so (--dry-run)."""
    if cpu and found.present and not dry_run:
        return (f"--profile cpu on a GPU node ({found.evidence()}): the cpu profile measures none of its GPUs, so here "
                "it is a dry run; pass --dry-run to rehearse on CPU (recorded as one, never signed off beside GPU "
                "nodes), or leave out --profile cpu to judge the GPUs")
    if dry_run and not cpu:
        return "--dry-run rehearses the suite on CPU: it goes with --profile cpu"
    return None


# ---- the section, and what it says ------------------------------------------------------------------------------
def section(checked: suitefiles.Checked, plugins: list[dict[str, Any]], dry_run: bool,
            foreign_code: list[dict[str, str]] | None = None,
            environment_code: dict[str, Any] | None = None) -> dict[str, Any]:
    """results.json's ``attestation`` for the code ``checked``, the ``plugins`` loaded, and ``dry_run``;
    ``foreign_code``: the modules whose code is not the attested source (None: those of this process as loaded now,
    ``clustergate.trust.loaded_code``); ``environment_code``: the environment's files it imported, checked against
    their RECORD (None: this process's as loaded now, ``environment``)."""
    foreign_code = loaded_code.foreign(checked) if foreign_code is None else foreign_code
    environment_code = environment(checked) if environment_code is None else environment_code
    data: dict[str, Any] = {"suite_digest": checked.digest, "reference": checked.reference,
                            "modified": list(checked.modified), "extra": list(checked.extra),
                            "missing": list(checked.missing), "foreign_code": foreign_code,
                            "environment_code": environment_code, "plugins": plugins, "dry_run": dry_run}
    data["problems"] = _problems(data, why_none=checked.why_none)
    return data


def environment(checked: suitefiles.Checked) -> dict[str, Any]:
    """``attestation.environment_code``: every file this process imported that is not the suite's (``checked``)
    nor Python's own library, checked against its distribution's RECORD (``clustergate.trust.distfiles``), with the
    seconds the checks took in this process (a file checked once stays checked: a loaded module's code is fixed)."""
    global _environment_s
    started = time.perf_counter()
    found = distfiles.check(source_import.real_path(str(path)) for path in checked.paths.values()).section()
    _environment_s += time.perf_counter() - started
    return {**found, "seconds": round(_environment_s, 4)}


_environment_s = 0.0
"""What ``environment`` took in this process, every call together (the record says what the run paid)."""


def problems(results: Mapping[str, Any]) -> list[str]:
    """Why the record ``results`` is not attested, derived from its ``attestation`` fields (never from the section's
    own ``problems``); [] when it is. A record without the section is not attested."""
    return _problems(results.get("attestation"))


def _foreign_said(code: Sequence[Mapping[str, Any]]) -> str:
    """The line for modules of the suite that ran other code than their attested source, with the advice that fits
    each (bytecode: run from source; an archive on PYTHONPATH: take it off)."""
    said = [f"{c.get('module')} ({c.get('file')}: {c.get('why')})" for c in code]
    archives = sorted({str(c.get("file")) for c in code if c.get("why") == loaded_code.FROM_ARCHIVE})
    advice = [RUN_INSTALLED.format(archives=", ".join(archives))] if archives else []
    if any(c.get("why") != loaded_code.FROM_ARCHIVE for c in code):
        advice.insert(0, RUN_FROM_SOURCE)
    return f"{len(code)} modules of the suite ran code that is not their attested source: {_named(said)}; " \
           f"{'; '.join(advice)}"


def own_code_problem() -> str | None:
    """Why the modules of the suite this process has loaded (those loaded before the importer among them) are not
    the attested source, as the run checks its own (``loaded_code.foreign``); None where they are. The cluster
    commands ask it before they read anything: what decides the cluster must be the code attested."""
    foreign = loaded_code.foreign(code())
    return _foreign_said(foreign) if foreign else None


def _named(items: Sequence[str]) -> str:
    return ", ".join(items[:SHOWN]) + (f" (and {len(items) - SHOWN} more)" if len(items) > SHOWN else "")


def _strings(value: Any) -> list[str] | None:
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _problems(data: Any, why_none: str | None = None) -> list[str]:
    if not isinstance(data, Mapping):
        return ["it does not attest its code and plugins (no attestation section: written by an older clustergate, "
                "or edited); run it again"]
    out = []
    if not isinstance(data.get("suite_digest"), str) or not _DIGEST.fullmatch(data["suite_digest"]):
        out.append("its attestation has no suite digest (sha256:<64 hex digits>)")
    reference = data.get("reference")
    if reference not in REFERENCES:
        why = f" ({why_none})" if why_none else ""
        out.append(f"its code was checked against no reference{why}: run the suite installed from its wheel, or "
                   "from a git checkout")
    differing = []
    for kind in ("modified", "extra", "missing"):
        paths = _strings(data.get(kind))
        if paths is None:
            out.append(f"its attestation's {kind!r} is not a list of paths")
        elif paths:
            differing.append(f"{kind} {_named(paths)}")
    if differing:
        out.append(f"its code is not the shipped suite ({reference}): " + "; ".join(differing))
    code = data.get("foreign_code")
    if not isinstance(code, list) or not all(isinstance(c, Mapping) for c in code):
        out.append("its attestation does not say whether its modules ran from their source (no foreign_code)")
    elif code:
        out.append(_foreign_said(code))
    environment_code = data.get("environment_code")
    unattested = environment_code.get("unattested") if isinstance(environment_code, Mapping) else None
    if not isinstance(unattested, list) or not all(isinstance(u, Mapping) for u in unattested):
        out.append("its attestation does not say whether the Python files it imported from its environment are as "
                   "their distributions installed them (no environment_code)")
    elif unattested:
        said = [f"{u.get('file')} ({u.get('why')})" for u in unattested]
        out.append(f"{len(unattested)} Python files it imported from its environment are not as their distribution "
                   f"installed them: {_named(said)}; {REINSTALL_DEPENDENCY}")
    plugins = data.get("plugins")
    if not isinstance(plugins, list) or not plugins or not all(isinstance(p, Mapping) for p in plugins):
        out.append("its attestation lists no plugins")
    else:
        foreign = [p for p in plugins if p.get("suite") is not True]
        if foreign:
            said = [f"{p.get('name')}" + (f" ({p.get('file')}" + (f": {p.get('why')}" if p.get("why") else "") + ")"
                                          if p.get("file") and p.get("file") != p.get("name") else "")
                    for p in foreign]
            advice = f"; {REINSTALL}" if any(p.get("why") for p in foreign) else ""
            out.append(f"{len(foreign)} plugins that are not the suite's were loaded: {_named(said)}; {RUN_CLEAN}"
                       f"{advice}")
    if not isinstance(data.get("dry_run"), bool):
        out.append("its attestation does not say whether it was a dry run")
    return out
