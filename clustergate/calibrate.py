"""``python -m clustergate.calibrate``: ``clustergate calibrate``, kept so that older scripts still work."""

from __future__ import annotations

import sys

from clustergate.cluster.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
