"""A site profile against the shipped profile it holds to: where it is looser, or drops or demotes a criterion.

A site profile (``clustergate calibrate``'s, or one written by hand) may hold nodes tighter than the shipped
profile of their GPU model and shape, never looser unseen: ``clustergate list``, the run, merge and sign-off say
per criterion what ``weakenings`` finds. The shipped profile a profile holds to (``shipped_profile``) is the one
``Thresholds.holds`` of the file clustergate ships names (the same name, else the nearest it ``extends``, of the
same shape; else the shipped choice for its ``match`` and shape). A profile of the shipped file itself is the
shipped profile: it weakens nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustergate.common.numbers import number
from clustergate.criteria.criterion import BOUNDS, Criterion
from clustergate.criteria.thresholds import Profile, Thresholds, ThresholdsError, load, shipped_thresholds

KINDS = ("looser", "dropped", "demoted")
"""looser: a bound moved the permissive way (or left out); dropped: a judged shipped criterion absent, or kept
without a bound; demoted: severity fail -> warn."""


@dataclass(frozen=True, slots=True)
class Weakening:
    """One criterion where a profile asks less than the shipped profile."""

    metric: str
    kind: str
    profile: str
    """The profile that weakens it."""
    shipped: str
    """The shipped profile it is held against."""
    detail: str

    def text(self) -> str:
        """``d2h_gbps: looser than shipped cpu (>= 0.0615 where cpu has >= 0.2)``."""
        said = {"looser": "looser than", "dropped": "dropped from", "demoted": "demoted from"}[self.kind]
        return f"{self.metric}: {said} shipped {self.shipped} ({self.detail})"

    def as_json(self) -> dict[str, str]:
        return {"metric": self.metric, "kind": self.kind, "profile": self.profile, "shipped": self.shipped,
                "detail": self.detail}


def shipped() -> Thresholds | None:
    """The thresholds file clustergate ships; None where it cannot be read (nothing to compare with)."""
    try:
        return load(shipped_thresholds())
    except ThresholdsError:
        return None


def shipped_profile(profile: Profile, ships: Thresholds | None = None) -> Profile | None:
    """The shipped profile ``profile`` holds to (the module's rule); ``profile`` itself where it is shipped."""
    ships = ships if ships is not None else shipped()
    return ships.holds(profile) if ships is not None else None


def _permissive(key: str, site: float, ships: float) -> bool:
    """Whether bound ``key`` at ``site`` lets through a figure it fails at ``ships``."""
    return site < ships if BOUNDS[key].worst == "low" else site > ships


def _compare(metric: str, site: Criterion | None, ships: Criterion) -> list[tuple[str, str]]:
    if not ships.bounds:
        return []  # the shipped profile only records it
    if site is None or not site.bounds:
        said = "no criterion" if site is None else "recorded, not judged"
        return [("dropped", f"{said} where shipped has {ships.text()}")]
    out: list[tuple[str, str]] = []
    looser = [f"no {b.key} where shipped has {b.text()}" if site.get(b.key) is None else
              f"{b.key} {number(site.get(b.key))} where shipped has {b.text()}" for b in ships.bounds
              if site.get(b.key) is None or _permissive(b.key, site.get(b.key), b.value)]  # type: ignore[arg-type]
    if looser:
        out.append(("looser", "; ".join(looser)))
    if ships.severity == "fail" and site.severity != "fail":
        out.append(("demoted", f"severity {site.severity} where shipped fails the test"))
    return out


def weakenings(profile: Profile, ships: Thresholds | None = None) -> list[Weakening]:
    """Every criterion where ``profile`` asks less than its shipped profile, in the shipped profile's order."""
    base = shipped_profile(profile, ships)
    if base is None or base is profile:
        return []
    return [Weakening(metric, kind, profile.name, base.name, detail)
            for metric, crit in base.metrics.items()
            for kind, detail in _compare(metric, profile.metrics.get(metric), crit)]
