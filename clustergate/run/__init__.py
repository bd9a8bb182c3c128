"""The run: one acceptance run on one rank, from its options to the exit status every rank agrees (pytest's
plugin, the ranks and their peers, hang detection, the launcher). It decides no verdict (``record.verdict`` does) and
draws nothing (``report``); its modules are listed in docs/how-it-works.md, "The map of the rooms".
"""
