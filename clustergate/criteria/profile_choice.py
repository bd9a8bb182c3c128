"""Which profile of a thresholds file judges this node: one rule for ``clustergate run`` (every rank of a run),
``clustergate health`` and ``clustergate list``.

1. ``--profile NAME``: that profile;
2. else, of the profiles whose ``match`` names this node's GPU model, as NVML names it (a run also asks CUDA where
   NVML cannot say: a container given the driver's compute libraries only), the one for the node's shape: its
   ``gpus_per_node`` is the node's GPU count (``NvidiaDevices.shape_gpus``: the site's ``CLUSTERGATE_GPUS_PER_NODE``,
   else the GPUs this process may use, else NVML's); where no profile has that count, the model's first (8 GPUs),
   whose GPU count criterion then fails (``Thresholds.select``);
3. else, on a GPU node (an NVIDIA device on the bus, or ``CLUSTERGATE_GPUS_PER_NODE`` above 0:
   ``workloads.node.gpu_presence``), the file's ``fallback_profile``: a GPU node is never judged as a CPU machine;
4. else the file's ``cpu_profile``.
"""

from __future__ import annotations

from collections.abc import Callable

from clustergate.criteria.thresholds import Profile, Thresholds
from workloads.node.gpu_presence import NvidiaDevices


def nvml_model(found: NvidiaDevices) -> str | None:
    """The GPU model as NVML names it; None where NVML lists no GPU."""
    return found.model


def choose_profile(thresholds: Thresholds, named: str | None, found: NvidiaDevices,
                   model_of: Callable[[NvidiaDevices], str | None] = nvml_model,
                   visible: int | None = None) -> Profile:
    """The profile that judges the node ``found`` describes (the module's rule). ``model_of`` reads the GPU model,
    asked only where no profile is named; ``visible``: the GPUs this process may use (a run's CUDA count; None where
    only NVML is asked). ThresholdsError for a named profile the file lacks."""
    if named:
        return thresholds.profile(named)
    return thresholds.select(model_of(found), gpu_node=found.present, gpus=found.shape_gpus(visible))
