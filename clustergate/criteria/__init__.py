"""What a figure is held to: the thresholds file, its profiles and each criterion's meaning.

- ``thresholds``: thresholds.yaml read and checked (a profile per GPU model and node shape, ``extends``, settings,
  expectations, criteria); ``settings``: every setting a profile may give, with its check;
- ``criterion``: a criterion (its bounds, one class per kind, its source and severity) and how a figure meets it;
  ``sources``: where a criterion's figures come from; ``expect``: a profile's expectations of a node's
  configuration;
- ``profile_choice``: the one rule that chooses a run's profile (``--profile``, else the GPU model and the node's
  GPU count);
- ``baseline``: an earlier run a run is compared with (``--baseline``).

It imports only ``common``: every room above judges by it, none of it judges a run.
"""
