"""Measurement code, one module per workload; no pytest here. Each runs alone: torchrun -m workloads.NAME."""
