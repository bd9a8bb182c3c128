"""Reading a results file back: it must be there, be strict JSON, and match its schema.

Every command that reads what a run wrote (the re-render/re-judge command, ``merge``, ``signoff``,
``calibrate``) reads through here, so that one kind of bad input gets one kind of answer: a
``ResultsFileError`` naming the file, the first problem and where it is, never a traceback and never
a file drawn or counted as if it were a run. What "strict" means: a regular file (a FIFO, a device, or a
link to one is refused before it is read: it could block or never end), UTF-8 text, JSON without NaN or
Infinity (no reader of the contract accepts them, nor a number too large for a float, ``1e999``), no key
given twice in one object (JSON readers disagree which one counts), nested no deeper than a results file
can be, no larger than ``MAX_BYTES``, and valid against the schema of its kind.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from clustergate.common import inputfile
from clustergate.common.terminal import error_text

HERE = Path(__file__).resolve().parent.parent
"""The package: its schemas lie there."""
SCHEMAS = {
    "results": HERE / "results.schema.json",
    "cluster": HERE / "cluster" / "cluster.schema.json",
    "signoff": HERE / "cluster" / "signoff.schema.json",
}
"""The schema of each kind of file: a run's results.json, merge's cluster results.json, signoff.json."""
SCHEMA = SCHEMAS["results"]
FILE_NAMES = {"results": "results.json", "cluster": "cluster results.json", "signoff": "signoff.json"}

MAX_BYTES = inputfile.MAX_BYTES["results"]
MAX_INT_DIGITS = 18
"""No count, rank or figure of a results file has more digits; a longer integer cannot become a float."""
MAX_DEPTH = 64
"""The schema's deepest object is about a dozen levels (details hold free-form JSON): deeper is not a run's."""


class ResultsFileError(ValueError):
    """The file cannot be used as a results file; the message says why and where."""


@cache
def _validator(kind: str) -> Any:
    # jsonschema-rs, not the pure-Python jsonschema: checking 1,000 node files of ~190 KB each took 16 s of a
    # merge's 33 s with the latter and takes a tenth of a second with the former (the same Draft 2020-12 rules,
    # date-time formats included). The suite's own tests check written files with the other implementation.
    import jsonschema_rs

    schema = json.loads(SCHEMAS[kind].read_text())
    jsonschema_rs.meta.validate(schema)  # the schema itself is well formed
    return jsonschema_rs.Draft202012Validator(schema, validate_formats=True)


def schema_problems(data: Any, kind: str = "results") -> list[str]:
    """Every way ``data`` breaks the schema of ``kind``, ``at PATH: problem`` each (empty: valid)."""
    validator = _validator(kind)
    if validator.is_valid(data):
        return []
    errors = sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.instance_path])
    return [f"at {'/'.join(map(str, e.instance_path)) or 'the top level'}: {_message(e)}" for e in errors]


def _message(error: Any) -> str:
    """The validator's message, except that a value outside an enum is told every value allowed (the validator's
    own message names two and counts the rest, which leaves the user to open the schema)."""
    import jsonschema_rs

    if isinstance(error.kind, jsonschema_rs.ValidationErrorKind.Enum):
        allowed = ", ".join(json.dumps(option) for option in error.kind.options)
        return f"{json.dumps(error.instance)[:80]} is not one of {allowed}"
    return str(error.message)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows (a results file is strict JSON)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond what a float holds (a results file is strict JSON)")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"the number {text[:40]}... has more digits than any figure of a results file")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) < len(pairs):  # rare: only then look for the key given twice, to name it
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {key[:80]!r} is given twice in one object (readers disagree which one "
                                 "counts)")
            seen.add(key)
    return out


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path``: a regular file no larger than a results file can be (clustergate.common.inputfile)."""
    try:
        return inputfile.read_bytes(path, "results")
    except inputfile.InputFileError as exc:
        raise ResultsFileError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Loaded:
    """A file's strict JSON and the sha256 of its bytes (the digest merge keeps of every node file)."""

    data: Any
    digest: str


