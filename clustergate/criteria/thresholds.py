"""thresholds.yaml: load, validate, resolve ``extends``, and select a profile.

Every problem is one ``ThresholdsError`` naming the file, the profile, the key and the fix; the
plugin turns it into a usage error on every rank before any test runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from clustergate.common import inputfile
from clustergate.criteria import expect as expect_section
from clustergate.criteria.criterion import Criterion, CriterionError
from clustergate.criteria.settings import SETTINGS, setting_problem
from clustergate.criteria.sources import Source

SCHEMA = 1

TOP_KEYS = {"schema", "fallback_profile", "cpu_profile", "profiles"}
PROFILE_KEYS = {"description", "extends", "match", "sign_off", "settings", "metrics", "expect"}


def shipped_thresholds() -> Path:
    """The thresholds.yaml that comes with clustergate: package data in a wheel; in a checkout the
    package's link to the root thresholds.yaml, resolved so that messages name the file one edits."""
    return (Path(__file__).parent.parent / "thresholds.yaml").resolve()  # the package's copy


REQUIRED: Any = object()
"""Marker: a setting asked for without a default must be in the profile."""


def expects_gpus(gpus_per_node: int | None) -> bool:
    """A profile expects a GPU per rank unless its settings say ``gpus_per_node: 0`` (a profile without the setting
    is a GPU profile): the acceptance tests' rule and ``clustergate health``'s."""
    return gpus_per_node != 0


class ThresholdsError(ValueError):
    """thresholds.yaml is broken, or names something that does not exist."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One resolved profile: settings and criteria for one GPU model (or the CPU)."""

    name: str
    description: str
    match: tuple[str, ...]
    sign_off: bool
    settings: dict[str, Any]
    metrics: dict[str, Criterion]
    source: Path
    digest: str = field(default="")
    """Hash of the resolved profile, compared across ranks: every rank must judge alike."""
    expect: dict[str, expect_section.Expected] = field(default_factory=dict)
    """The profile's expect: section (clustergate.criteria.expect): how its nodes must be configured."""
    lineage: tuple[str, ...] = ()
    """The profiles it extends, nearest first: how a site profile finds the shipped one it holds to
    (``clustergate.criteria.against_shipped``)."""

    @property
    def run_digest(self) -> str:
        """What a run records of the thresholds that judged it (results.json ``clustergate.thresholds_digest``):
        a digest of the profile's name, criteria, settings, expect and sign_off. Ranks compare it at collection;
        merge and sign-off compare it with the site's thresholds (``clustergate.cluster.judged_by``)."""
        return hashlib.sha256(f"{self.name}\0{self.digest}\0{self.sign_off}".encode()).hexdigest()[:16]

    def setting(self, name: str, default: Any = REQUIRED) -> Any:
        """A setting's value; ``default`` when given and the profile lacks it, else a clear error."""
        if name not in SETTINGS:
            raise KeyError(f"{name!r} is not a known setting; known: {', '.join(sorted(SETTINGS))}")
        if name not in self.settings and default is not REQUIRED:
            return default
        if name not in self.settings:
            raise ThresholdsError(
                f"{self.source}: profile {self.name!r} has no settings.{name} "
                f"({SETTINGS[name].help}); add it to the profile"
            )
        return self.settings[name]

    def criterion(self, metric: str) -> Criterion:
        try:
            return self.metrics[metric]
        except KeyError:
            raise ThresholdsError(
                f"{self.source}: profile {self.name!r} has no metrics.{metric}; add it "
                f"(an empty mapping {{}} records it without judging)"
            ) from None


