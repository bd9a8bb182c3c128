"""``clustergate health``: a node's state from NVML and sysfs alone, in seconds, judged by the run's profile.

No torch, no CUDA context, no torchrun: made to gate every job (a Slurm Prolog or HealthCheckProgram, a
Kubernetes DaemonSet). It reads (``read``) the GPUs through NVML, and the kernel log, InfiniBand ports, PCI
devices and host settings from /proc, /sys and /dev under ``$CLUSTERGATE_HOST_ROOT`` (default /); it judges
(``checks``) with the rules the acceptance suite's own tests use (workloads.gpu.health, workloads.gpu.processes,
clustergate.criteria.expect, clustergate.record.judge, workloads.node.checks) against the same thresholds.yaml profile,
chosen as a run chooses it (workloads.node.gpu_presence: a GPU node whose driver is broken fails, never passes as a
machine without GPUs). ``command`` is the command line: one line per failure, ``--json``, exit statuses from
clustergate.common.exit_codes.

What it cannot see without load is left to the run: the PCIe link is judged by the most it can reach (an idle
link trains its speed down), nothing is measured (TFLOPS, bandwidth, NCCL), and NCCL's version and its use of
GPUDirect RDMA are the run's to check.
"""
