"""``python -m clustergate.health``: the same as ``clustergate health`` (clustergate.health.command)."""

from __future__ import annotations

import sys

from clustergate.health.command import main

if __name__ == "__main__":
    sys.exit(main())
