import json
import os
from pathlib import Path


def test_results_say_running_while_the_run_runs() -> None:
    if os.environ["RANK"] == "0":
        res = json.loads((Path("report") / "results.json").read_text())
        assert res["verdict"] == "running" and res["reason"] is None and res["world_size"] == 2
        assert res["selection"] == {"k": "running", "m": None, "level": "quick", "selected": 1, "deselected": 1,
                                    "multinode": 0, "multinode_deselected": 0, "suite": ".",
                                    "args": ["test_fault.py"], "deselect": [], "modes": [], "maxfail": 0}


def test_deselected() -> None:
    pass
