"""The ranks and their peers: the process groups (world), the plugin's own control exchanges and the rendezvous
store every rank reads and writes. It carries what the run says between ranks and judges nothing; it never imports
the plugin, the lifecycle, hang detection or the launcher.
"""
