"""What a record attests of itself: that the shipped suite ran, whole, on the parts it names.
Above ``criteria`` and ``secrets``, below ``record``: it attests, and leaves judging the run to ``record``.
"""
