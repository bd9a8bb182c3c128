"""Where a criterion's figures come from (``source:`` in thresholds.yaml), so a reader can weigh a miss.

- ``spec``: a datasheet, a standard (PCIe, InfiniBand: a link's rate with the fraction the bound takes of it), or
  the original acceptance criteria (optionally with a ``note`` naming which);
- ``measured``: derived from runs on real machines: ``tool``, ``machine``, ``date`` and sample size ``n``
  are required (``runs`` and ``note`` optional), e.g. what ``clustergate calibrate`` writes;
- ``published``: a figure or a rule its vendor or a public benchmark published (NCCL's maintainers on what a
  link reaches, DCGM's health rules); ``note`` is required and says where;
- ``peers``: no absolute figure can be cited yet: the part is judged against its peers only (its node's GPUs in
  the run, the fleet at merge), so the criterion may bound nothing but ``outlier_fraction``/``outlier_multiple``;
- ``estimate``: a reasoned guess, not yet measured. Shipped estimates carry ``severity: warn`` and never appear
  in a sign-off profile.
- ``site``: set by a site's thresholds file (``note``: "set by FILE"): a criterion a site file edits from the
  shipped profile's without a source of its own cites the file, not the shipped source
  (``clustergate.criteria.thresholds``).

In thresholds.yaml: ``source: spec`` (a word), or a mapping
``source: {kind: measured, tool: nccl-tests, machine: "2x H200 NV18", date: 2026-01-10, n: 16}``.
In results.json the criterion says ``"source": kind`` and, where given, ``"source_detail": {...}``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("spec", "measured", "published", "peers", "estimate", "site")
REQUIRED = {"measured": ("tool", "machine", "date", "n"), "published": ("note",)}
"""Detail a kind must give: a measured figure says by what, on what, when and from how many samples; a published
one where it was published."""
CITED = ("spec", "measured", "published")
"""The kinds that cite where an absolute bound (min, max) comes from: what a sign-off profile's bounds rest on."""
DETAIL = ("tool", "machine", "date", "n", "runs", "note")


class SourceError(ValueError):
    """A ``source`` is malformed; the message says what it takes."""


@dataclass(frozen=True, slots=True)
class Source:
    kind: str
    detail: tuple[tuple[str, Any], ...] = ()
    """(key, value) pairs in DETAIL order: what was measured with what, where, when, how often."""

    @classmethod
    def parse(cls, raw: Any) -> Source:
        if isinstance(raw, str):
            raw = {"kind": raw}
        if not isinstance(raw, Mapping):
            raise SourceError(f"must be one of {', '.join(KINDS)} or a mapping with 'kind', got {raw!r}")
        kind = raw.get("kind")
        if kind not in KINDS:
            raise SourceError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        unknown = sorted(set(raw) - {"kind", *DETAIL})
        if unknown:
            raise SourceError(f"unknown key {unknown[0]!r}; a source takes kind, {', '.join(DETAIL)}")
        missing = [k for k in REQUIRED.get(kind, ()) if raw.get(k) in (None, "")]
        if missing:
            raise SourceError(f"{kind} needs {', '.join(missing)}: write source: {{kind: {kind}, "
                              + ", ".join(f"{k}: ..." for k in REQUIRED[kind]) + "}")
        for key in ("n", "runs"):
            if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], int) or raw[key] < 1):
                raise SourceError(f"{key} must be a whole number >= 1, got {raw[key]!r}")
        detail = tuple((k, raw[k].isoformat() if isinstance(raw[k], dt.date) else raw[k]) for k in DETAIL if k in raw)
        return cls(kind, detail)

    @classmethod
    def from_json(cls, kind: Any, detail: Mapping[str, Any] | None) -> Source | None:
        if kind not in KINDS:
            return None
        return cls(kind, tuple((k, (detail or {})[k]) for k in DETAIL if k in (detail or {})))

    def text(self) -> str:
        """``measured (nccl-tests, 2x H200 NV18, 2026-01-10, n=16)``; ``spec (H100 datasheet)``; ``estimate``."""
        parts = [f"n={v}" if k == "n" else f"{v} runs" if k == "runs" else str(v) for k, v in self.detail]
        return f"{self.kind} ({', '.join(parts)})" if parts else self.kind
