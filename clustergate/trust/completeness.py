"""The completeness rule: whether a run ran the whole suite, or only part of it.

A **complete node run** contains every node-run test of the manifest (``clustergate.trust.manifest``), each of
which ran its body (its call phase) or skipped on a recorded fact that earns the skip. A **complete fabric
run** contains every fabric-run test (marked ``multinode``) the same way, on two or more nodes. A run may be
both (the whole suite on two nodes). A run that is neither is *partial*, whatever narrowed or hollowed it:
``-k``, ``-m``, file paths or node ids, ``--deselect``, ``--setup-only``/``--setup-plan`` (no body ran), an
older record that does not say which phases ran, a skip that is not earned, a run that does not attest the
shipped suite's code run with its plugins alone (``clustergate.trust.attestation.problems``). The rule reads only what
the record says ran; the options the run recorded (``selection``) only explain it. (A run that stopped early,
``-x``, is a reject already.)

A skip is earned when it records its fact (``tests[].skip_fact``, ``clustergate.trust.skip_facts``), the manifest
lets the test skip on that fact under the run's profile kind at the run's level, and the record bears the fact
out (its nodes, ranks, discovery, environment, level; the profile where the reader knows it). The level is
proven by what ran: a skip taken at one level in a record that says another is not earned. Across a fleet
(``fleet_problems``, merge) a node that skips for lacking what another node has (it ran the test, it lists an
InfiniBand port) has not earned the skip either.

One pure function, ``partial``, used alike by the run's own verdict (``clustergate.record.results``), the
re-render (``clustergate.record.verdict.of_record``), ``merge`` (a node run, at the level the site requires),
``signoff`` (a fabric run) and ``calibrate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clustergate.common.results_view import ResultsView, TestRecord
from clustergate.criteria.thresholds import Profile
from clustergate.trust import attestation, skip_facts
from clustergate.trust import manifest as suite_manifest
from clustergate.trust.manifest import LEVELS, Manifest

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


def _hollow(tests: Sequence[TestRecord]) -> list[str]:
    """Why some recorded tests did not really run: passed or failed without a call phase (their body never
    ran: --setup-only, --setup-plan), or a record that does not say which phases ran."""
    unknown = [t.nodeid for t in tests if t.phases is None]
    if unknown:
        return [f"{len(unknown)} recorded tests do not say which phases ran ({_named(unknown)}): written by an older "
                "clustergate, or edited; run it again"]
    bodiless = [t.nodeid for t in tests if t.outcome in ("passed", "failed") and "call" not in (t.phases or ())]
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


def _skipped(results: Mapping[str, Any], manifest: Manifest) -> list[tuple[TestRecord, Any]]:
    """Every skipped test of the suite in ``results``, with its manifest entry."""
    view = ResultsView.of(results)
    out = []
    for test in view.tests:
        if test.outcome == "skipped":
            known = manifest.get(manifest_id(test.nodeid, view.selection, manifest) or "")
            if known is not None:  # a test that is not the suite's counts for nothing anyway
                out.append((test, known))
    return out


def _dcgm_problem(results: Mapping[str, Any], manifest: Manifest) -> str | None:
    """DCGM's skips must agree on the level asked for; one that says it was not asked for at all while a DCGM test
    ran contradicts the record."""
    facts = [t.skip_fact for t, _ in _skipped(results, manifest)]
    asked = {f.get("requested") for f in facts if isinstance(f, Mapping) and f.get("fact") == "dcgm_not_requested"}
    if len(asked) > 1:
        return f"its DCGM skips disagree on the --dcgm-diag level asked for ({sorted(map(str, asked))})"
    if None in asked:
        view = ResultsView.of(results)
        for test in view.tests:
            known = manifest.get(manifest_id(test.nodeid, view.selection, manifest) or "")
            if (known is not None and test.outcome in ("passed", "failed")
                    and any(r.fact == "dcgm_not_requested" for r in known.skips)):
                return f"DCGM skips say it was not asked for, yet {_short(test.nodeid)} ran"
    return None


def unearned(results: Mapping[str, Any], manifest: Manifest, profile: Profile | None = None) -> list[str]:
    """Why some skips of ``results`` are not earned ([] when every one is): no fact recorded, a fact the manifest
    does not allow for the test under the run's profile kind and level, or one the record contradicts."""
    kind, level = skip_facts.profile_kind(results, profile), str(ResultsView.of(results).level)
    bad = []
    for test, known in _skipped(results, manifest):
        fact = test.skip_fact
        why = skip_facts.problem(fact, results, profile)
        if why is None and not known.earns(str(fact["fact"]), kind, level):
            why = f"the manifest does not let it skip on {fact['fact']} under a {kind} profile at level {level}"
        if why is not None:
            bad.append(f"{_short(test.nodeid)} ({why})")
    reasons = []
    if bad:
        more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        reasons.append(f"{len(bad)} skips are not earned by a recorded fact: {'; '.join(bad[:SHOWN])}{more}")
    if (dcgm := _dcgm_problem(results, manifest)) is not None:
        reasons.append(dcgm)
    return reasons


