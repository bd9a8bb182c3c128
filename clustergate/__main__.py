"""``python -m clustergate``: the ``clustergate`` command (clustergate.cli)."""

from __future__ import annotations

from clustergate.cli import command

if __name__ == "__main__":
    command()
