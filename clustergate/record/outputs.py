"""How the cluster commands (merge, signoff, calibrate, the re-render) write what they decide.

As the run writes its own outputs (``clustergate.record.reportdir``): every file whole or not at all, through a
private temporary file renamed over its name, so a link planted under any name is never written through;
never over one of the command's own inputs (``-o`` that is or holds an input is refused before anything
is written); never over what is not a file of theirs (``-o`` naming a device, a FIFO, a socket or a directory is
refused, the name left as it is: a rename would replace even ``/dev/null`` for root); and never over an earlier
decision: the outputs of an earlier merge or sign-off in the same
directory are moved to ``earlier/<UTC time>/`` first, kept whole, so that a later one that fails leaves
none of them behind as if it were its own.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

from clustergate.common.files import NotAFile, refuse_not_a_directory, refuse_not_a_file, write_atomic
from clustergate.common.suggest import argparse_hint
from clustergate.record.reportdir import move_aside


class OutputError(ValueError):
    """An output the command must not write (it is an input, or a link there cannot be moved aside)."""


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path``, whole or not at all, never through a link (``clustergate.common.files.write_atomic``)."""
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


def refuse_not_files(option: str, outputs: Iterable[Path]) -> None:
    """OutputError when an output file exists as something other than a regular file (or a link, whose name is
    replaced): a directory, a FIFO, a device, a socket."""
    for out in outputs:
        try:
            refuse_not_a_file(Path(out))
        except NotAFile as exc:
            raise OutputError(f"{option} {exc}") from None


def refuse_not_directory(option: str, directory: Path) -> None:
    """OutputError when the directory the outputs go into exists as something else (a device, a file)."""
    try:
        refuse_not_a_directory(directory)
    except NotAFile as exc:
        raise OutputError(f"{option} {exc}") from None


def keep_earlier(directory: Path, names: tuple[str, ...], directories: tuple[str, ...] = ()) -> Path | None:
    """Move an earlier command's outputs ``names`` in ``directory`` to ``earlier/<UTC time>/``; where they went
    (None: there were none). OutputError when a name there is a link (it is never followed)."""
    try:
        moved = move_aside(directory, names, directories)
    except NotAFile as exc:
        raise OutputError(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(f"{directory}: {exc.strerror}; clustergate writes no output through a link: "
                              "remove it") from None
        raise
    return next(iter(moved.values())).parent if moved else None


class Parser(argparse.ArgumentParser):
    """argparse whose usage error is one line and exit status 2 (``--help`` shows the usage), naming the nearest
    option or choice to a typo (``clustergate.common.suggest``): every clustergate command's parser but the run's."""

    def error(self, message: str) -> NoReturn:
        hint = argparse_hint(message, self._option_string_actions)
        self.exit(2, f"{self.prog}: {message}{hint} (see --help)\n")