@dataclass(frozen=True, slots=True)
class Thresholds:
    path: Path
    profiles: dict[str, Profile]
    fallback_profile: str
    cpu_profile: str

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise ThresholdsError(
                f"{self.path}: no profile {name!r}; profiles are: {', '.join(self.profiles)} "
                "(pass one with --profile, or add it to the file)"
            )
        return self.profiles[name]

    def select(self, gpu_name: str | None, *, gpu_node: bool = False, gpus: int | None = None) -> Profile:
        """The profile for a GPU model (as NVML names it) and a node shape; the fallback profile for a GPU node
        whose model cannot be read (``gpu_node``: an NVIDIA device exists or the site expects GPUs,
        workloads.node.gpu_presence); the CPU profile only where neither says there is a GPU.

        The shape rule: of the profiles whose ``match`` names the model, in the file's order, the first whose
        ``settings.gpus_per_node`` is ``gpus`` (the node's GPU count, ``NvidiaDevices.shape_gpus``); where none
        is, the model's first profile, whose ``gpu_count`` criterion then says how many GPUs it expects."""
        if gpu_name is None:
            return self.profile(self.fallback_profile if gpu_node else self.cpu_profile)
        models = [p for p in self.profiles.values()
                  if any(pattern.lower() in gpu_name.lower() for pattern in p.match)]
        if not models:
            return self.profile(self.fallback_profile)
        return next((p for p in models if gpus is not None and p.settings.get("gpus_per_node") == gpus), models[0])

    def holds(self, profile: Profile) -> Profile | None:
        """The profile of this (the shipped) file that ``profile`` of another file holds to: the one of the same
        name, else the nearest it ``extends``, of the same ``gpus_per_node``; else the one ``select`` chooses for
        its ``match`` and shape (the cpu profile for a profile without a GPU); else the first of those names.
        ``profile`` itself where it is of this file."""
        if profile.source.resolve() == self.path.resolve():
            return profile
        gpus = profile.settings.get("gpus_per_node")
        named = [self.profiles[n] for n in (profile.name, *profile.lineage) if n in self.profiles]
        same_shape = [p for p in named if p.settings.get("gpus_per_node") == gpus]
        if same_shape:
            return same_shape[0]
        if profile.match:  # a node-wide figure of another shape says nothing of this one's
            return self.select(profile.match[0], gpu_node=True, gpus=gpus)
        if gpus == 0:
            return self.profile(self.cpu_profile)
        return named[0] if named else None


MERGE_TAG = "tag:yaml.org,2002:merge"
MAX_VALUES = 200_000
"""How many values a thresholds file may stand for once its aliases are expanded: the shipped file is a few
thousand. An alias bomb (anchors of anchors, each used many times) stands for billions."""
PLAIN_KEYS = (str, int, float, bool, type(None))


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """yaml.safe_load that refuses a key given twice in one mapping (PyYAML silently keeps the last), and a key
    that is not a plain name or number (a list or mapping as a key). Its parser is libyaml's where PyYAML has it
    (every wheel does): the pure-Python one took 60 ms of every command and rank that reads the shipped file."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue  # ``<<: *anchor``: keys given here override the merged ones, as YAML intends
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.MarkedYAMLError(problem="a key must be a plain name, not a list or a mapping",
                                           problem_mark=key_node.start_mark)
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if not isinstance(key, PLAIN_KEYS):
                raise yaml.MarkedYAMLError(problem=f"a key must be a plain name, not {type(key).__name__}",
                                           problem_mark=key_node.start_mark)
            if key in seen:
                raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r} (first at line {seen[key]}); "
                                           "give each key once", problem_mark=key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the document stands for with every alias expanded (aliases share one node: counted once
    per use, computed once per node)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done or not children:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(node)] > MAX_VALUES:
                return sizes[id(node)]
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _parse(path: Path, text: str) -> Any:
    """The document's data (a SafeLoader: no Python objects from the file), refusing an alias bomb before it is
    built."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if (size := _expanded_size(node)) > MAX_VALUES:
            raise ThresholdsError(f"{path}: its aliases expand to more than {MAX_VALUES} values ({size} and "
                                  "counting): not a thresholds file (an alias bomb?); write the values out")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _fail(path: Path, where: str, problem: str) -> ThresholdsError:
    return ThresholdsError(f"{path}: {where}: {problem}")


