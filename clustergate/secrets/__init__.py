"""What never leaves a rank or a site: secrets, found by name and by value, taken out of every output.
Below every room but ``common``: it knows nothing of a run, and every room redacts through it.
"""
