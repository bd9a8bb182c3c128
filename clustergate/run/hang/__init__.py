"""Hang detection: every rank's beat, the pure judge of a silence or a wait, the main thread read from another thread,
torch's flight recorders, and each test's time limit. It finds a hang and hands it on as a finding; it ends nothing
itself (``run.detectors`` and ``Run.end`` do), and never imports the plugin, the lifecycle or the launcher.
"""
