"""The acceptance suite's shape: every test file has its place in the run order."""

from __future__ import annotations

from pathlib import Path

from acceptance.conftest import RUN_ORDER

ACCEPTANCE = Path(__file__).resolve().parent.parent / "acceptance"


def test_every_acceptance_file_is_in_the_run_order_and_nothing_else() -> None:
    files = sorted(p.stem for p in ACCEPTANCE.glob("test_*.py"))
    assert sorted(RUN_ORDER) == files, (
        f"acceptance/conftest.py RUN_ORDER lists {sorted(RUN_ORDER)}, the files are {files}: add a new file where "
        "it belongs (cheapest and most basic first)")
    assert len(set(RUN_ORDER)) == len(RUN_ORDER)
