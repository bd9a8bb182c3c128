"""The parent-death signal (Linux's prctl PR_SET_PDEATHSIG): a process the kernel signals when its parent ends.

A rank follows its torchrun agent with it (``clustergate.run.interrupts``), and a node's preflight its
``launch/node.sh`` (``launch/preflight.py``). The rank's keeper keeps a copy of its own: it runs with the standard
library only (``python -I -S``).
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal this process gets when its parent ends."""


def die_with_parent(signum: int) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies. Linux only; False where it cannot be
    set. The request covers a parent still alive when it is made: a caller that must know reads ``os.getppid()``
    before and after."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
