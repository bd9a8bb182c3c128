"""What every room uses: the exit table, how a number and a GPU part are written, the one reader of every input
file, Slurm's hostlist form and what reaches a terminal. The ground floor: it imports no other room.

- ``exit_codes``: the one table of exit statuses (0 accept, 1 not accepted, 2 unusable input, 4 could not run);
- ``numbers``: how a figure is written; ``parts``: how a GPU is named alike everywhere;
- ``inputfile``: the one reader of every input (a regular file no larger than its kind can be);
- ``hostlist``: Slurm's hostlist form, both ways;
- ``suggest``: the nearest known option or command to a typo ("did you mean");
- ``terminal``: what reaches a terminal (control characters as escapes, a closed pipe, an OSError in words).
"""
