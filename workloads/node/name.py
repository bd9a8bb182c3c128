"""The name a node goes by in every report, result and message (standard library only).

Usually the host name. Where several nodes share one host name (Slurm's multiple-slurmd test
clusters, containers started with a fixed host name, the suite's own multi-node rehearsals on one
machine) the scheduler's name for the node tells them apart; a launcher or user can also give it.

A node name is an identity, not text: it names a report directory (REPORTS/RUN_ID/nodes/NAME), a line
of accepted-hosts.txt and a Slurm hostlist entry. ``problem`` is the one rule for what a name may be,
checked when a run starts and again wherever a stored name is read back (merge, sign-off).
"""

from __future__ import annotations

import os
import socket
import unicodedata

NODE_NAME_VARIABLES = ("CLUSTERGATE_NODE_NAME", "SLURMD_NODENAME")
"""Consulted in this order before the host name: set by the user or launcher, then by slurmd for every task."""
MAX_LENGTH = 253
"""The longest DNS name: no host is called anything longer."""


class NodeNameError(ValueError):
    """This node's name cannot be used; the message names where it came from and what to do."""


_LOOK_ALIKE = ("each \\u escape is a character outside ASCII, which can look like an ASCII one in every message, as "
               "a Cyrillic \\u0440 does a Latin p")


def not_ascii(name: str) -> str | None:
    """Why a host name (or a host list) that is not ASCII cannot be used; None where it is ASCII. Every message
    would show a look-alike (``gрu001``, a Cyrillic 'р') as the real host, so it is refused wherever a host name
    enters (this node's name, ``--expect-hosts``, host list files, a stored result's host), named as ``ascii()``
    writes it (``'g\\u0440u001'``)."""
    if name.isascii():
        return None
    return f"host name {ascii(name)} is not ASCII ({_LOOK_ALIKE}): write the host's name in ASCII"


def problem(name: str) -> str | None:
    """Why ``name`` cannot be a node's name (None when it can): empty, too long, whitespace or other control
    or invisible characters, a character outside ASCII (``not_ascii``), a path separator, or a name that is a path
    step (``.``, ``..``)."""
    if not name:
        return "it is empty"
    if len(name) > MAX_LENGTH:
        return f"it is {len(name)} characters long (at most {MAX_LENGTH})"
    odd = next((c for c in name if c.isspace() or unicodedata.category(c)[0] in "CZ"), None)
    if odd is not None:
        return f"it contains {odd!r} (whitespace, control and invisible characters are not allowed)"
    if not name.isascii():
        return f"it is not ASCII ({_LOOK_ALIKE})"
    if "/" in name or "\\" in name:
        return "it contains a path separator"
    if name in (".", "..") or name.startswith("-"):
        return "it is a path step or starts with '-'"
    return None


def node_name() -> str:
    """This node's name: $CLUSTERGATE_NODE_NAME, else Slurm's $SLURMD_NODENAME, else the host name.
    NodeNameError when the name found is not one ``problem`` allows."""
    for variable in NODE_NAME_VARIABLES:
        value = os.environ.get(variable, "")
        if value.strip():
            where = f"${variable}"
            break
    else:
        value, where = socket.gethostname(), "the host name"
    if why := problem(value):
        raise NodeNameError(f"node name {ascii(value)} from {where}: {why}; set CLUSTERGATE_NODE_NAME to this node's "
                            "name as the scheduler knows it (letters, digits, '.', '-', '_')")
    return value
