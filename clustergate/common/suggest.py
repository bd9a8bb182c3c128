"""The nearest known word to a mistyped one: every command's "did you mean" (an option, a command, a choice).

One rule for the run's own options (``clustergate.run.launch.command_line``, read through pytest) and every cluster
command's argparse (``clustergate.record.outputs.Parser``): a word that is close to exactly one known word is
named with it; one close to none gets no guess. Standard library only.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

CUTOFF = 0.75
"""difflib's similarity from which a word is taken for a typo of a known one (``--profle`` of ``--profile``,
``merg`` of ``merge``), and below which a guess would mislead more than help."""


def near(word: str, known: Iterable[str]) -> str | None:
    """The known word ``word`` is most likely a typo of; None where none is close."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=CUTOFF)
    return close[0] if close else None


def near_options(words: Iterable[str], known: Iterable[str]) -> list[str]:
    """``--word: did you mean --known?`` for each option among ``words`` (``--opt=value`` by its name) that is close
    to one of ``known``."""
    options = [name for name in known if name.startswith("--")]
    out = []
    for word in words:
        name = word.split("=", 1)[0]
        if name.startswith("-") and (close := near(name, options)) is not None:
            out.append(f"{name}: did you mean {close}?")
    return out


_CHOICE = re.compile(r"argument (?P<arg>.+?): invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)$")


def argparse_hint(message: str, known_options: Iterable[str]) -> str:
    """What to add to argparse's error ``message``: `` (--expect-host: did you mean --expect-hosts?)`` for
    unrecognized options, `` (did you mean merge?)`` for an invalid choice (a command, a level); else empty."""
    if message.startswith("unrecognized arguments: "):
        near_ones = near_options(message.removeprefix("unrecognized arguments: ").split(), known_options)
        return f" ({'; '.join(near_ones)})" if near_ones else ""
    if (m := _CHOICE.match(message)) is not None:
        close = near(m["given"], re.findall(r"'([^']*)'", m["choices"]))
        return f" (did you mean {close}?)" if close else ""
    return ""
