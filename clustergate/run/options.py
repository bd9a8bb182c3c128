"""The run's options: the command line, else the ini key ``clustergate_<name>``, else the default; one dataclass,
checked once, each error naming the option (or ini key) and the value seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from clustergate.criteria.thresholds import Profile, shipped_thresholds
from clustergate.run.limits import DEFAULT_COLLECTIVE_TIMEOUT_S
from clustergate.run.testlimit import run_wide
from clustergate.store import STORE_ENV, store_path
from clustergate.trust import keyed
from clustergate.trust.completeness import recorded_options
from workloads.common import LEVELS

DEFAULT_LEVEL = "standard"

INI_KEYS: dict[str, tuple[str, str]] = {
    "thresholds": ("paths", "pass criteria per profile (--thresholds), relative to this file"),
    "profile": ("string", "profile in the thresholds file (--profile)"),
    "report_dir": ("paths", "where the outputs go (--report-dir), relative to this file"),
    "level": ("string", "quick, standard or extended (--level)"),
    "shared_dir": ("paths", "a directory every node mounts (--shared-dir)"),
    "test_timeout": ("string", "per-test limit in seconds (--test-timeout)"),
    "collective_timeout": ("string", "timeout of the workloads' process group in seconds (--collective-timeout)"),
    "store": ("paths", "the results store's file (--store), relative to this file"),
}
"""Each option that may also be set as the ini key clustergate_<name> (the command line wins)."""


def seconds(text: str) -> float | str:
    """The type of the time-limit options: a number, or the text as given. A text is refused by ``Options``
    in pytest_configure, after the report directory is claimed: an argparse error would stop pytest before
    any of the plugin runs, leaving an earlier run's results.json in place."""
    try:
        return float(text)
    except ValueError:
        return text


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("clustergate", "cluster acceptance (clustergate)")
    group.addoption("--thresholds", default=None, metavar="FILE",
                    help="pass criteria per profile (default: ini clustergate_thresholds, else the thresholds.yaml "
                         "shipped with clustergate)")
    group.addoption("--profile", default=None, metavar="NAME",
                    help="profile in the thresholds file (default: chosen from the GPU model NVML "
                         "reports; 'cpu' only where the node has no NVIDIA device)")
    group.addoption("--dry-run", action="store_true", default=False,
                    help="rehearse with --profile cpu on a node that has GPUs (or whose site or launcher declares "
                         "them): recorded as a dry run (results.json attestation.dry_run), never signed off beside "
                         "GPU nodes; without it --profile cpu is refused there")
    group.addoption("--report-dir", default=None, metavar="DIR",
                    help="where results.json, report.html, junit.xml and progress.jsonl go "
                         "(default: reports/<UTC time>/ under the current directory)")
    # No argparse choices: a wrong level is refused in pytest_configure, after the report directory is claimed.
    group.addoption("--level", default=None, metavar="|".join(LEVELS),
                    help="how long and how large workloads run: quick (about a minute a node), "
                         "standard (default), extended (burn-in)")
    group.addoption("--shared-dir", default=None, metavar="DIR",
                    help="a directory every node mounts, for the shared-filesystem test (default: "
                         "$CLUSTERGATE_SHARED_DIR, else the profile's shared_dir setting)")
    group.addoption("--test-timeout", type=seconds, default=None, metavar="SECONDS",
                    help="every test's limit; a test past it ends the run on every rank (default: the profile's "
                         "test_timeout_s, else each test's own: a few times its measured healthy time, else the "
                         "level's 120/600/1800 s; clustergate list shows each)")
    group.addoption("--collective-timeout", type=seconds, default=None, metavar="SECONDS",
                    help="timeout of the workloads' process group (default: the profile's "
                         "collective_timeout_s)")
    group.addoption("--baseline", default=None, metavar="PATH",
                    help="results.json of an earlier run (or its report directory) to compare with: "
                         "changes beyond the profile's baseline_tolerance are flagged in the report "
                         "and in results.json under 'baseline'")
    group.addoption("--store", default=None, metavar="PATH",
                    help=f"the results store (an SQLite file a shared file system may hold): drift is judged against "
                         f"each figure's own first accepted figure there, and the run is recorded into it when it "
                         f"ends (default: ini clustergate_store, else ${STORE_ENV}; --store '' uses none)")
    group.addoption("--key-file", default=None, metavar="FILE",
                    help=f"the site key: rank 0 signs results.json (HMAC-SHA256) at every write, and merge and signoff "
                         f"given the key take only signed files (default: ${keyed.KEY_ENV}); a file only this user "
                         "can read (chmod 600)")
    for name, (kind, text) in INI_KEYS.items():
        parser.addini(f"clustergate_{name}", type=kind, default=[] if kind == "paths" else None,
                      help=f"clustergate: {text}")


