"""What a run does with the results store (``--store``), on rank 0: the first accepted figures and the site's
healthy durations read once as the session starts (the durations refine each test's limit: clustergate.run.testlimit),
drift judged as each test is judged (before the verdict is shared, so every rank applies the same verdict), and the
run recorded once results.json is final.

The store never decides whether the run can run: a store that cannot be read or written costs the drift
judgement or the record, said once on the terminal and in results.json's ``drift`` section, never the run. Only a
path that can never be a store (its directory missing, a directory, a link, another kind of file) stops the run
at its start, as any bad option does (``problem``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clustergate.criteria.settings import DRIFT_FRACTION, DRIFT_SEVERITY
from clustergate.criteria.thresholds import Profile
from clustergate.record.outcomes import PhaseVerdict, metric_block
from clustergate.record.resultsfile import ResultsFileError
from clustergate.run.durations import Healthy, Key, site
from clustergate.run.limits import SITE_RUNS
from clustergate.store import Store, StoreError
from clustergate.store.db import TIMEOUT_S
from clustergate.store.drift import Baselines, Drift, followed, judge, section


@dataclass(slots=True)
class Memory:
    """Rank 0's use of the store during one run."""

    path: Path
    fraction: float = DRIFT_FRACTION
    """The profile's drift_fraction."""
    severity: str = DRIFT_SEVERITY
    """The profile's drift_severity."""
    first: Baselines | None = None
    """Every first accepted figure the run's parts can be held to; None until read (or where it could not be)."""
    problem: str | None = None
    """Why drift is not judged (the store could not be read), or None."""
    findings: list[Drift] = field(default_factory=list)
    durations: dict[str, Healthy] = field(default_factory=dict)
    """The site's healthy time of each test its accepted runs of this profile, level and shape passed (none until
    read, or where the store could not be read)."""

    @classmethod
    def of(cls, path: Path | None, profile: Profile) -> Memory | None:
        """The run's memory where it has a store (None: no store, and nothing changes)."""
        if path is None:
            return None
        return cls(path, float(profile.settings.get("drift_fraction", DRIFT_FRACTION)),
                   str(profile.settings.get("drift_severity", DRIFT_SEVERITY)))

    def read(self, profile: Profile, identities: Iterable[Mapping[str, Any]], *, level: str, started: str,
             timeout_s: float) -> str | None:
        """Read the first accepted figure of every metric with a floor, of every GPU (by serial) and node (by name)
        of the run, from runs at ``level`` that started before this one; a line to say where it could not be."""
        metrics = {name for name, c in profile.metrics.items() if c.higher_is_better is True}
        serials = {str(i["gpu"]["serial"]) for i in identities if (i.get("gpu") or {}).get("serial")}
        hosts = {str(i["host"]) for i in identities}
        try:
            self.first = Store(self.path, timeout_s=timeout_s).baselines(metrics, serials=serials, hosts=hosts,
                                                                           level=level, before=started)
        except StoreError as exc:  # StoreBusy too: the store held past the wait
            self.problem = f"drift not judged: {exc}"
            return self.problem
        return None

    def read_durations(self, key: Key, *, timeout_s: float) -> str | None:
        """Read every test's durations from the site's newest accepted runs of ``key`` (SITE_RUNS); a line to say
        where they could not be (the limits then follow the reference alone)."""
        try:
            self.durations = site(Store(self.path, timeout_s=timeout_s), key, SITE_RUNS)
        except StoreError as exc:
            return f"test limits from the reference alone: the store's durations could not be read: {exc}"
        return None

    def judge(self, nodeid: str, verdict: PhaseVerdict, nodes: list[dict[str, Any]]) -> PhaseVerdict:
        """The call phase's verdict with this test's drift judged: a drift of weight ``fail`` fails the test on every
        rank (its text among the problems, its rank among the failed ones); one of weight ``warn`` is listed (the
        run's ``warnings``, from the ``drift`` section)."""
        if self.first is None or not verdict.metrics or verdict.outcome not in ("passed", "failed"):
            return verdict
        test = {"nodeid": nodeid, "outcome": verdict.outcome, "metrics": [m.as_json() for m in verdict.metrics]}
        found = judge(followed({"tests": [test], "nodes": nodes}), self.first, fraction=self.fraction,
                      severity=self.severity)
        self.findings += found
        failing = [d for d in found if d.severity == "fail"]
        if not failing:
            return verdict
        problems = [*verdict.problems, *(f"drift: {d.text()}" for d in failing)]
        missed = [f for m in verdict.metrics for f in m.failures]
        ranks = sorted({*verdict.failed_ranks, *(d.rank for d in failing if d.rank is not None)})
        return replace(verdict, outcome="failed", problems=problems, failed_ranks=ranks,
                       message="\n".join(problems + ([metric_block(missed)] if missed else [])))

    def section(self) -> dict[str, Any]:
        """results.json's ``drift`` section."""
        return section(self.findings, self.fraction, self.severity, str(self.path), self.problem)

    def record(self, results: Path, *, timeout_s: float = TIMEOUT_S) -> str:
        """Record the final results.json into the store; the line that says what happened."""
        try:
            done = Store(self.path, timeout_s=timeout_s).record_file(results)
        except (StoreError, ResultsFileError) as exc:
            return (f"the run was not recorded in the store: {exc}; record it later: clustergate record "
                    f"{results.parent} --store {self.path}")
        said = "recorded in" if done.new else "already in"
        return f"{said} the store {self.path} as #{done.run}"
