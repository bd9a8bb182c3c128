"""A test's time limit: the one rule, for the run's watchdog and for ``clustergate list``.

An explicit limit stands, in this order: the test's own ``@pytest.mark.time_limit`` (at the levels it names), then
``--test-timeout``, then the profile's ``test_timeout_s``. Otherwise the limit follows the test's healthy time for
the run's profile, level and job shape (``clustergate.run.durations``): LIMIT_MULTIPLE times it, at least LIMIT_FLOOR_S
(``clustergate.run.limits`` says why each). The healthy time is the reference's (the runs the package keeps),
refined by the site's store of its own accepted runs (``refine``); a test with neither gets the level's limit
(TEST_LIMIT_S). Every limit says where it came from (``TimeLimit.source``): results.json keeps it for each test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clustergate.run.durations import Healthy, Key
from clustergate.run.limits import LIMIT_FLOOR_S, LIMIT_MULTIPLE, SITE_READINGS_TO_SET, TEST_LIMIT_S

SOURCES = ("marker", "option", "profile", "store", "reference", "level")
"""Where a limit comes from: @pytest.mark.time_limit, --test-timeout, the profile's test_timeout_s, the site's
store, the reference readings, the level's limit."""
SAID = {"marker": "@pytest.mark.time_limit", "option": "--test-timeout", "profile": "the profile's test_timeout_s"}


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeLimit:
    """One test's limit and where it came from."""

    seconds: float
    source: str
    """One of SOURCES."""
    healthy_s: float | None = None
    """The healthy time a measured limit follows (``store``, ``reference``); None for any other."""
    measured: str = ""
    """Where the healthy time was measured, in words; for the level's limit, what has no measured time."""

    def as_json(self) -> dict[str, Any]:
        """results.json's ``limit`` of a test (and ``clustergate list --json``'s)."""
        return {"seconds": self.seconds, "source": self.source, "healthy_s": self.healthy_s,
                "measured": self.measured}

    def describe(self) -> str:
        """``60 s: 3 x its healthy 7.5 s, at least 60 s (reference: 2 runs on vm, 2026-11-29)``."""
        if self.source in SAID:
            return f"{self.seconds:g} s: {SAID[self.source]}"
        if self.healthy_s is None:
            return f"{self.seconds:g} s: the level's limit ({self.measured})"
        return (f"{self.seconds:g} s: {LIMIT_MULTIPLE:g} x its healthy {self.healthy_s:g} s, at least "
                f"{LIMIT_FLOOR_S:g} s ({self.measured})")


def measured_limit(healthy_s: float) -> float:
    """The limit of a test whose healthy time is ``healthy_s``."""
    return max(LIMIT_FLOOR_S, round(LIMIT_MULTIPLE * healthy_s, 1))


def refine(reference: Healthy | None, site: Healthy | None) -> tuple[Healthy | None, str]:
    """The healthy time a test's limit follows, and its source (``store`` or ``reference``; None and ``level``
    where there is none).

    The site's accepted runs (``site``: the slowest of its readings) replace the reference's time once there are
    SITE_READINGS_TO_SET of them, lower or higher: the site's nodes are what is accepted, and a site faster than the
    reference machine may tighten (the floor keeps the limit above any one-off cost). Fewer may only raise it: a
    healthy run slower than the reference must never be cut, while one run faster may have been a lucky one. Without
    a reference, fewer set nothing."""
    if site is not None and site.readings >= SITE_READINGS_TO_SET:
        return site, "store"
    if site is not None and reference is not None and site.seconds > reference.seconds:
        return Healthy(site.seconds, site.readings, f"{site.where}; above the {reference.where}"), "store"
    if reference is not None:
        return reference, "reference"
    return None, "level"


def run_wide(option_s: float | None, profile_s: float | None, level: str) -> TimeLimit:
    """The limit that holds for every test where nothing more particular does: --test-timeout, the profile's
    test_timeout_s, else the level's."""
    if option_s is not None:
        return TimeLimit(seconds=option_s, source="option")
    if profile_s is not None:
        return TimeLimit(seconds=float(profile_s), source="profile")
    return TimeLimit(seconds=TEST_LIMIT_S[level], source="level", measured="no measured time")


def choose(*, key: Key, marker_s: float | None, option_s: float | None, profile_s: float | None,
           reference: Healthy | None, site: Healthy | None) -> TimeLimit:
    """One test's limit under ``key`` (profile, level, shape): ``marker_s`` its @pytest.mark.time_limit at this
    level, ``option_s`` --test-timeout, ``profile_s`` the profile's test_timeout_s (None: not given); ``reference``
    and ``site`` its healthy time from the reference readings and the site's store (None: none)."""
    if marker_s is not None:
        return TimeLimit(seconds=marker_s, source="marker")
    explicit = run_wide(option_s, profile_s, key.level)
    if explicit.source != "level":
        return explicit
    healthy, source = refine(reference, site)
    if healthy is None:
        return TimeLimit(seconds=explicit.seconds, source="level",
                         measured=f"no measured time for {key.describe()}"
                                  + (f"; the store holds {site.readings} of {SITE_READINGS_TO_SET} readings it needs"
                                     if site is not None else ""))
    return TimeLimit(seconds=measured_limit(healthy.seconds), source=source, healthy_s=healthy.seconds,
                     measured=healthy.where)
