"""A hand-edited site thresholds file that asks less than the shipped profile it extends, three ways: a minimum
lowered to nothing, a fail criterion demoted to warn, a criterion dropped (kept as a record only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from torchrun_job import ROOT

SHIPPED = "h100-sxm-80gb"
NAME = "site-h100"
LOOSER = {"hbm_bandwidth_tbps": {"min": -5, "ceiling": 3.35, "outlier_fraction": 0.9, "unit": "TB/s"},
          "d2h_bandwidth_gbps": {}}
DEMOTED = "matmul_bf16_tflops"
SAID = (f"hbm_bandwidth_tbps: looser than shipped {SHIPPED} (min -5 where shipped has >= 2.7)",
        f"{DEMOTED}: demoted from shipped {SHIPPED} (severity warn where shipped fails the test)",
        f"d2h_bandwidth_gbps: dropped from shipped {SHIPPED} (recorded, not judged where shipped has >= 45, "
        "ceiling 64, >= 80% of peers' median)")
"""What list, the run, merge and sign-off say of it, per criterion (``Weakening.text``)."""


def write(path: Path, extra: dict[str, Any] | None = None) -> Path:
    """The shipped file with profile NAME, extending SHIPPED with LOOSER, DEMOTED and ``extra`` metrics."""
    data = yaml.safe_load((ROOT / "thresholds.yaml").read_text())
    demoted = {**data["profiles"][SHIPPED]["metrics"][DEMOTED], "severity": "warn"}
    data["profiles"] = {NAME: {"extends": SHIPPED, "match": ["H100"],
                               "metrics": {**LOOSER, DEMOTED: demoted, **(extra or {})}}, **data["profiles"]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