def _seconds_problem(option: str, value: float | str | None) -> str | None:
    """A time limit must be a finite number of seconds above 0 (0 would silently mean the default)."""
    if value is not None and not (isinstance(value, float) and math.isfinite(value) and value > 0):
        return f"{option} {value}: a time limit must be a finite number of seconds above 0"
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """What the run was asked to do; every field checked when it is made (``pytest.UsageError`` naming the option)."""

    thresholds: str
    """The thresholds file (--thresholds; default: the shipped one)."""
    profile: str | None
    """The profile's name (--profile); None: chosen from the GPU model."""
    report_dir: str | None
    """--report-dir; None: reports/<UTC time>/ chosen by rank 0."""
    level: str
    """quick, standard or extended (--level)."""
    shared_dir: str | None
    """A directory every node mounts (--shared-dir)."""
    test_timeout_s: float | None
    """--test-timeout; None: the profile's test_timeout_s."""
    collective_timeout_s: float | None
    """--collective-timeout; None: the profile's collective_timeout_s."""
    store: Path | None = None
    """The results store (--store, else the ini key, else $CLUSTERGATE_STORE); None: no store, nothing changes."""
    baseline: str | None = None
    """--baseline: an earlier run's results.json (or its directory) to compare with; None: no comparison."""
    keyword: str | None = None
    """-k, as results.json records it."""
    markexpr: str | None = None
    """-m, as results.json records it."""
    collect_only: bool = False
    """--collect-only: tests are listed, none run."""
    dry_run: bool = False
    """--dry-run: the cpu profile on a node with GPUs, as a rehearsal
    (clustergate.trust.attestation.profile_problem)."""
    narrowing: dict[str, Any] = field(default_factory=dict)
    """What else of pytest's command line can narrow or hollow the run (paths and node ids, --deselect, the modes
    that run no test body, -x/--maxfail), as results.json's ``selection`` keeps it (clustergate.trust.completeness)."""
    key: bytes | None = field(default=None, repr=False)
    """The site key (--key-file, else $CLUSTERGATE_KEY_FILE): results.json is signed with it
    (clustergate.trust.keyed)."""

    def __post_init__(self) -> None:
        for option, value in (("--test-timeout", self.test_timeout_s),
                              ("--collective-timeout", self.collective_timeout_s)):
            problem = _seconds_problem(option, value)
            if problem:
                raise pytest.UsageError(problem)
        if self.level not in LEVELS:
            raise pytest.UsageError(f"--level {self.level}: invalid choice: {self.level!r} "
                                    f"(choose from {', '.join(LEVELS)})")

    @classmethod
    def from_config(cls, config: pytest.Config) -> Options:
        """The options of this pytest run: its command line, its ini keys, the defaults.

        Each resolved value is written back to ``config.option`` too, so that a reader of ``config.getoption``
        (the acceptance suite's fixtures, the report) sees what the run uses."""
        _resolve_ini_keys(config)
        if hasattr(config, "workerinput") or config.getoption("numprocesses", None) or \
                config.getoption("dist", "no") != "no":
            raise pytest.UsageError("clustergate runs one pytest per rank under torchrun: do not combine it "
                                    "with pytest-xdist (-n/--dist); use torchrun --nproc-per-node instead")
        if config.pluginmanager.hasplugin("randomly") or config.pluginmanager.hasplugin("random_order"):
            raise pytest.UsageError("a random-order plugin is active: every rank must run tests in the same "
                                    "order; add -p no:randomly (or -p no:random_order)")
        return cls(thresholds=config.getoption("thresholds"), profile=config.getoption("profile"),
                   report_dir=config.getoption("report_dir"), level=config.getoption("level"),
                   shared_dir=config.getoption("shared_dir"), test_timeout_s=config.getoption("test_timeout"),
                   collective_timeout_s=config.getoption("collective_timeout"), baseline=config.getoption("baseline"),
                   store=store_path(config.getoption("store")),
                   keyword=config.getoption("keyword") or None, markexpr=config.getoption("markexpr") or None,
                   collect_only=bool(config.getoption("collectonly", False)), dry_run=bool(config.getoption("dry_run")),
                   narrowing=recorded_options(config), key=_site_key(config.getoption("key_file")))

    def test_limit_s(self, profile: Profile) -> float:
        """The run-wide test limit: --test-timeout, else the profile's test_timeout_s, else the level's. Each test's
        own limit is ``clustergate.run.testlimit.choose``'s (its marker, or its measured time, come first)."""
        return run_wide(self.test_timeout_s, profile.settings.get("test_timeout_s"), self.level).seconds

    def collective_limit_s(self, profile: Profile) -> float:
        """The workloads' process group timeout: --collective-timeout, else the profile's, else the default."""
        return _given_or(self.collective_timeout_s,
                         profile.settings.get("collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S))

    def selection(self) -> dict[str, Any]:
        """results.json's ``selection`` as the run starts (the counts come with the collection)."""
        return {"k": self.keyword, "m": self.markexpr, "level": self.level, "selected": None, "deselected": None,
                **self.narrowing}


def _site_key(given: str | None) -> bytes | None:
    """The site key, read once at configure on every rank: a key file that is not the user's own is a usage error."""
    try:
        return keyed.given_key(given)
    except keyed.KeyFileError as exc:
        raise pytest.UsageError(str(exc)) from None


def _given_or(given: float | None, default: float) -> float:
    return default if given is None else given


def _resolve_ini_keys(config: pytest.Config) -> None:
    """Fill each option not given on the command line from its ini key, then from its default."""
    for name, (kind, _) in INI_KEYS.items():
        if config.getoption(name) is not None:
            continue
        value = config.getini(f"clustergate_{name}")
        if kind == "paths":
            value = str(value[0]) if value else None
        if value in (None, ""):
            continue
        if name in ("test_timeout", "collective_timeout"):
            try:
                value = float(value)
            except ValueError:
                raise pytest.UsageError(f"{config.inipath}: clustergate_{name} = {value!r} is not a number of "
                                        "seconds") from None
        if name == "level" and value not in LEVELS:
            raise pytest.UsageError(f"{config.inipath}: clustergate_level = {value!r}; choose one of "
                                    f"{', '.join(LEVELS)}")
        setattr(config.option, name, value)
    if config.option.thresholds is None:
        config.option.thresholds = str(shipped_thresholds())
    if config.option.level is None:
        config.option.level = DEFAULT_LEVEL
