"""What never leaves a rank or a site: secrets, found by name and by value, taken out of every output.

- ``redact``: the one rule (a secret-named key hides its value, every string is scrubbed of the environment's
  secret values and of secrets of a known format, URL credentials and ``Name=value`` pairs); what crosses to
  other ranks (``outgoing``) and what a page, a record or a store keeps;
- ``secret_formats``: the token formats found by value (detect-secrets' plugins, read offline).

Below every room but ``common``: the run, the records, the cluster commands and the store all redact through it.
"""
