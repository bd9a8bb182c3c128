"""The completeness rule: whether a run ran the whole suite, or only part of it.

A **complete node run** contains every node-run test of the manifest (``clustergate.manifest``), each of
which ran its body (its call phase) or skipped itself, saying why. A **complete fabric run** contains every
fabric-run test (marked ``multinode``) the same way, on two or more nodes. A run may be both (the whole
suite on two nodes). A run that is neither is *partial*, whatever narrowed or hollowed it: ``-k``, ``-m``,
file paths or node ids, ``--deselect``, ``--setup-only``/``--setup-plan`` (no body ran), an older record
that does not say which phases ran. The rule reads only what the record says ran; the options the run
recorded (``selection``) only explain it. (A run that stopped early, ``-x``, is a reject already.) A run that does
not attest the shipped suite's code run with its plugins alone (``clustergate.attestation.problems``) is partial
too, whatever its tests did.

One pure function, ``partial``, used alike by the run's own verdict (``clustergate.results``), the
re-render (``clustergate.verdict.of_record``), ``merge`` (a node run, at the level the site requires),
``signoff`` (a fabric run) and ``calibrate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clustergate import attestation
from clustergate import manifest as suite_manifest
from clustergate.manifest import LEVELS, Manifest

SHOWN = 6
"""How many left-out tests a reason names (the rest are counted)."""
RUN_NAMES = {"node": "node run", "fabric": "fabric run"}


def manifest_id(nodeid: str, selection: Mapping[str, Any], manifest: Manifest) -> str | None:
    """The manifest's id of a recorded test, or None when the test is not the suite's. ``selection.suite``
    is where the suite's directory lay as the run's node ids name it (``acceptance`` from the checkout or
    with ``clustergate run``, ``.`` when pytest's rootdir was the suite itself); a test outside it is not
    one of the suite's, whatever its name."""
    suite = selection.get("suite", manifest.suite)
    if not isinstance(suite, str):
        return None
    prefix = "" if suite in ("", ".") else suite.rstrip("/") + "/"
    if not nodeid.startswith(prefix):
        return None
    return f"{manifest.suite}/{nodeid[len(prefix):]}"


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def _named(ids: Sequence[str]) -> str:
    shown = ", ".join(_short(i) for i in ids[:SHOWN])
    return shown + (f" (and {len(ids) - SHOWN} more)" if len(ids) > SHOWN else "")


def narrowed_by(selection: Mapping[str, Any]) -> str:
    """What the run's options say narrowed or hollowed it ('' when they say nothing)."""
    said = []
    if selection.get("k"):
        said.append(f"-k {selection['k']!r}")
    if selection.get("m"):
        said.append(f"-m {selection['m']!r}")
    # A file or a node id narrows; a directory (the suite's, or one holding it) is what the missing tests show.
    narrowing = [a for a in selection.get("args") or [] if isinstance(a, str)
                 and ("::" in a or a.endswith(".py"))]
    if narrowing:
        said.append("paths " + " ".join(narrowing[:4]) + (" ..." if len(narrowing) > 4 else ""))
    if selection.get("deselect"):
        said.append(f"--deselect ({len(selection['deselect'])})")
    said += [f"--{mode}" for mode in selection.get("modes") or [] if isinstance(mode, str)]
    if selection.get("maxfail"):
        said.append(f"--maxfail {selection['maxfail']}")
    return ", ".join(said)


def _hollow(tests: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why some recorded tests did not really run: passed or failed without a call phase (their body never
    ran: --setup-only, --setup-plan), or a record that does not say which phases ran."""
    unknown = [str(t.get("nodeid")) for t in tests if not isinstance(t.get("phases"), list)]
    if unknown:
        return [f"{len(unknown)} recorded tests do not say which phases ran ({_named(unknown)}): written by an older "
                "clustergate, or edited; run it again"]
    bodiless = [str(t.get("nodeid")) for t in tests
                if t.get("outcome") in ("passed", "failed") and "call" not in t["phases"]]
    if bodiless:
        return [f"{len(bodiless)} tests never ran their body, only their fixtures ({_named(bodiless)}): "
                "nothing was measured there (--setup-only or --setup-plan?)"]
    return []


def _missing(kind: str, present: set[str], manifest: Manifest) -> list[str]:
    return [t.nodeid for t in manifest.of_run(kind) if t.nodeid not in present]


def _level_problem(level: Any, required: str, manifest: Manifest) -> str | None:
    if level not in LEVELS:
        return f"it does not record a known level ({level!r}): the site requires {required}"
    if LEVELS.index(level) >= LEVELS.index(required):
        return None
    left = manifest.left_out_at(str(level), required)
    what = f" (level {level} leaves out {_named(left)})" if left else ""
    return f"it ran at level {level}, the site requires {required} or more{what}"


def partial(results: Mapping[str, Any], manifest: Manifest, need: str | None = None,
            level: str | None = None) -> list[str]:
    """Why ``results`` is not a complete run; [] when it is.

    ``need``: ``node`` or ``fabric`` for a run that must be a complete run of that kind (merge takes node runs,
    sign-off a fabric run); None for a run that may be either (the run's own verdict, the re-render,
    calibrate). ``level``: the least level the run must have run at (merge's ``--level``)."""
    tests = [t for t in results.get("tests") or [] if isinstance(t, Mapping)]
    selection = results.get("selection") if isinstance(results.get("selection"), Mapping) else {}
    present = {i for i in (manifest_id(str(t.get("nodeid")), selection, manifest) for t in tests) if i}
    nodes = len(results.get("nodes") or [])
    missing = {kind: _missing(kind, present, manifest) for kind in RUN_NAMES}
    if need is None:
        # A fabric run needs two nodes: on one, the fabric tests are there only to skip.
        possible = [k for k in RUN_NAMES if manifest.of_run(k) and (k == "node" or nodes >= 2)]
        kinds = [k for k in possible if not missing[k]]
        need = "node" if kinds or not present or not possible else min(
            possible, key=lambda k: (len(missing[k]) / len(manifest.of_run(k)), k != "node"))
    else:
        kinds = [need] if not missing[need] else []
    reasons: list[str] = []
    if not kinds:
        total = len(manifest.of_run(need))
        how = narrowed_by(selection)
        reasons.append(f"{len(missing[need])} of the {total} tests of a complete {RUN_NAMES[need]} did not run"
                       f"{f' ({how})' if how else ''}: {_named(missing[need])}")
    if need == "fabric" and nodes < 2:
        reasons.append(f"a fabric run needs two or more nodes; this one ran on {nodes}")
    reasons += _hollow(tests)
    reasons += attestation.problems(results)  # the code ran was the shipped suite, with the suite's plugins alone
    if level is not None and (problem := _level_problem(results.get("level"), level, manifest)):
        reasons.append(problem)
    return reasons


def recorded_options(config: Any) -> dict[str, Any]:
    """What of pytest's command line can narrow or hollow a run, as results.json's ``selection`` keeps it:
    the paths and node ids given (``args``), ``--deselect``, the modes that run no test body (``modes``) and
    ``-x``/``--maxfail``."""
    option = config.option
    modes = [name for name, flag in (("setup-only", "setuponly"), ("setup-plan", "setupplan"),
                                     ("collect-only", "collectonly")) if getattr(option, flag, False)]
    return {"args": [str(a) for a in config.args], "deselect": list(getattr(option, "deselect", None) or []),
            "modes": modes, "maxfail": int(getattr(option, "maxfail", 0) or 0)}


def suite_prefix(collected: Iterable[tuple[str, Any]]) -> str | None:
    """How the run's node ids name the suite's directory (``selection.suite``), from the collected (node id,
    path) pairs: ``acceptance`` when pytest's rootdir holds the suite, ``.`` when the ids start in the suite's
    directory itself (a rootdir elsewhere); None when no collected test is a file of the suite."""
    directory = suite_manifest.shipped().suite_dir()
    if directory is None:
        return None
    directory = Path(directory).resolve()
    for nodeid, path in collected:
        try:
            rel = Path(path).resolve().relative_to(directory).as_posix()
        except ValueError:
            continue
        file_part = nodeid.split("::", 1)[0]
        if file_part == rel or file_part.endswith("/" + rel):
            return file_part[: -len(rel)].rstrip("/") or "."
    return None
