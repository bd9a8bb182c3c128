"""Decisions about a cluster of nodes (merge, sign-off, calibration), taken from the runs' results.json files.
It never runs a test, and draws nothing: ``clustergate.report`` draws the dicts it writes.
"""
