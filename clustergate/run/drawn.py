"""What the run hands the sign-off report to draw (``clustergate.report.hooks.LIVE``): its record as results.json
says it, and the run's facts. The report reads these and never reaches into the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustergate.common.places import shown_path
from clustergate.run.lifecycle import Run
from clustergate.trust.suitefiles import suite_root


@dataclass(frozen=True, slots=True)
class Drawn:
    """The run as the report sees it (``clustergate.report.hooks.Source``)."""

    run: Run

    @property
    def results_path(self) -> Path:
        return self.run.results_path

    def results(self, *, final: bool = False, only_test: str | None = None) -> dict[str, Any] | None:
        """Rank 0's record of a run that writes outputs (not a --collect-only listing); the decided one at the end."""
        if not self.run.writes:
            return None
        if final and self.run.decided is not None:
            return self.run.decided
        return self.run.record.as_json(only_test=only_test)

    def facts(self) -> dict[str, Any]:
        run = self.run
        return {"profile": run.profile.name, "level": run.level, "world size": run.world.world_size,
                "report dir": shown_path(run.report_dir, (Path.cwd(), suite_root())) if run.report_dir else None,
                **run.record.environment}