def _settings(path: Path, where: str, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, where, f"must be a mapping, got {raw!r}")
    for key, value in raw.items():
        if key not in SETTINGS:
            raise _fail(path, f"{where}.{key}", f"unknown setting; known: {', '.join(sorted(SETTINGS))}")
        if problem := setting_problem(key, value):
            raise _fail(path, f"{where}.{key}", problem)
    return dict(raw)


def _resolve(path: Path, raw_profiles: dict[str, Any], name: str, seen: tuple[str, ...]) -> dict[str, Any]:
    """A profile's raw mapping with its ``extends`` chain merged in (settings and metrics by key)."""
    if name in seen:
        raise _fail(path, f"profiles.{name}.extends", f"circular: {' -> '.join((*seen, name))}")
    raw = raw_profiles[name]
    parent_name = raw.get("extends")
    if parent_name is None:
        return dict(raw)
    if not isinstance(parent_name, str):
        raise _fail(path, f"profiles.{name}.extends", f"must name one profile, got {parent_name!r}")
    if parent_name not in raw_profiles:
        raise _fail(path, f"profiles.{name}.extends", f"no profile {parent_name!r} to extend")
    parent = _resolve(path, raw_profiles, parent_name, (*seen, name))
    merged = {**parent, **raw}
    for key in ("settings", "metrics", "expect"):
        merged[key] = {**(parent.get(key) or {}), **(raw.get(key) or {})}
    return merged


def _digest(settings: dict[str, Any], metrics: dict[str, Criterion], expect: dict[str, expect_section.Expected]) -> str:
    return hashlib.sha256(repr((sorted(settings.items()), sorted(
        (m, c.as_json()) for m, c in metrics.items()), sorted((k, e.text) for k, e in expect.items())
    )).encode()).hexdigest()[:16]


def _cited(path: Path, profiles: dict[str, Profile]) -> dict[str, Profile]:
    """``profiles`` of a file other than the shipped one, each criterion that differs from the shipped profile's
    (bounds or severity) and cites nothing of its own (no source, or the shipped criterion's, copied or inherited)
    citing ``path`` instead (source ``site``): an edited bound never reads as the shipped source's figure."""
    shipped = shipped_thresholds()
    if path.resolve() == shipped:
        return profiles
    try:
        ships = load(shipped)
    except ThresholdsError:
        return profiles  # nothing to compare with: the load of the shipped file says why where it is used
    set_here = Source("site", (("note", f"set by {path}"),))
    out = {}
    for name, profile in profiles.items():
        base = ships.holds(profile)
        theirs = base.metrics if base is not None else {}
        metrics = {m: c if (t := theirs.get(m)) is None or (c.bounds, c.severity) == (t.bounds, t.severity)
                   or c.source not in (None, t.source) else dataclasses.replace(c, source=set_here)
                   for m, c in profile.metrics.items()}
        out[name] = profile if metrics == profile.metrics else dataclasses.replace(
            profile, metrics=metrics, digest=_digest(profile.settings, metrics, profile.expect))
    return out


def _lineage(raw_profiles: dict[str, Any], name: str) -> tuple[str, ...]:
    """The names ``name`` extends, nearest first (``_resolve`` has refused a circle or a missing one)."""
    out: list[str] = []
    while isinstance(parent := raw_profiles[name].get("extends"), str):
        out.append(name := parent)
    return tuple(out)


def load(path: str | Path) -> Thresholds:
    """Read and validate a thresholds file. Raises ThresholdsError with file, key and fix."""
    path = Path(path)
    try:
        text = inputfile.read_text(path, "thresholds")
    except inputfile.InputFileError as exc:
        raise ThresholdsError(f"{exc}; pass a thresholds file with --thresholds") from None
    except FileNotFoundError:
        raise ThresholdsError(f"{path}: file not found; pass an existing file with --thresholds") from None
    except IsADirectoryError:
        raise ThresholdsError(f"{path}: a directory, not a thresholds file; pass the file with --thresholds") from None
    except UnicodeDecodeError as exc:
        raise ThresholdsError(f"{path}: not UTF-8 text (byte {exc.start}): not a thresholds file") from None
    except OSError as exc:
        raise ThresholdsError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return _from_text(path, text)


