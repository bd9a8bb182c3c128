"""Decisions about a cluster of nodes, taken from the runs' results.json files.

- ``merge`` (with ``node_runs``: one node's directory read and judged, ``binding``: which node files are
  this cluster run's parts, ``node_facts``: what is kept of a node file past its read, and ``fleet``: every GPU
  set against the fleet's median) turns the node
  phase's directories into one cluster results.json and the accepted/excluded host lists;
- ``signoff`` takes the merge and the fabric phase's run to the final accepted set;
- ``hostlist``: Slurm's hostlist form, both ways;
- ``calibrate`` (with ``calibration_samples``) writes a site profile from finished runs.

These modules decide; ``clustergate.report`` only draws the dicts they write.
"""
