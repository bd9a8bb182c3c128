"""The one result type every workload returns.

Workloads know nothing of pytest or thresholds: they measure, check correctness, and return a
frozen ``Result``. The acceptance test hands it to the plugin (``cg.record_result(result)``),
which gathers every rank's metrics and judges them against the profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Scope = Literal["gpu", "node", "world"]
"""Who a metric belongs to.

- ``gpu``: each rank measured its own device (matmul TFLOPS, HBM bandwidth); every rank's value
  is judged and a failure names that rank's host, GPU index and serial.
- ``node``: one value per node, the same on every rank of the node (intra-node all_reduce);
  the plugin keeps the value of the node's lowest rank.
- ``world``: one value for the whole job, the same on every rank (cross-node all_reduce);
  the plugin keeps rank 0's value.
"""


@dataclass(frozen=True, slots=True)
class Metric:
    """One measured figure. ``name`` is a stable identifier shared with thresholds.yaml."""

    name: str
    value: float
    unit: str
    scope: Scope = "gpu"
    description: str = ""
    """How it was measured, in a few words (shown in the report): e.g. 'bytes read + written'."""

    def __post_init__(self) -> None:
        if not isinstance(self.value, (int, float)) or isinstance(self.value, bool):
            raise TypeError(f"metric {self.name}: value must be a number, got {self.value!r}")
        if self.scope not in ("gpu", "node", "world"):
            raise ValueError(f"metric {self.name}: scope must be gpu, node or world, got {self.scope!r}")
        if not math.isfinite(self.value):
            raise ValueError(f"metric {self.name}: value is {self.value}; a workload must fail with the reason "
                             "instead of recording a figure that is not a finite number")


@dataclass(frozen=True, slots=True)
class Result:
    """What a workload measured on this rank.

    ``details`` holds supporting data for the report (curves, sweeps, clocks, loss history):
    JSON-serialisable values only. Nothing in it is judged.
    """

    metrics: tuple[Metric, ...]
    details: dict[str, Any] = field(default_factory=dict)

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(f"result has no metric {name!r}; it has {[m.name for m in self.metrics]}")


class WorkloadError(RuntimeError):
    """A workload found its result wrong (correctness before speed) or could not run.

    The message says what was checked, what was seen, and what to try.
    """
