"""``import pynvml`` in a subprocess the suite's tests start: NVML on a made-up node (tests/helpers/fake_pynvml.py's
``FakeNode``), described by the JSON file $CLUSTERGATE_FAKE_NVML names. The test puts this directory first on
PYTHONPATH; nothing outside the suite's own tests ever sees it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_pynvml import NVMLError, node_from  # noqa: E402

_NODE = node_from(json.loads(Path(os.environ["CLUSTERGATE_FAKE_NVML"]).read_text()))
NVML_NVLINK_MAX_LINKS = 18
nvmlEventTypeXidCriticalError = 0x8
c_nvmlGpuFabricInfoV_t = _NODE.c_nvmlGpuFabricInfoV_t
__all__ = ["NVMLError"]


def __getattr__(name: str) -> Any:
    return getattr(_NODE, name)
