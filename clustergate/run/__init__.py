"""The run: one acceptance run on one rank, from its options to the exit status every rank agrees.

The pytest plugin (``plugin``) forwards pytest's hooks to the run's owner; the rest of this folder is how a run
lives and ends: its world and control exchanges (``world``, ``control``, ``peers``), its outputs as they go
(``progress``), the test's handle (``recorder``, the ``cg`` fixture), and what ends it early (``endings``,
``watchdog``, ``interrupts``, ``stops``, ``startup``).
"""