@lru_cache(maxsize=16)
def _from_text(path: Path, text: str) -> Thresholds:
    """The thresholds ``text`` (read from ``path``) gives: remembered by the text itself, so a file read again
    unchanged is not parsed again (a merge bundles evidence for every excluded node, each naming its profile),
    and an edited one always is. What is returned is frozen."""
    try:
        data = _parse(path, text)
    except RecursionError:
        raise ThresholdsError(f"{path}: nested too deeply to be a thresholds file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ThresholdsError(f"{path}: not valid YAML at {where}: {problem}") from None
    if not isinstance(data, dict):
        raise _fail(path, "top level", "must be a mapping with 'schema' and 'profiles'")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise _fail(path, sorted(unknown)[0], f"unknown top-level key; known: {', '.join(sorted(TOP_KEYS))}")
    if data.get("schema") != SCHEMA:
        raise _fail(path, "schema", f"must be {SCHEMA}, got {data.get('schema')!r}")
    raw_profiles = data.get("profiles")
    if not isinstance(raw_profiles, dict) or not raw_profiles:
        raise _fail(path, "profiles", "must be a non-empty mapping of profile names to profiles")
    for name, raw in raw_profiles.items():
        if not isinstance(raw, dict):
            raise _fail(path, f"profiles.{name}", f"must be a mapping, got {raw!r}")
        unknown = set(raw) - PROFILE_KEYS
        if unknown:
            raise _fail(path, f"profiles.{name}.{sorted(unknown)[0]}",
                        f"unknown key; a profile takes {', '.join(sorted(PROFILE_KEYS))}")
    profiles: dict[str, Profile] = {}
    for name in raw_profiles:
        raw = _resolve(path, raw_profiles, name, ())
        where = f"profiles.{name}"
        match = raw.get("match") or []
        if not isinstance(match, list) or not all(isinstance(m, str) and m for m in match):
            raise _fail(path, f"{where}.match", "must be a list of non-empty GPU name substrings")
        sign_off = raw.get("sign_off", True)
        if not isinstance(sign_off, bool):
            raise _fail(path, f"{where}.sign_off", f"must be true or false, got {sign_off!r}")
        raw_metrics = raw.get("metrics") or {}
        if not isinstance(raw_metrics, dict):
            raise _fail(path, f"{where}.metrics", "must be a mapping of metric names to criteria")
        try:
            metrics = {m: Criterion.parse(c, f"{where}.metrics.{m}") for m, c in raw_metrics.items()}
        except CriterionError as exc:
            raise _fail(path, exc.where, exc.problem) from None
        # A profile that bounds no figure judges nothing: its runs are measured, never signed off.
        sign_off = sign_off and any(c.bounds for c in metrics.values())
        settings = _settings(path, f"{where}.settings", raw.get("settings"))
        expect = expect_section.parse(raw.get("expect"), f"{where}.expect", lambda key, why: _fail(path, key, why))
        profiles[name] = Profile(
            name=name, description=str(raw.get("description", "")), match=tuple(match),
            sign_off=sign_off, settings=settings, metrics=metrics, source=path,
            digest=_digest(settings, metrics, expect), expect=expect, lineage=_lineage(raw_profiles, name),
        )
    profiles = _cited(path, profiles)
    fallback = data.get("fallback_profile")
    cpu = data.get("cpu_profile")
    for key, value in (("fallback_profile", fallback), ("cpu_profile", cpu)):
        if value not in profiles:
            raise _fail(path, key, f"must name one of the profiles ({', '.join(profiles)}), got {value!r}")
    return Thresholds(path=path, profiles=profiles, fallback_profile=fallback, cpu_profile=cpu)
