"""What a figure is held to: the thresholds file, its profiles and each criterion's meaning.
It imports only ``common``: every room above judges by it, none of it judges a run.
"""