def fleet_problems(records: Mapping[str, Mapping[str, Any]], manifest: Manifest) -> dict[str, list[str]]:
    """Host -> why its skips are not earned in this fleet (``records``: each node run of one cluster run by host): it
    skipped a test as unsupported that another node ran, or as having no InfiniBand port where another node lists
    one. A node that lacks what its fleet has is missing it."""
    ran: dict[str, set[str]] = {}
    for host, results in records.items():
        view = ResultsView.of(results)
        for test in view.tests:
            if test.outcome in ("passed", "failed") and "call" in (test.phases or []):
                ran.setdefault(manifest_id(test.nodeid, view.selection, manifest) or "", set()).add(host)
    with_ib = {host for host, results in records.items() if skip_facts.ib_hosts(results)}
    out: dict[str, list[str]] = {}
    for host, results in records.items():
        bad = []
        for test, known in _skipped(results, manifest):
            fact = test.skip_fact.get("fact") if isinstance(test.skip_fact, Mapping) else None
            others = sorted((ran.get(known.nodeid, set()) if fact == "unsupported" else
                             with_ib if fact == "no_infiniband" else set()) - {host})
            if others:
                shown = ", ".join(others[:4]) + (f" (and {len(others) - 4} more)" if len(others) > 4 else "")
                bad.append(f"{_short(known.nodeid)} skipped on {fact}, yet "
                           f"{'InfiniBand ports are listed on' if fact == 'no_infiniband' else 'it ran on'} {shown}")
        if bad:
            more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
            out[host] = [f"{len(bad)} skips are not earned in this fleet (this node lacks what others have): "
                         f"{'; '.join(bad[:SHOWN])}{more}"]
    return out


def partial(results: Mapping[str, Any], manifest: Manifest, need: str | None = None,
            level: str | None = None, profile: Profile | None = None) -> list[str]:
    """Why ``results`` is not a complete run; [] when it is.

    ``need``: ``node`` or ``fabric`` for a run that must be a complete run of that kind (merge takes node runs,
    sign-off a fabric run); None for a run that may be either (the run's own verdict, the re-render,
    calibrate). ``level``: the least level the run must have run at (merge's ``--level``). ``profile``: the
    profile the reader holds the run to (merge and sign-off), against which the skips on the profile's settings
    are checked."""
    view = ResultsView.of(results)
    tests, selection = view.tests, view.selection
    present = {i for i in (manifest_id(t.nodeid, selection, manifest) for t in tests) if i}
    nodes = len(results.get("nodes") or [])  # every entry counts, as the record lists them
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
    reasons += unearned(results, manifest, profile)
    reasons += attestation.problems(results)  # the code ran was the shipped suite, with the suite's plugins alone
    if level is not None and (problem := _level_problem(view.level, level, manifest)):
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
