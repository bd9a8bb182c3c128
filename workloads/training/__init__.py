"""Workloads: GPT training throughput and MFU, scaling, sampler, checkpoint round trip."""
