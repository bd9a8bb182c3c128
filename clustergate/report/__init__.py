"""The sign-off report: what results.json says, drawn for the person who signs the cluster off.

Everything here works on the results.json dict (schema 1), so a live run (``clustergate.report.hooks``)
and a re-render (``clustergate render results.json``) draw the same report. Nothing here decides: the verdict,
a re-judgement (``clustergate.record.rejudge``) and a comparison with an earlier run (``clustergate.criteria.baseline``)
are made before the dict is handed over (by the run, ``clustergate.render`` or the cluster commands).

- ``model``: pure derivations (criteria rows with margins and sources, failures, the run's facts);
  ``tables``: the per-GPU and per-node tables with their highlights.
- ``figures``: which plots a test's ``details`` hold (pure), following the conventions below.
- ``plots``: those figures as base64 PNG (matplotlib, Agg canvas; no pyplot, no global backend).
- ``html``: the HTML fragments pytest-html embeds (banner, tables, per-test extras).
- ``hooks``: the pytest plugin that puts them into pytest-html's report and prints the terminal summary
  (``summary``), in a live run and in a re-render.
- ``places``: this machine's directories rewritten out of what a report shows (relative to the suite, ``.``, ``~``).
- ``replay``: the tiny pytest session ``clustergate render`` runs so that pytest-html draws the recorded run.

Details conventions
===================
A workload's ``Result.details`` is free-form JSON (only rank 0's copy reaches the report: gather
per-rank data in the workload if the report should show it). The report draws these shapes, found at
the top level of ``details`` or one mapping below it (``details["lora"]["loss_curve"]``), and links the
whole dict as JSON from the test's row; anything else is kept, not drawn.

Curves (busbw against size, bandwidth against buffer size, ...): a list of two or more point dicts
sharing a numeric x field, the first present of ``X_FIELDS`` (``size``, ``bytes``, ``size_bytes``,
``message_bytes``, ``step``, ``n``, ``x``)::

    "sizes": [{"bytes": 1048576, "time_us": 210.0, "algbw_gbps": 4.9, "busbw_gbps": 9.8}, ...]

- y is the first quantity of ``Y_PREFERRED`` present (``busbw``, ``bandwidth``, ``tflops``,
  ``throughput``, ``value``, ``y``), bare or with a unit word (``busbw_gbps``); otherwise every other
  numeric field, one figure per unit, skipping times (``time*``, ``*_us``/``_ms``/``_s``), sizes
  (``*bytes``, ``*_size``) and counts (``copies``, ``repeats``, ``rank``...).
- Units come from words in field names (``UNIT_TOKENS``: ``_gbps`` GB/s, ``_tbps`` TB/s, ``_tflops``,
  ``_us``...) or from ``"units": {"size": "B", "busbw": "GB/s"}``. Byte-valued x get a log-2 axis.
- Name several curves under ``"curves"``: ``{"node 0 (8 ranks)": [points], "whole job": [points]}``
  (or a list of ``{"name": str, "points": [points]}``); any other key holding a point list is one
  curve named after the key.
- busbw curves of every test are also drawn together, one figure per ``details["scope"]``, one colour
  per ``details["collective"]`` (else the test's parameters) and one line per curve name (node, group).

Matrices (GPU pairs, node pairs): ``{"values": 2-D list, "labels" | "row_labels"/"col_labels",
"unit", "title"}`` under any key, ``null`` for a missing cell (the diagonal)::

    "matrix": {"labels": ["gpu0", "gpu1"], "values": [[null, 48.1], [47.9, null]], "unit": "GB/s"}

Under a key naming a matrix (``matrix``, ``matrices``, ``*matrix*``) a bare 2-D list, or a mapping of
name to matrix (``{"node 0": [[...]], "node 1": [[...]]}``), is drawn too, one heatmap each.

Loss curves: a key containing ``loss`` whose value is a list of numbers (one per step), a list of
``{"step": int, "loss": float}``, or ``{"steps": [...], "values": [...]}``; several under
``"losses": {"rank 0": [...], "eval": [...]}``. All of a test's losses share one figure.

Tables: ``"tables": {"clocks": [{"gpu": 0, "sm_mhz": 1980, "throttle": "none"}, ...]}`` is shown as
HTML tables in the test's row.

Per-GPU bars need no details: they are drawn from every gpu-scope metric's ``per_rank`` values.
"""

from __future__ import annotations

X_FIELDS = ("size", "bytes", "size_bytes", "message_bytes", "step", "n", "x")
"""Fields a curve's points may use as x, in order of preference."""

BYTE_FIELDS = ("size", "bytes", "size_bytes", "message_bytes")
"""x fields that count bytes (drawn on a log-2 axis with binary-prefixed ticks)."""

Y_PREFERRED = ("busbw", "bandwidth", "tflops", "throughput", "value", "y")
"""Fields a curve's points may use as y, in order of preference."""

TIME_FIELDS = ("time", "time_s", "time_us", "time_ms", "seconds", "duration", "duration_s")
"""Numeric fields never drawn as y when falling back to every numeric field (nor any ``time*`` field,
nor one whose unit is s, ms or us)."""

COUNT_FIELDS = ("copies", "count", "repeats", "rank", "round", "ranks", "iterations", "n", "step")
"""Numeric fields that count things: never drawn as y (nor any ``*bytes`` or ``*_size`` field)."""

UNIT_TOKENS = {"gbps": "GB/s", "tbps": "TB/s", "mbps": "MB/s", "gbits": "Gb/s", "tflops": "TFLOPS",
               "gflops": "GFLOPS", "us": "us", "ms": "ms", "s": "s", "gib": "GiB", "mib": "MiB", "mhz": "MHz",
               "w": "W", "pct": "%"}
"""Unit words in field names (``busbw_gbps``, ``copy_tbps``, ``gbps_min``): the axis unit, and
``busbw_gbps`` counts as ``busbw`` for the preferred-y rule."""
