"""How a number reads wherever a person reads it: failure lines, the terminal summary, the reports, merge and
sign-off, the health check, the store's history, ``clustergate list``.

One rule for every text, so that the figure a failure line names is the figure the report's table shows
(a reader compares them character by character when a node is rejected).
"""

from __future__ import annotations

import math


def number(value: float | None, unit: str = "") -> str:
    """``value`` to four significant digits, as a whole number from 10^4 up (``12346``, never ``1.235e+04``),
    then ``unit``; empty for None. Small figures keep their exponent (``1.5e-05``): that is what they are."""
    if value is None:
        return ""
    value = float(value)
    text = f"{value:.4g}"
    if math.isfinite(value) and "e+" in text:
        text = f"{value:.0f}"
    return f"{text} {unit}".strip() if unit else text


def percent(fraction: float | None, signed: bool = False) -> str:
    """A fraction as a percentage with one decimal, none where it is whole (``0.9`` -> ``90%``, ``0.1234`` ->
    ``12.3%``), a whole number from 1000% up; ``signed``: ``+5%`` / ``-10.5%`` (a change or a margin)."""
    if fraction is None:
        return ""
    value = float(fraction) * 100
    digits = 0 if abs(value) >= 1000 or round(value, 1) == round(value) else 1
    return f"{value:{'+' if signed else ''}.{digits}f}%"


def yaml_text_number(value: object) -> str:
    """Where ``value`` is text that Python reads as a finite number but YAML 1.1 (PyYAML) does not (``1e308``,
    ``5e-3``: YAML 1.1's floats need a dot and a signed exponent), what to write instead, as the end of an error
    (``; YAML 1.1 reads `1e308` as text: write `1.0e+308```); else empty."""
    if not isinstance(value, str):
        return ""
    try:
        parsed = float(value)
    except ValueError:
        return ""
    if not math.isfinite(parsed):
        return ""
    mantissa, e, exponent = repr(parsed).partition("e")
    if e and "." not in mantissa:
        mantissa += ".0"
    return f"; YAML 1.1 reads `{value}` as text: write `{mantissa}{e}{exponent}`"
