"""clustergate: a pytest-based acceptance suite for GPU clusters."""

__version__ = "0.1.0"
