"""Workloads: the node itself: discovery, node consistency, shared filesystem."""
