"""The run: one acceptance run on one rank, from its options to the exit status every rank agrees.

- ``plugin``: pytest's hooks, each forwarded to the run; ``items`` reads and writes pytest's items and reports.
- ``options``: the options, one checked dataclass; ``limits``: every deadline and exit status.
- ``startup``: the start through the rendezvous store, the thresholds, the process groups, the report directory.
- ``lifecycle``: ``Run``, the one owner of the run's state, and its ``Stage``s; ``Run.end`` is the one way down.
- ``ending``: the ``Ending`` value and whose fault it was; ``detectors``: what each fault means as an Ending.
- ``watchdog``, ``interrupts``: the threads that see a test past its limit, a blocked collective, a signal.
- ``liveness``: every rank's beat, and acting on what ``hang_judge`` (pure) finds of a rank or a group that stopped
  making progress; ``main_thread``: what the rank's main thread does, read from its beat; ``flight``: where a rank is
  in each process group's collectives (torch's flight recorders); ``keeper``: the process that continues a rank
  stopped too long.
- ``world``, ``control``, ``peers``: the process groups, the control exchanges, the rendezvous store.
- ``progress``: progress.jsonl; ``recorder``: the ``cg`` fixture; ``outside``: what the run touches beyond itself.
- ``command``: ``clustergate run``; ``outcome``: what rank 0 tells it.
- ``command_line``: the command line checked before pytest reads it; ``refusal``: a run refused before its first
  test, said once; ``errorfile``: what torchrun's own failure summary says of a rank (its error file).
"""
