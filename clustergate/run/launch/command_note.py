"""What rank 0 tells the command that launched it (``clustergate run``): where the outputs are, and the exit
status where the run decided one before any test (a usage error, a run that could not start).

A file named by ``$CLUSTERGATE_RUN_OUTCOME`` (JSON, rewritten whole): ``{"report_dir": str | null,
"status": int | null, "error": str, "rank": int}`` (the rank that told it last). ``clustergate run`` reads
results.json there to print its one-line verdict last, tells a run that could not start (status 4) from pytest
refusing its arguments (also 4, pytest's own) by it, and says another rank's error, which reached no terminal.
Without the variable (torchrun or pytest run by hand) nothing is written.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from clustergate.common import inputfile

OUTCOME_ENV = "CLUSTERGATE_RUN_OUTCOME"


def tell(*, any_rank: bool = False, **fields: Any) -> None:
    """Rank 0: add ``fields`` (report_dir, status) to the outcome file, where a launcher asked for one. With
    ``any_rank`` another rank of the node tells a status too, where none was told yet (a run that could not start
    because rank 0 never came: rank 0 says nothing then); rank 0's word stands over it."""
    path = os.environ.get(OUTCOME_ENV)
    leader = os.environ.get("RANK", "0") == "0"
    if not path or not (leader or any_rank):
        return
    told = read(Path(path))
    if not leader and told.get("status") is not None:
        return
    told.update({k: str(v) if isinstance(v, Path) else v for k, v in fields.items()})
    told["rank"] = int(os.environ.get("RANK", "0"))  # who told it: another rank's words reached no terminal
    temporary = Path(f"{path}.{os.getpid()}")
    with contextlib.suppress(OSError):  # the launcher then says what it can without it
        temporary.write_text(json.dumps(told))
        os.replace(temporary, path)  # whole, where two ranks tell at once


def read(path: Path) -> dict[str, Any]:
    """What rank 0 told (nothing, where it told nothing)."""
    try:
        told = json.loads(inputfile.read_text(path, "outcome"))
    except (OSError, ValueError):
        return {}
    return told if isinstance(told, dict) else {}
