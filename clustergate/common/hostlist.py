"""Host names in Slurm's hostlist form, both ways: ``gpu[001-007,009]`` <-> gpu001 ... gpu007, gpu009.

The merged cluster report writes its accepted and excluded hosts in this form (what ``sbatch
--nodelist``, ``scontrol`` and ``sinfo -n`` take), and ``--expect-hosts`` reads it. Standard library
only, so the same code runs wherever the report command does, with or without Slurm installed.

Compressing groups names by what surrounds their last run of digits and by zero padding: gpu001 and
gpu010 share ``gpu[001,010]``; node9 and node10 (no padding) give ``node[9-10]``; a name without
digits stays as it is.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable
from pathlib import Path

from clustergate.common import inputfile
from clustergate.common.terminal import error_text
from workloads.node.name import not_ascii

_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_EXPANDED = 100_000
"""More hosts than this from one expression (or one file) is a typo (``gpu[000000-999999]``: a digit too many), not
a cluster: the largest clusters have tens of thousands of nodes. Counted before any name is made, so a typo costs
nothing (a million names took 11 GB and wrote a 1.5 GB results.json)."""


class HostlistError(ValueError):
    """A hostlist expression that cannot be read."""


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of sorted distinct numbers: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def compress(hosts: Iterable[str]) -> str:
    """The hosts as one Slurm hostlist expression (duplicates dropped, groups in name order)."""
    names = sorted(set(hosts))
    plain: list[str] = []
    numbered: list[tuple[str, str, str]] = []
    for name in names:
        m = _NUMBERED.match(name)
        if m is None or "[" in name or "," in name:
            plain.append(name)
        else:
            numbered.append((m.group(1), m.group(2), m.group(3)))
    # Zero-padded numbers share a group with others of their width; a number without a leading zero
    # joins a padded group of its own width where one exists (gpu099 and gpu100), else the unpadded one.
    padded = {(p, s, len(d)) for p, d, s in numbered if len(d) > 1 and d.startswith("0")}
    groups: dict[tuple[str, str, int], list[int]] = {}
    for prefix, digits, suffix in numbered:
        width = len(digits) if (prefix, suffix, len(digits)) in padded else 0
        groups.setdefault((prefix, suffix, width), []).append(int(digits))
    parts = list(plain)
    for (prefix, suffix, width), numbers in groups.items():
        runs = _runs(sorted(set(numbers)))
        text = ",".join(f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in runs)
        parts.append(f"{prefix}{text}{suffix}" if len(runs) == 1 and runs[0][0] == runs[0][1]
                     else f"{prefix}[{text}]{suffix}")
    return ",".join(sorted(parts, key=lambda p: (p.split("[")[0], p)))


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"{text!r}: nested '[' at character {i + 1}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"{text!r}: ']' without '[' at character {i + 1}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"{text!r}: '[' is never closed")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _too_many(whole: str, count: int) -> HostlistError:
    return HostlistError(f"{whole!r} names {count} hosts, more than the {MAX_EXPANDED} a host expression may name "
                         "(a digit too many?): give the cluster's hosts")


def _bracket_ranges(body: str, whole: str) -> list[tuple[str, str]]:
    """The (first, last) numbers of each item of one ``[...]``, as written."""
    ranges: list[tuple[str, str]] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if m is None:
            raise HostlistError(f"{whole!r}: '{item}' in [...] is not a number or a range like 001-007")
        first, last = m.group(1), m.group(2) or m.group(1)
        if int(last) < int(first):
            raise HostlistError(f"{whole!r}: range {item} runs backwards")
        ranges.append((first, last))
    return ranges


def _bracket_values(ranges: list[tuple[str, str]]) -> list[str]:
    values: list[str] = []
    for first, last in ranges:
        width = len(first) if first.startswith("0") and len(first) > 1 else 0
        values += [f"{n:0{width}d}" for n in range(int(first), int(last) + 1)]
    return values


def expand(text: str) -> list[str]:
    """Every host an expression names, in its order: ``gpu[001-003],login1`` -> gpu001, gpu002, gpu003, login1.

    Several bracket groups in one name expand as a product (``r[1-2]n[1-2]``), as Slurm does.
    """
    for name in _split_top(text.strip()):
        if (why := not_ascii(name)) is not None:
            raise HostlistError(why)
    parts = []
    for part in _split_top(text.strip()):
        pieces = re.split(r"\[([^\]]*)\]", part)
        fixed, brackets = pieces[0::2], pieces[1::2]
        if any(c in "[]" for c in "".join(fixed)):
            raise HostlistError(f"{text!r}: unbalanced brackets in {part!r}")
        parts.append((fixed, [_bracket_ranges(b, text) for b in brackets]))
    count = sum(math.prod(sum(int(b) - int(a) + 1 for a, b in r) for r in ranges) for _, ranges in parts)
    if count > MAX_EXPANDED:
        raise _too_many(text, count)
    out: list[str] = []
    for fixed, ranges in parts:
        for combo in itertools.product(*(_bracket_values(r) for r in ranges)):
            out.append("".join(f + c for f, c in zip(fixed, (*combo, ""), strict=True)))
    return out


def read_hosts(spec: str) -> tuple[list[str], str]:
    """Hosts from a file (one name or hostlist expression a line; ``#`` starts a comment) or from a
    hostlist expression. Returns (hosts, where they came from)."""
    path = Path(spec)
    if path.exists():
        hosts: list[str] = []
        try:
            text = inputfile.read_text(path, "hosts")
        except (OSError, ValueError) as exc:
            raise HostlistError(f"{path}: cannot be read as a host list ({error_text(exc)})") from None
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                hosts += expand(line)
            except HostlistError as exc:
                raise HostlistError(f"{path}, line {number}: {exc}") from None
            if len(hosts) > MAX_EXPANDED:
                raise HostlistError(f"{path}: names more than the {MAX_EXPANDED} hosts a host list may name (by line "
                                    f"{number}): give the cluster's hosts")
        return hosts, str(path)
    if "/" in spec or spec.endswith(".txt"):
        raise HostlistError(f"{spec}: no such file (give a file of host names, one a line, or a hostlist "
                            "expression such as gpu[001-016])")
    return expand(spec), "hostlist expression"
