"""``python -m clustergate.report``: the same as ``clustergate render`` (``merge`` and ``signoff`` as first
argument: ``clustergate merge`` and ``clustergate signoff``), kept so that older scripts still work."""

from __future__ import annotations

import sys

from clustergate.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(main(argv if argv[:1] in (["merge"], ["signoff"]) else ["render", *argv]))
