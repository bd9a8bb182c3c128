"""The facts a skip may rest on, each checked against the run's own record.

A test of the suite that does not apply skips on a recorded fact, never on a reason alone: ``acceptance`` raises
``cg.skip(reason, fact=...)``, the run keeps the fact as data with the test (results.json ``tests[].skip_fact``:
``{"fact": NAME, ...its parameters}``), and the suite's manifest says per test, profile kind and level which
facts earn a skip there (``clustergate.trust.manifest.SkipRule``). ``clustergate.trust.completeness`` holds every skip
to both: a skip without a fact, on a fact the manifest does not allow for that test, or on a fact the record itself
contradicts (``problem``) or the fleet contradicts (``completeness.fleet_problems``) makes the run partial. Nothing here
reads a skip's reason.

This module is data and pure functions (no pytest, no torch): the run, the re-render, merge, sign-off and
calibrate all use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from clustergate.criteria.thresholds import Profile, Thresholds, ThresholdsError, expects_gpus, load, shipped_thresholds

PROFILE_KINDS = ("cpu", "gpu")
"""What a manifest rule is written for: the cpu profile (``gpus_per_node: 0``, a dry run) or any GPU profile."""

FACTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "no_gpu": ("the profile expects no GPU (the cpu profile), and no node's discovery counts a CUDA device", ()),
    "one_node": ("the job has one node: there is no network between nodes to measure", ()),
    "one_rank": ("the job has one rank: no collective traffic", ()),
    "one_rank_per_node": ("a node runs a single rank: no traffic inside it", ()),
    "one_gpu_per_node": ("every node has one GPU: each GPU alone is every GPU of its node at once", ()),
    "below_level": ("the run's level leaves the test out", ("level",)),
    "not_required": ("the profile does not ask for it (an expect: key or a setting it leaves out)", ("setting",)),
    "no_shared_dir": ("no shared directory is named (--shared-dir, CLUSTERGATE_SHARED_DIR or the profile's)", ()),
    "package_missing": ("an optional package or program the test needs is not installed (deepspeed, perftest, "
                        "fio)", ("package",)),
    "dcgm_not_requested": ("DCGM's diagnostics were not asked for at a level that includes the test",
                           ("requested", "needs")),
    "unsupported": ("the node does not offer it (NVML says not supported, a counter the kernel does not expose, "
                    "DCGM absent or silent, no GPU NUMA locality, no fp8 units)", ()),
    "no_infiniband": ("the node has no InfiniBand or RoCE port", ()),
    "no_roce": ("the node has no ACTIVE RoCE port (link layer Ethernet): no RoCE GID to check", ()),
}
"""Every fact a skip may rest on: what it says, and the parameters it records."""


class FactError(ValueError):
    """A skip names a fact that does not exist, or without its parameters (a mistake in the suite's code)."""


def fact(name: str, **params: Any) -> dict[str, Any]:
    """A skip's fact as results.json records it (FactError for a name or parameters ``FACTS`` does not have)."""
    if name not in FACTS:
        raise FactError(f"{name!r} is not a skip fact; known: {', '.join(FACTS)}")
    wanted = FACTS[name][1]
    if set(params) != set(wanted):
        raise FactError(f"skip fact {name!r} records {', '.join(wanted) or 'no parameters'}, got {sorted(params)}")
    return {"fact": name, **params}


@cache
def _shipped() -> Thresholds | None:
    try:
        return load(shipped_thresholds())
    except (ThresholdsError, OSError):
        return None


def profile_kind(results: Mapping[str, Any], profile: Profile | None = None) -> str:
    """``cpu`` or ``gpu``: the profile's (by its ``gpus_per_node``): the one given (merge and sign-off hold every
    run to the site's), else the shipped profile of the name the record gives, else what the record shows (a dry
    run, or no node listing a GPU, is a cpu run)."""
    if profile is None and (shipped := _shipped()) is not None:
        profile = shipped.profiles.get(str(results.get("profile")))
    if profile is not None:
        return "gpu" if expects_gpus(profile.settings.get("gpus_per_node")) else "cpu"
    if (results.get("attestation") or {}).get("dry_run") is True:
        return "cpu"
    return "gpu" if any(_gpus(node) for node in _nodes(results)) else "cpu"


def _nodes(results: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [n for n in results.get("nodes") or [] if isinstance(n, Mapping)]


def _gpus(node: Mapping[str, Any]) -> list[Any]:
    return [g for g in node.get("gpus") or [] if g]


def ib_hosts(results: Mapping[str, Any]) -> list[str]:
    """The hosts whose recorded discovery lists an InfiniBand or RoCE port."""
    return sorted({str(d.get("host")) for d in results.get("discovery") or []
                   if isinstance(d, Mapping) and d.get("infiniband")})


def _no_gpu(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    if profile_kind(results, profile) != "cpu":
        return "the run's profile expects GPUs"
    devices = [str(d.get("host")) for d in results.get("discovery") or []
               if isinstance(d, Mapping) and d.get("cuda_devices")]
    return f"the discovery of {', '.join(devices)} counts CUDA devices" if devices else None


def _one_node(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    n = len(_nodes(results))
    return None if n == 1 else f"the record lists {n} nodes"


def _one_rank(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    n = results.get("world_size")
    return None if n == 1 else f"the job had {n} ranks"


def _ranks(results: Mapping[str, Any]) -> list[int]:
    return [len(n.get("ranks") or []) for n in _nodes(results)]


def _one_rank_per_node(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    return None if 1 in _ranks(results) else f"every node ran several ranks ({_ranks(results)})"


def _one_gpu_per_node(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    ranks = _ranks(results)
    return None if ranks and set(ranks) == {1} else f"its nodes ran {ranks} ranks"


def _below_level(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    # The level is proven by what ran: a skip taken at one level in a record that says another is a relabelled run.
    if f.get("level") != results.get("level"):
        return f"it was left out at level {f.get('level')}, but the record says level {results.get('level')}"
    return None


def _not_required(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    if profile is None:
        return None  # the run itself took it from its own profile; merge and sign-off check it against theirs
    section, _, key = str(f.get("setting")).partition(".")
    if section == "expect":
        return f"profile {profile.name!r} sets expect.{key}" if key in profile.expect else None
    if section == "settings":
        value = profile.settings.get(key)
        return f"profile {profile.name!r} sets settings.{key}: {value!r}" if value not in (None, 0) else None
    return f"{f.get('setting')!r} is not an expect: key or a setting"


def _no_shared_dir(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    if profile is not None and profile.settings.get("shared_dir"):
        return f"profile {profile.name!r} names settings.shared_dir"
    return None


def _package_missing(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    version = (results.get("environment") or {}).get(str(f.get("package")))
    return f"the record's environment has {f.get('package')} {version}" if version else None


def _dcgm(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    requested, needs = f.get("requested"), f.get("needs")
    if requested is not None and (not isinstance(needs, int) or requested >= needs):
        return f"DCGM was asked for at level {requested}, which includes it (it needs {needs})"
    return None


def _none(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    return None  # a property of one node: the fleet checks it (completeness.fleet_problems)


def _no_infiniband(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    hosts = ib_hosts(results)
    return f"the record's discovery lists InfiniBand ports on {', '.join(hosts)}" if hosts else None


def _no_roce(f: Mapping[str, Any], results: Mapping[str, Any], profile: Profile | None) -> str | None:
    hosts = sorted({str(d.get("host")) for d in results.get("discovery") or [] if isinstance(d, Mapping)
                    and any(isinstance(p, Mapping) and p.get("link_layer") == "Ethernet" and p.get("state") == "ACTIVE"
                            for p in d.get("infiniband") or [])})
    return f"the record's discovery lists ACTIVE RoCE ports on {', '.join(hosts)}" if hosts else None


CHECKS = {"no_gpu": _no_gpu, "one_node": _one_node, "one_rank": _one_rank, "one_rank_per_node": _one_rank_per_node,
          "one_gpu_per_node": _one_gpu_per_node, "below_level": _below_level, "not_required": _not_required,
          "no_shared_dir": _no_shared_dir, "package_missing": _package_missing, "dcgm_not_requested": _dcgm,
          "unsupported": _none, "no_infiniband": _no_infiniband,
          "no_roce": _no_roce}


def problem(f: Any, results: Mapping[str, Any], profile: Profile | None = None) -> str | None:
    """Why the recorded fact ``f`` is not one (malformed, or contradicted by the rest of ``results``); None when the
    record bears it out. ``profile``: the profile the run is held to, where the reader knows it (merge and sign-off
    do); without it the facts about the profile's settings are taken as the run recorded them."""
    if not isinstance(f, Mapping) or f.get("fact") not in FACTS:
        return "no skip fact recorded" if f is None else f"{f!r} is not a skip fact"
    name = str(f["fact"])
    if set(f) - {"fact"} != set(FACTS[name][1]):
        return f"skip fact {name} without its parameters ({', '.join(FACTS[name][1])})"
    return CHECKS[name](f, results, profile)
