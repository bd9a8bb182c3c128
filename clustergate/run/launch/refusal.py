"""A run refused before its first test, said once: a bad option or input (exit status 2) or a run that could not
start (4).

Every rank comes to the same refusal in the same words: the command line is the same on every rank, and each
check of the start reaches every rank (``clustergate.run.startup``). Printed by each, the line came once per rank,
then torchrun's summary of the failed ranks with "<N/A>" for the cause. So one rank says it:

- on the terminal, first, as pytest prints a usage error: the job's first rank prints it (pytest without torchrun,
  plain torchrun, and ``clustergate run``, whose agent runs inside the command, which shows rank 0's output and ends
  with its own line).
- under torchrun's agent, in torchrun's own summary too: the node's first rank writes ``ERROR: <why>`` into its
  error file (``clustergate.run.launch.errorfile``); torchrun shows that line as the root cause, with the run's own exit
  status (torchrun itself exits 1, whatever it is), at the end of its report. The node's other ranks wait for
  torchrun's SIGTERM, so the rank that said it fails first.

The standard library only, as ``clustergate.run.launch.errorfile``: ``clustergate.optin`` refuses through it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from typing import NoReturn

from clustergate.run.launch import command_note, errorfile
from clustergate.run.limits import AGENT_STOP_S


def said(message: str, note: str | None = None) -> str:
    """The refusal as pytest says a usage error, with the note an error must end with (``startup.stale_note``)."""
    return f"ERROR: {message}" + (f"\n{note}" if note else "")


def tell(text: str, status: int, *, missing: Collection[int] = ()) -> None:
    """Say ``text`` (``said``) once for the whole job; ``missing``: ranks that never came to the start (one of them
    cannot say it). A launcher that asked (``clustergate run``) is told the status too. On a rank that leaves it to
    another, this returns once torchrun has not stopped it within AGENT_STOP_S."""
    from clustergate.secrets.redact import Scrubber  # here: loaded only to say a refusal (clustergate.optin's budget)

    text = Scrubber.from_environment()(text)  # the terminal and torchrun's summary are outputs like any other
    place = errorfile.Place.from_env()
    command_note.tell(status=int(status), error=text.removeprefix("ERROR: "), any_rank=True)
    if place.first_of_job(missing):
        # First, on the terminal: under plain torchrun its summary says the line again as the root cause, but last,
        # at the end of a 34-72-line report of torchrun's own; a first-day user reads the top.
        sys.stderr.write(f"{text}\n\n")
        sys.stderr.flush()
    if place.first_of_node(missing):
        errorfile.write(text)
        return
    errorfile.wait_for_the_agent(AGENT_STOP_S)
    errorfile.write(text)  # its node's first rank did not leave: this rank's failure must say why


def leave(text: str, status: int) -> NoReturn:
    """``tell``, then end the process with ``status`` at once: a refusal found before pytest has anything to undo."""
    tell(text, status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(status))
