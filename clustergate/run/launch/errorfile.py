"""What torchrun's failure summary says of a rank: the rank's error file, and which rank of a node writes it.

torchrun's agent names a file for each rank it starts (``TORCHELASTIC_ERROR_FILE``) and, once a rank has failed,
stops the others and raises its summary (``ChildFailedError``: each failed rank with its exit status and that file's
words, the earliest failure as the "Root Cause"). A rank that wrote none is shown as ``error_file: <N/A>`` with a
link to torch's documentation. The words are written here in the shape torch's own
``ErrorHandler.record_exception`` writes them, ``{"message": {"message": ..., "extraInfo": {"py_callstack": ...,
"timestamp": ...}}}``; the summary prints ``py_callstack`` (indented), so that is the line itself, not a traceback.

Every rank of a node comes to the same words; one of them says them: the node's first rank present (local rank 0,
unless it never came). The node's other ranks wait for the agent's SIGTERM, which follows at once that rank's exit:
torchrun takes the earliest failure for the root cause, so a rank with nothing more to say must not exit first.
The standard library only: ``clustergate.optin``, loaded in every pytest run, uses it before any torch import.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Set by torchrun's agent for each rank it starts (empty where its logs go to /dev/null: no file then)."""


def path() -> str | None:
    """This rank's error file, where a torchrun agent named one."""
    return os.environ.get(ERROR_FILE_ENV) or None


def write(text: str) -> bool:
    """``text`` as this rank's error file (whole: written aside, then renamed); False where there is none or it cannot
    be written (the agent then says "<N/A>", as it would have)."""
    target = path()
    if target is None:
        return False
    data = {"message": {"message": text, "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}
    aside = f"{target}.{os.getpid()}"
    try:
        with open(aside, "w") as f:
            json.dump(data, f)
        os.replace(aside, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(aside)
        return False
    return True


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:  # the run itself names a malformed variable; here it only decides who speaks
        return default


@dataclass(frozen=True)
class Place:
    """This rank's place in the job, as torchrun's variables say it (one rank without torchrun)."""

    rank: int
    local_rank: int
    local_world_size: int
    world_size: int

    @classmethod
    def from_env(cls) -> Place:
        return cls(rank=_env_int("RANK", 0), local_rank=_env_int("LOCAL_RANK", 0),
                   local_world_size=_env_int("LOCAL_WORLD_SIZE", 1), world_size=_env_int("WORLD_SIZE", 1))

    def first_of_job(self, missing: Collection[int] = ()) -> bool:
        """This rank is the job's first rank present (rank 0, unless it never came)."""
        return self.rank == min((r for r in range(self.world_size) if r not in missing), default=self.rank)

    def first_of_node(self, missing: Collection[int] = ()) -> bool:
        """This rank is its node's first rank present: torchrun numbers a node's ranks in a row, from
        ``rank - local_rank``."""
        base = self.rank - self.local_rank
        node = range(base, base + max(self.local_world_size, 1))
        return self.rank == min((r for r in node if r not in missing), default=self.rank)


def wait_for_the_agent(seconds: float) -> None:
    """Wait up to ``seconds`` for the agent's SIGTERM, which ends this process here (by its default action: this
    rank's record is final, nothing is left to say); then go on, to leave on one's own. A Ctrl-C meanwhile ends it
    alike. Main thread only (``signal.signal``)."""
    if path() is None:
        return  # no agent reads an error file: nobody's failure is taken for the cause
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
