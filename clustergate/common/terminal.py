"""What the suite's text looks like where it reaches a terminal, and how the commands print it.

- ``printable``: the one escaping rule for control characters. Text read from a machine, a results.json, a
  store or a test's failure (host names, messages, figures' units) may carry terminal escape sequences, which
  would move the cursor, clear the screen or retitle the terminal; shown as escapes (``\\x1b``) they read as
  what they are. ``printable_lines`` keeps the line breaks and tabs of text of several lines (a traceback).
- ``error_text``: an exception in words: an OSError as "PATH: what went wrong", never Python's ``[Errno 17] File
  exists: 'PATH'``.
- ``main_guarded``: every command's stdout and stderr for the length of the command: what it prints goes
  through ``printable_lines``, and a reader that closes the pipe early (``| head``) ends the printing quietly, as
  a pipeline expects: no message, no traceback, and the command's own exit status (its files are written and its
  decision taken before it prints; what it printed was cut short by the reader, which asked for no more).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from clustergate.common.exit_codes import Exit

KEPT = "\n\t"
"""What ``printable_lines`` leaves as it is: the line breaks and tabs of text of several lines."""


def printable(text: str, keep: str = "") -> str:
    """``text`` with control characters (and every other character Python does not call printable: a zero-width
    space, a right-to-left override) shown as escapes, but those in ``keep``."""
    probe = text
    for c in keep:  # str.replace and isprintable run in C: the common case (nothing to escape) costs no loop
        probe = probe.replace(c, " ")
    if probe.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii") for c in text)


def printable_lines(text: str) -> str:
    """``printable``, keeping line breaks and tabs (a traceback, a table, a command's whole output)."""
    return printable(text, KEPT)


def error_text(exc: BaseException) -> str:
    """What went wrong, in words: an OSError as ``PATH: what`` (both paths of a rename), else the exception's own
    text."""
    if isinstance(exc, OSError) and type(exc).__str__ is OSError.__str__ and exc.strerror:
        paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
        return f"{' -> '.join(paths)}: {exc.strerror}" if paths else exc.strerror
    return str(exc) or type(exc).__name__


class _Guarded:
    """A text stream that escapes what is written to it (``printable_lines``) and goes quiet once its reader has
    closed the pipe: the stream's descriptor then points at /dev/null, so nothing it still holds is lost noisily
    (Python would otherwise complain when it flushes at exit)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.closed_early = False

    def write(self, text: str) -> int:
        if not self.closed_early:
            with self._quiet_on_broken_pipe():
                self.stream.write(printable_lines(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._quiet_on_broken_pipe():
            self.stream.flush()

    @contextlib.contextmanager
    def _quiet_on_broken_pipe(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            self.closed_early = True
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stream.fileno())
                os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """stdout and stderr guarded (``_Guarded``) for the block; as they were after it, flushed."""
    if isinstance(sys.stdout, _Guarded):  # a command run from another that guards already
        yield
        return
    saved = sys.stdout, sys.stderr
    out, err = _Guarded(sys.stdout), _Guarded(sys.stderr)
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    try:
        yield
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved


def main_guarded(prog: str, main: Callable[[], int]) -> int:
    """``main()``'s exit status, its output guarded (``guarded``). An OSError nothing below caught (a disk that
    filled, a directory that vanished) is one line, ``prog: PATH: what``, and exit status 4 (could not run),
    never a traceback with a bare errno."""
    with guarded():
        try:
            return main()
        except OSError as exc:
            print(f"{prog}: {error_text(exc)}", file=sys.stderr)
            return Exit.COULD_NOT_RUN
