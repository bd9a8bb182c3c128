"""A run's record and the verdict it supports: results.json, its files, and the one rule of the verdict.

- ``results``: the record as rank 0 writes it (``RunRecord``), always redacted, signed with a site key;
  ``resultsfile``: a results file read back, strictly (one error naming the file for anything else);
- ``outcomes``: one phase merged across ranks; ``judge``: figures against their criteria, part by part;
  ``verdict``: the one rule (accept, reject, partial, unjudged) and a stored record's verdict re-derived;
  ``rejudge``: a finished run judged again under other criteria;
- ``actions``: what to do about each failure (retest, isolate, escalate); ``evidence_bundle``: one archive per
  excluded host;
- ``reportdir``: the report directory (held by one run, earlier outputs moved aside, written atomically, never
  through a link or over what is not a file); ``outputs``: how the commands write.

Above ``trust``, ``criteria`` and ``secrets``; the run, the cluster commands, the report and the store read it.
"""
