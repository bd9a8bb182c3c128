"""The cell texts of a table on a page the suite draws, for tests that read a page as a person would."""

from __future__ import annotations

from html.parser import HTMLParser


class Rows(HTMLParser):
    """Each row's cell texts (the header row first) inside the first element ``tag`` whose ``attr`` names ``value``
    (an id, or one of its classes)."""

    def __init__(self, tag: str, attr: str, value: str) -> None:
        super().__init__()
        self.tag, self.attr, self.value, self.depth = tag, attr, value, 0
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == self.tag:
            named = self.value in (dict(attrs).get(self.attr) or "").split()
            self.depth += 1 if self.depth or named else 0
        elif self.depth and tag == "tr":
            self.rows.append([])
        elif self.depth and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == self.tag and self.depth:
            self.depth -= 1
        elif tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def rows(page: str, tag: str, attr: str, value: str) -> list[list[str]]:
    """The rows of the table in ``<tag attr=value>`` of ``page``: ``rows(page, "div", "id", "cg-criteria")``,
    ``rows(page, "table", "class", "cg-identity")``."""
    parser = Rows(tag, attr, value)
    parser.feed(page)
    return parser.rows
