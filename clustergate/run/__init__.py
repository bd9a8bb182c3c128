"""The run: one acceptance run on one rank, from its options to the exit status every rank agrees: pytest's plugin and
its lifecycle here, above hang/ (hang detection), ranks/ (the ranks and their peers) and launch/ (the launcher). It
decides no verdict (``record.verdict``) and draws nothing (``report``); docs/how-it-works.md maps its modules.
"""
