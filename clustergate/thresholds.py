"""thresholds.yaml: load, validate, resolve ``extends``, and select a profile.

Every problem is one ``ThresholdsError`` naming the file, the profile, the key and the fix; the
plugin turns it into a usage error on every rank before any test runs.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clustergate import expect as expect_section

SCHEMA = 1

CRITERION_KEYS = {
    "min": "fail below this value",
    "max": "fail above this value",
    "ceiling": "a value above this is physically impossible: a measurement error, reported as a failure",
    "outlier_fraction": "fail a GPU whose value is below this fraction of the median of its peers "
    "(on its node, and across the cluster); only for gpu-scope metrics where higher is better",
    "unit": "the unit the metric must be recorded in",
    "description": "what the figure means, for the report",
    "severity": "fail (default): a miss rejects the run; warn: a miss is reported, the run can still be accepted",
    "source": "where the figure comes from: spec (a datasheet, a vendor's rule or the original criteria), "
    "measured (runs of healthy hardware) or estimate",
}
SEVERITIES = ("fail", "warn")
SOURCES = ("spec", "measured", "estimate")

# Settings the code consults. Each name, its accepted types, and what it means. A profile's
# settings must use these names: a typo is an error, not a silently ignored value.
SETTINGS: dict[str, tuple[tuple[type, ...], str]] = {
    "gpus_per_node": ((int,), "GPUs (and torchrun ranks) expected on every node; 0 means CPU ranks"),
    "gpu_name": ((str,), "substring the NVML GPU name must contain"),
    "test_timeout_s": ((int, float), "default per-test time limit; a test past it ends the run"),
    "collective_timeout_s": ((int, float), "default timeout of the workloads' process group"),
    "peak_bf16_tflops": ((int, float), "dense bf16 peak of one device, for MFU"),
    "baseline_tolerance": ((int, float), "relative change against --baseline that is flagged"),
    "peak_tf32_tflops": ((int, float), "dense tf32 peak of one device"),
    "peak_fp16_tflops": ((int, float), "dense fp16 peak of one device"),
    "peak_fp8_tflops": ((int, float), "dense fp8 peak of one device"),
    "nvlinks_per_gpu": ((int,), "NVLink links that must be active on every GPU (18 on H100/H200 SXM)"),
    "mig_mode": ((str,), "required MIG mode: 'disabled' or 'enabled'"),
    "min_driver_version": ((str,), "lowest acceptable NVIDIA driver version, e.g. '550.54'"),
    "pcie_generation": ((int,), "PCIe link generation every GPU must train at"),
    "pcie_width": ((int,), "PCIe link width every GPU must train at"),
    "collective_judge_bytes": ((int,), "message size (bytes) at which collective busbw is judged"),
    "collective_max_bytes": ((int,), "largest message size (bytes) swept at --level standard"),
    "required_transport": ((str,), "NCCL transport cross-node traffic must use: 'NET/IB' or 'any'"),
    "ib_ports_per_node": ((int,), "active InfiniBand ports every node must have (0: none required)"),
    "ib_rate_gbps": ((int, float), "link rate (Gb/s) every required InfiniBand port must run at"),
    "collective_dtype": ((str,), "element type of the collective sweeps: 'fp32' (nccl-tests' default) or 'bf16'"),
    "nccl_algo": ((str,), "NCCL_ALGO while the bandwidth sweeps' communicators are created: 'Ring' for "
                  "fabric tests, '' for NCCL's own choice"),
    "burn_in_s": ((int, float), "seconds of sustained matmul at --level extended"),
    "shared_dir": ((str,), "a directory every node mounts (checkpoints, the shared-filesystem test)"),
}

TOP_KEYS = {"schema", "fallback_profile", "cpu_profile", "profiles"}
PROFILE_KEYS = {"description", "extends", "match", "sign_off", "settings", "metrics", "expect"}


REQUIRED: Any = object()
"""Marker: a setting asked for without a default must be in the profile."""


class ThresholdsError(ValueError):
    """thresholds.yaml is broken, or names something that does not exist."""


@dataclass(frozen=True, slots=True)
class Criterion:
    """Pass criteria of one metric in one profile. An empty criterion measures without judging."""

    min: float | None = None
    max: float | None = None
    ceiling: float | None = None
    outlier_fraction: float | None = None
    unit: str | None = None
    description: str = ""
    severity: str = "fail"
    source: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (
            ("min", self.min), ("max", self.max), ("ceiling", self.ceiling),
            ("outlier_fraction", self.outlier_fraction), ("unit", self.unit),
        ) if v is not None}

    @property
    def judged(self) -> bool:
        return any(v is not None for v in (self.min, self.max, self.ceiling, self.outlier_fraction))


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
    """The profile's expect: section (clustergate.expect): how its nodes must be configured."""

    def setting(self, name: str, default: Any = REQUIRED) -> Any:
        """A setting's value; ``default`` when given and the profile lacks it, else a clear error."""
        if name not in SETTINGS:
            raise KeyError(f"{name!r} is not a known setting; known: {', '.join(sorted(SETTINGS))}")
        if name not in self.settings and default is not REQUIRED:
            return default
        if name not in self.settings:
            raise ThresholdsError(
                f"{self.source}: profile {self.name!r} has no settings.{name} "
                f"({SETTINGS[name][1]}); add it to the profile"
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

    def select(self, gpu_name: str | None) -> Profile:
        """The profile for a GPU model (as NVML names it); the CPU profile when there is no GPU."""
        if gpu_name is None:
            return self.profile(self.cpu_profile)
        for profile in self.profiles.values():
            if any(pattern.lower() in gpu_name.lower() for pattern in profile.match):
                return profile
        return self.profile(self.fallback_profile)


def _fail(path: Path, where: str, problem: str) -> ThresholdsError:
    return ThresholdsError(f"{path}: {where}: {problem}")


def _number(path: Path, where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise _fail(path, where, f"must be a number, got {value!r}")
    return float(value)


def _criterion(path: Path, where: str, raw: Any) -> Criterion:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(path, where, f"must be a mapping of {', '.join(CRITERION_KEYS)}, got {raw!r}")
    unknown = set(raw) - set(CRITERION_KEYS)
    if unknown:
        raise _fail(path, f"{where}.{sorted(unknown)[0]}",
                    f"unknown key; a criterion takes {', '.join(CRITERION_KEYS)}")
    numbers = {k: _number(path, f"{where}.{k}", raw[k])
               for k in ("min", "max", "ceiling", "outlier_fraction") if k in raw}
    if "outlier_fraction" in numbers and not 0 < numbers["outlier_fraction"] < 1:
        raise _fail(path, f"{where}.outlier_fraction", "must lie between 0 and 1")
    if "min" in numbers and "max" in numbers and numbers["min"] > numbers["max"]:
        raise _fail(path, where, f"min {numbers['min']} is above max {numbers['max']}")
    for key in ("unit", "description"):
        if key in raw and not isinstance(raw[key], str):
            raise _fail(path, f"{where}.{key}", f"must be a string, got {raw[key]!r}")
    for key, allowed in (("severity", SEVERITIES), ("source", SOURCES)):
        if key in raw and raw[key] not in allowed:
            raise _fail(path, f"{where}.{key}", f"must be one of {', '.join(allowed)}, got {raw[key]!r}")
    return Criterion(**numbers, unit=raw.get("unit"), description=raw.get("description", ""),
                     severity=raw.get("severity", "fail"), source=raw.get("source"))


def _settings(path: Path, where: str, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, where, f"must be a mapping, got {raw!r}")
    for key, value in raw.items():
        if key not in SETTINGS:
            raise _fail(path, f"{where}.{key}", f"unknown setting; known: {', '.join(sorted(SETTINGS))}")
        types, _ = SETTINGS[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise _fail(path, f"{where}.{key}", f"must be {names}, got {value!r}")
    return dict(raw)


def _resolve(path: Path, raw_profiles: dict[str, Any], name: str, seen: tuple[str, ...]) -> dict[str, Any]:
    """A profile's raw mapping with its ``extends`` chain merged in (settings and metrics by key)."""
    if name in seen:
        raise _fail(path, f"profiles.{name}.extends", f"circular: {' -> '.join((*seen, name))}")
    raw = raw_profiles[name]
    parent_name = raw.get("extends")
    if parent_name is None:
        return dict(raw)
    if parent_name not in raw_profiles:
        raise _fail(path, f"profiles.{name}.extends", f"no profile {parent_name!r} to extend")
    parent = _resolve(path, raw_profiles, parent_name, (*seen, name))
    merged = {**parent, **raw}
    for key in ("settings", "metrics", "expect"):
        merged[key] = {**(parent.get(key) or {}), **(raw.get(key) or {})}
    return merged


def load(path: str | Path) -> Thresholds:
    """Read and validate a thresholds file. Raises ThresholdsError with file, key and fix."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ThresholdsError(f"{path}: file not found; pass an existing file with --thresholds") from None
    try:
        data = yaml.safe_load(text)
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
        metrics = {m: _criterion(path, f"{where}.metrics.{m}", c) for m, c in raw_metrics.items()}
        settings = _settings(path, f"{where}.settings", raw.get("settings"))
        expect = expect_section.parse(raw.get("expect"), f"{where}.expect", lambda key, why: _fail(path, key, why))
        digest = hashlib.sha256(repr((sorted(settings.items()), sorted(
            (m, c.as_dict()) for m, c in metrics.items()), sorted((k, e.text) for k, e in expect.items())
        )).encode()).hexdigest()[:16]
        profiles[name] = Profile(
            name=name, description=str(raw.get("description", "")), match=tuple(match),
            sign_off=sign_off, settings=settings, metrics=metrics, source=path, digest=digest, expect=expect,
        )
    fallback = data.get("fallback_profile")
    cpu = data.get("cpu_profile")
    for key, value in (("fallback_profile", fallback), ("cpu_profile", cpu)):
        if value not in profiles:
            raise _fail(path, key, f"must name one of the profiles ({', '.join(profiles)}), got {value!r}")
    return Thresholds(path=path, profiles=profiles, fallback_profile=fallback, cpu_profile=cpu)
