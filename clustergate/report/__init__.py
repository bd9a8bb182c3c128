"""The sign-off report: what results.json says, drawn (HTML, terminal summary, junit.xml, metrics.prom).
It works on the results dict alone and decides nothing: the verdict and any re-judgement come made.
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
