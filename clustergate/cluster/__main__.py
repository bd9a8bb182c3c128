"""The cluster commands (``clustergate merge``, ``signoff``, ``calibrate``), each with its --help; ``python -m
clustergate.cluster NAME`` still runs them for older scripts."""

from __future__ import annotations

import sys
from collections.abc import Callable

COMMANDS = ("merge", "signoff", "calibrate")


def command(name: str) -> Callable[[list[str]], int]:
    """A cluster command's entry point, imported only when asked for."""
    if name == "merge":
        from clustergate.cluster.merge import main
    elif name == "signoff":
        from clustergate.cluster.signoff import main
    elif name == "calibrate":
        from clustergate.cluster.calibrate import main
    else:
        raise KeyError(name)
    return main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: clustergate {{{','.join(COMMANDS)}}} ... (each has --help)", file=sys.stderr)
        return 2
    return int(command(argv[0])(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
