"""Reading a results.json back: it must be there, be JSON, and match clustergate/results.schema.json.

The report command judges what it reads; a file that is not a results.json is refused with one
error naming the file, the first problem and where it is, never drawn as if it were a run.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parent.parent / "results.schema.json"


class ResultsFileError(ValueError):
    """The file cannot be used as a results.json; the message says why and where."""


@cache
def _validator() -> Any:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.Draft202012Validator
    cls.check_schema(schema)  # the schema itself is well formed
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def schema_problems(results: Any) -> list[str]:
    """Every way ``results`` breaks the schema, ``at PATH: problem`` each (empty: valid)."""
    errors = sorted(_validator().iter_errors(results), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"at {'/'.join(map(str, e.absolute_path)) or 'the top level'}: {e.message}" for e in errors]


def read(path: Path) -> dict[str, Any]:
    """A results.json (or its report directory's), validated against the schema."""
    path = path / "results.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsFileError(f"{path}: file not found; pass the results.json of a run (or its report "
                               "directory)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsFileError(f"{path}: not readable JSON ({exc})") from None
    problems = schema_problems(data)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ResultsFileError(f"{path}: not a valid results.json ({SCHEMA.name}): {problems[0]}{more}")
    return data
