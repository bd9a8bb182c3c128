"""How the cluster commands (merge, signoff, calibrate, the re-render) write what they decide.

As the run writes its own outputs (``clustergate.reportdir``): every file whole or not at all, through a
private temporary file renamed over its name, so a link planted under any name is never written through;
never over one of the command's own inputs (``-o`` that is or holds an input is refused before anything
is written); and never over an earlier decision: the outputs of an earlier merge or sign-off in the same
directory are moved to ``earlier/<UTC time>/`` first, kept whole, so that a later one that fails leaves
none of them behind as if it were its own.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

from clustergate.reportdir import move_aside, write_atomic


class OutputError(ValueError):
    """An output the command must not write (it is an input, or a link there cannot be moved aside)."""


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path``, whole or not at all, never through a link (``reportdir.write_atomic``)."""
    write_atomic(path, text)


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)  # a hard link, or another path to the same file
    return False


def refuse_inputs(option: str, outputs: Iterable[Path], inputs: Iterable[Path], fix: str) -> None:
    """OutputError when an output file would be one of the inputs (the same path, a link to it, or a hard link)."""
    inputs = [Path(i) for i in inputs]
    for out in outputs:
        for given in inputs:
            if _same(Path(out), given):
                raise OutputError(f"{option} {out}: that is an input ({given}): writing it would destroy what the "
                                  f"command reads; {fix}")


def keep_earlier(directory: Path, names: tuple[str, ...]) -> Path | None:
    """Move an earlier command's outputs ``names`` in ``directory`` to ``earlier/<UTC time>/``; where they went
    (None: there were none). OutputError when a name there is a link (it is never followed)."""
    try:
        moved = move_aside(directory, names)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(f"{directory}: {exc.strerror}; clustergate writes no output through a link: "
                              "remove it") from None
        raise
    return next(iter(moved.values())).parent if moved else None


class Parser(argparse.ArgumentParser):
    """argparse whose usage error is one line and exit status 2 (``--help`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def main_guarded(prog: str, main: Callable[[], int]) -> int:
    """``main()``, where a reader that closes the pipe early (``| head``) is one line and status 2, never a
    traceback: the command's files are written before it prints."""
    try:
        status = main()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit: point it at /dev/null first.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        with contextlib.suppress(OSError):
            print(f"{prog}: the output was closed before everything was printed (broken pipe); the files are "
                  "written: read them", file=sys.stderr)
        return 2