def digest_of(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


_INT_LIMIT = 10 ** MAX_INT_DIGITS


class _Outsized(ValueError):
    """A number too large for a float, or with more digits than ``MAX_INT_DIGITS``: parsed again, number by number,
    to say which (``_finite``, ``_bounded_int``)."""


class _TooDeep(ValueError):
    """Nested deeper than ``MAX_DEPTH``."""


def _depth(data: Any) -> int:
    """How deeply ``data`` nests (past ``MAX_DEPTH``: ``MAX_DEPTH + 1``), without recursion (a hostile file must
    not reach Python's limit), and ``_Outsized`` where a number is. Level by level, following
    only the objects and arrays; a results file's bulk is its numbers, each looked at once, here."""
    if type(data) is not dict and type(data) is not list:
        return 0
    level, frontier = 0, [data]
    while frontier and level <= MAX_DEPTH:
        level += 1
        deeper: list[Any] = []
        for item in frontier:
            for value in item.values() if type(item) is dict else item:
                kind = type(value)
                if kind is dict or kind is list:
                    deeper.append(value)
                elif (kind is float and value - value != 0) or (kind is int and not -_INT_LIMIT < value < _INT_LIMIT):
                    raise _Outsized
        frontier = deeper
    return level


def _strict(text: str) -> Any:
    """``text`` as strict JSON, nested no deeper than ``MAX_DEPTH`` (ValueError else). JSON's own number parsing
    and one walk of the result (``_depth``) stand in for a hook per number, which a merge of a thousand node files
    called millions of times; only a file with an outsized number is parsed again, by the hooks, to name it."""
    data = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    try:
        depth = _depth(data)
    except _Outsized:
        json.loads(text, parse_constant=_refuse_constant, parse_float=_finite, parse_int=_bounded_int)
        raise ValueError("a number is beyond what a results file holds") from None  # the hooks above raise first
    if depth > MAX_DEPTH:
        raise _TooDeep
    return data


def load_json(path: Path) -> Any:
    """The file's JSON, strictly: ResultsFileError (naming the file) for anything else."""
    return load(path).data


def load(path: Path) -> Loaded:
    """The file's JSON, strictly, and the digest of its bytes: ResultsFileError (naming the file) for anything else."""
    try:
        raw = _read_regular(path)
        text = raw.decode("utf-8")
        data = _strict(text)
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ResultsFileError(f"{path}: a directory, not a file") from None
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"{path}: not text (byte {exc.start} is not UTF-8): not a results file") from None
    except RecursionError:
        raise ResultsFileError(f"{path}: nested deeper than any results file: not one") from None
    except _TooDeep:
        raise ResultsFileError(f"{path}: nested deeper than {MAX_DEPTH} levels: not a results file") from None
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        if isinstance(exc, ResultsFileError):
            raise
        raise ResultsFileError(f"{path}: not readable JSON ({error_text(exc)})") from None
    return Loaded(data, digest_of(raw))


def read(path: Path, kind: str = "results") -> dict[str, Any]:
    """A results file (or its report directory's results.json), validated against the schema of ``kind``."""
    return read_with_digest(path, kind)[0]


def read_with_digest(path: Path, kind: str = "results") -> tuple[dict[str, Any], str]:
    """``read``, and the digest of the bytes that were read (never read a second time)."""
    path = path / "results.json" if path.is_dir() else path
    loaded = load(path)
    return checked(loaded.data, path, kind), loaded.digest


def checked(data: Any, path: Path, kind: str = "results") -> dict[str, Any]:
    """``data`` (read from ``path``) when it is valid against the schema of ``kind``; ResultsFileError else."""
    problems = schema_problems(data, kind)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ResultsFileError(f"{path}: not a valid {FILE_NAMES[kind]} ({SCHEMAS[kind].name}): {problems[0]}{more}")
    return data
