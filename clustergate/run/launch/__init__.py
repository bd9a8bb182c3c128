"""The launcher's side of a run: ``clustergate run``, what rank 0 tells it, the command line checked before pytest
reads it, a run refused before its first test, and torchrun's error file. Beside ``run.limits`` it imports nothing of
the run: not the ranks, hang detection, the plugin or the lifecycle (pytest's switch loads it before any torch).
"""
