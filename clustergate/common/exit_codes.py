"""The one exit-status table of every clustergate command: the run on every rank, ``clustergate run``,
``health``, ``merge``, ``signoff``, ``render``, ``calibrate``, ``list`` and the launchers.

A gate needs one rule: 0 is the only status that means accepted. pytest's own 3 (internal error) and 5 (no
tests collected) never leave a clustergate command; they are mapped onto this table where they arise.
"""

from __future__ import annotations

import errno
from enum import IntEnum


class Exit(IntEnum):
    ACCEPT = 0
    """Accepted (a run, a merge, a sign-off), written (calibrate), healthy (health), or a listing printed."""
    NOT_ACCEPTED = 1
    """The work ran and its verdict is not accept: reject, partial, unjudged, or a run that ended early."""
    USAGE = 2
    """Usage or unusable input: a bad option, a thresholds file or results.json that cannot be used."""
    COULD_NOT_RUN = 4
    """The work could not run at all: no rendezvous, no report directory, a launcher that could not start."""


TABLE = {Exit.ACCEPT: "accept", Exit.NOT_ACCEPTED: "not accepted", Exit.USAGE: "usage or unusable input",
         Exit.COULD_NOT_RUN: "could not run"}
"""What each status means, as the README and every --help say it."""


COULD_NOT_WRITE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG})
"""OSErrors of the machine, not of the command line: a full disk, a quota, a failing device, a file size limit."""


def refused(exc: BaseException) -> Exit:
    """The status of a command its input refused with ``exc``: 4 (could not run) for an OSError of the machine
    (``COULD_NOT_WRITE``: ``merge -o`` onto a full disk), else 2 (usage or unusable input: a path given that is
    missing, a directory or not permitted, a bad file)."""
    return Exit.COULD_NOT_RUN if isinstance(exc, OSError) and exc.errno in COULD_NOT_WRITE else Exit.USAGE
