"""A run's record and the verdict it supports: results.json, its files, the report directory and the one rule of
the verdict. It runs nothing and draws nothing; the run, the cluster commands, the report and the store read it.
"""
