"""A thresholds file names only metrics the suite records: a criterion for any other judges nothing, unseen.

A typo (``matmul_bf16_tflop``) or a metric the suite no longer records leaves the real metric under the shipped
criterion, or none, while the file reads as if it judged it. ``unknown_metric`` finds the first such criterion of
a file, against the metrics the suite's manifest says its tests record (``clustergate.trust.manifest``), in one
line naming the file, the profile, the key and the closest names the suite records. ``clustergate list``, merge,
sign-off and calibrate refuse such a file with exit 2.
"""

from __future__ import annotations

import difflib

from clustergate.criteria.thresholds import Thresholds, ThresholdsError
from clustergate.trust.manifest import Manifest, shipped


def recorded(manifest: Manifest) -> set[str]:
    """Every metric a test of the suite declares (``@pytest.mark.metrics``), so records."""
    return {name for test in manifest.tests for name in test.metrics}


def unknown_metric(thresholds: Thresholds, manifest: Manifest | None = None) -> str | None:
    """The first criterion of ``thresholds`` for a metric no test of ``manifest`` (default: the shipped suite's)
    records, as one line; None where every criterion names a recorded metric."""
    known = recorded(manifest or shipped())
    for profile in thresholds.profiles.values():
        for metric in profile.metrics:
            if metric in known:
                continue
            close = difflib.get_close_matches(metric, sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            return (f"{thresholds.path}: profiles.{profile.name}.metrics.{metric}: no test of the suite records "
                    f"{metric!r}: {hint}name a metric the suite records (clustergate list shows them), or remove it")
    return None


def check(thresholds: Thresholds, manifest: Manifest | None = None) -> Thresholds:
    """``thresholds``, or ThresholdsError with ``unknown_metric``'s line."""
    if (problem := unknown_metric(thresholds, manifest)) is not None:
        raise ThresholdsError(problem)
    return thresholds
