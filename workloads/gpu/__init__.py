"""Workloads: per-GPU hardware: NVML inventory and health, matmul, HBM, host link, burn-in."""
