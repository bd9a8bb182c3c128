"""A node's report.html stands alone: what judged the run (the same identity block as the sign-off page), a table of
what was skipped and why in place of pytest-html's box per skipped test, and no absolute path of the machine.

Read from the shared real node run (README's command 1: ``trust_runs.node_run``); no torchrun job of its own.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import page_rows
from trust_runs import node_run  # noqa: F401  (the fixture)

import clustergate
from clustergate.record.results import short_test_name
from clustergate.report import model
from clustergate.report.places import Unplaced
from clustergate.trust.suitefiles import suite_root

from torchrun_job import ROOT


def rows(page: str, cls: str) -> list[list[str]]:
    return page_rows.rows(page, "table", "class", cls)


def test_the_report_says_what_judged_the_run(node_run: Path) -> None:  # noqa: F811
    results = json.loads((node_run / "results.json").read_text())
    page = (node_run / "report.html").read_text()
    said = dict(rows(page, "cg-identity"))
    assert said == {"clustergate": clustergate.__version__,
                    "profile": f"cpu (digest {results['clustergate']['thresholds_digest']})",
                    "thresholds": "thresholds.yaml", "suite": results["attestation"]["suite_digest"],
                    "run id": "run-trust", "level": "standard", "site key": "none: the records carry no HMAC"}
    assert said["suite"].startswith("sha256:") and results["clustergate"]["signed"] is False
    assert list(said.items()) == model.run_identity(results)  # the sign-off page's block, of the same words


def test_skips_are_a_table_of_reasons_and_no_path_of_the_machine_is_shown(node_run: Path) -> None:  # noqa: F811
    results = json.loads((node_run / "results.json").read_text())
    page = (node_run / "report.html").read_text()
    skipped = [t for t in results["tests"] if t["outcome"] == "skipped"]
    assert len(skipped) > 20
    head, *table = rows(page, "cg-skipped")
    assert head == ["why", "recorded fact", "tests", "skipped"]
    shown = {(why, fact): names.split(", ") for why, fact, _count, names in table}
    for t in skipped:  # every skipped test under its own reason and recorded fact
        fact = t["skip_fact"]["fact"]
        names = [n for (why, said), group in shown.items() if why == t["message"] and said.split(":")[0] == fact
                 for n in group]
        assert short_test_name(t["nodeid"]) in names, t["nodeid"]
    assert sum(int(count) for _w, _f, count, _n in table) == len(skipped)
    # pytest-html's box per skipped test is gone: its data (the page's JSON) holds no row of a skipped test.
    blob = re.search(r'data-jsonblob="([^"]*)"', page)
    assert blob is not None
    drawn = json.loads(html.unescape(blob.group(1)))["tests"]
    assert [t["nodeid"] for t in skipped if drawn.get(t["nodeid"])] == []
    assert len([n for n, shown in drawn.items() if shown]) == len(results["tests"]) - len(skipped)
    for place in {str(node_run), str(node_run.resolve()), str(ROOT), str(ROOT.resolve()), str(Path.home()),
                  str(Path.cwd())}:
        assert place not in page, place


def test_a_traceback_s_paths_read_relative(tmp_path: Path) -> None:
    """What the report's logs, metadata and summary go through (``report.places``): a file of the suite reads as the
    suite names it, the report directory as ``.``, the home directory as ``~``; a name that only begins like a root
    is left alone."""
    unplaced = Unplaced(tmp_path / "report")
    root, home = suite_root(), Path.home()
    assert unplaced(f'File "{root}/acceptance/test_node.py", line 3') == 'File "acceptance/test_node.py", line 3'
    assert unplaced(f"see {tmp_path / 'report' / 'results.json'}; {tmp_path / 'report'}") == "see ./results.json; ."
    assert unplaced(f"{home}/.cache/x and {home}") == "~/.cache/x and ~"
    assert unplaced(f"{home}fs/x") == f"{home}fs/x"
    assert unplaced.of({f"{root}/a": [f"{root}/b", 3]}) == {"a": ["b", 3]}
