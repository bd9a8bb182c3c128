"""``clustergate health``: a node's state from NVML and sysfs alone, in seconds, judged by the run's profile.
No torch, no CUDA context, no torchrun; nothing is measured under load (that is the run's).
"""
