"""What every room uses: the exit table, numbers, parts, the one reader of inputs and the one writer of outputs,
/proc, the parent-death signal, the owner-file lock, the terminal. The ground floor: it imports no other room and
knows nothing of a run.
"""
