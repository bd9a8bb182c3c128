"""The report's HTML at its smallest: an escaped text, a table cell, a table. Every page the report draws builds on
these (``html``, ``support``, ``merge_html``): one escaping rule for all of them."""

from __future__ import annotations

from html import escape
from typing import Any


def esc(value: Any) -> str:
    """``value`` as HTML text: every character that means markup escaped."""
    return escape(str(value))


def table(columns: list[str], rows: list[list[str]], cls: str = "cg-table",
          row_classes: list[str] | None = None) -> str:
    """A table of ``rows`` (each a list of ``cell`` strings) under ``columns``, in a box that scrolls sideways."""
    # <wbr> after underscores lets long metric names wrap in a header instead of widening the table.
    head = "".join(f"<th>{esc(c).replace('_', '_<wbr>')}</th>" for c in columns)
    body = "".join(
        f'<tr class="{row_classes[i] if row_classes else ""}">{"".join(r)}</tr>' for i, r in enumerate(rows))
    inner = f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    return f'<div class="cg-scroll">{inner}</div>'


def cell(text: str, cls: str = "", title: str = "") -> str:
    """A table cell: ``text`` escaped, with a class and a title (shown on hover) where given."""
    attrs = (f' class="{cls}"' if cls else "") + (f' title="{esc(title)}"' if title else "")
    return f"<td{attrs}>{esc(text)}</td>"
