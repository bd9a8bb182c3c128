"""Workloads: NCCL collectives, GPU pairs, the transport NCCL chose and its log."""
