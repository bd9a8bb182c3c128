"""The name a node goes by in every report, result and message (standard library only).

Usually the host name. Where several nodes share one host name (Slurm's multiple-slurmd test
clusters, containers started with a fixed host name, the suite's own multi-node rehearsals on one
machine) the scheduler's name for the node tells them apart; a launcher or user can also give it.
"""

from __future__ import annotations

import os
import socket

NODE_NAME_VARIABLES = ("CLUSTERGATE_NODE_NAME", "SLURMD_NODENAME")
"""Consulted in this order before the host name: set by the user or launcher, then by slurmd for every task."""


def node_name() -> str:
    """This node's name: $CLUSTERGATE_NODE_NAME, else Slurm's $SLURMD_NODENAME, else the host name."""
    for variable in NODE_NAME_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    return socket.gethostname()
