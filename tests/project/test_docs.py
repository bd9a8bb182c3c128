"""The README and the pages it links: every link and anchor resolves, and the set-up commands are the ones CI runs.

Pure reading of the Markdown files (no run): a relative link names a file of the checkout, an anchor names a
heading of its page as GitHub makes anchors, and a reference-style link has its definition.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "launch" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(page: Path) -> str:
    """The page without its fenced code blocks (a link or a heading inside one is not one)."""
    return FENCE.sub("", page.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces
    become hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading's gets -1, -2, ... as GitHub numbers it."""
    found: set[str] = set()
    for m in re.finditer(r"^#{1,6} (.+)$", prose(page), re.M):
        base = slug(m[1])
        n = 0
        while (name := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(name)
    return found


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"`[^`]*`", "", prose(page))  # code spans: `x["a"]["b"]` is no link
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        name, _, anchor = target.partition("#")
        dest = (page.parent / name).resolve() if name else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading of {dest.name} has the anchor #{anchor}")
    defined = set(re.findall(r"^\[([^\]]+)\]: \S+", text, re.M))
    broken += [f"[...][{label}]: no definition" for label in re.findall(r"\]\[([^\]]+)\]", text)
               if label not in defined]
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_and_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Its `second` part\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[a](other.md#its-second-part) [b](#page) [c](other.md#nothing) [d](gone.md)"
                    " [e](#none) [f][defined] [g][undefined]\n\n[defined]: https://example.org\n"
                    "```\n[h](inside-code.md)\n```\n")
    assert broken_links(page) == ["other.md#nothing: no heading of other.md has the anchor #nothing",
                                  f"gone.md: no file {tmp_path / 'gone.md'}",
                                  "#none: no heading of page.md has the anchor #none",
                                  "[...][undefined]: no definition"]


def setup_commands() -> list[str]:
    """The commands of the README's "Set-up: two commands" section (its indented lines)."""
    section = (ROOT / "README.md").read_text().split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip()]


def test_the_readme_set_up_commands_are_the_ones_ci_runs() -> None:
    """CI installs torch and the test extra (a superset of the plain install) quietly, then runs the suite and its
    tests as the README writes them."""
    ci = (ROOT / ".ci" / "run").read_text()
    acceptance, own_tests = setup_commands()[:2]
    assert acceptance.endswith(" && clustergate run")
    assert own_tests.endswith("python3 -m pytest tests -n 2")
    assert acceptance.startswith("python3 -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    for part in [acceptance.split(" && ")[0], acceptance.split(" && ")[-1], *own_tests.split(" && ")]:
        assert part.replace("pip install ", "pip install -q ") in ci or part in ci, part


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "launch" / "README.md",
                                  ROOT / "docs" / "cluster-signoff.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_kubernetes_job_one_liner_says_the_reports_volume_first(page: Path) -> None:
    """Every Job the launcher renders mounts the reports claim (launch/k8s/reports-pvc.yaml): a section that renders
    one (`render.sh | kubectl apply`) says before it how that claim is made, or its pods wait for it forever."""
    sections = re.split(r"^#{2,3} ", page.read_text(), flags=re.M)
    for text in sections:
        flat = " ".join(text.split())
        jobs = [m.start() for m in re.finditer(r"render\.sh \| kubectl apply", flat)]
        if jobs:
            volume = flat.find("render.sh reports-pvc.yaml | kubectl apply")
            assert 0 <= volume < jobs[0], text[:300]


def test_the_readme_says_which_excluded_hosts_get_an_evidence_archive() -> None:
    """One archive per excluded host that left a node directory; a host with none gets none, and its line says what
    merge's own reason says (test_cluster_merge holds the merge to it: no evidence for a host without a result)."""
    from clustergate.cluster.node_runs import missing_node

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "one archive for a vendor ticket per excluded host that left a node directory" in readme
    assert "has no archive" in readme and "says `expected, but no result` and why" in readme
    assert missing_node("gpu009").reasons[0].startswith("expected, but no result: ")
