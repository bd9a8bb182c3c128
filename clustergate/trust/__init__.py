"""What a record attests of itself: that the shipped suite ran, whole, on the parts it names.

- ``suitefiles``: the suite's files and their digest, checked against the package's RECORD or the git tree;
  ``source_import``, ``bytecode_cache``, ``loaded_code``: the suite's modules compiled from that attested source,
  and what a process loaded checked against it; ``distfiles``: the environment's Python files a process imported,
  checked against their distribution's RECORD; ``attestation``: the record's attestation (files, code, plugins);
- ``manifest``: the tests a complete node or fabric run contains (manifest.json), each test's metrics, skips and
  own limits; ``skip_facts``: the facts a skip may rest on; ``completeness``: whether a run is complete (a
  partial run is never accepted);
- ``keyed``: records HMAC-signed with a site key; ``identity``: each rank's host, GPU, serial and UUID.

Above ``criteria`` and ``secrets``; below ``record``, which judges a run with what these attest.
"""
