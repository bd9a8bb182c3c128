"""The command line of a run, checked once every plugin and conftest has added its options and before pytest reads
it: an option nobody knows, and a suite named where there is none. pytest's own refusal of either comes on every
rank, before any plugin can say it once, in words that do not say what to do ("unrecognized arguments:
--report-dir" from outside the checkout); each is one line here, said once (``clustergate.run.launch.refusal``).

The standard library and pytest only: ``clustergate.optin``, loaded in every pytest run, checks through it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from clustergate.common.suggest import near_options

SUITE = "acceptance"
"""The suite's directory, as the design card's command names it: ``torchrun ... -m pytest acceptance``."""


def missing_suite(config: pytest.Config) -> str | None:
    """Why the command names ``acceptance/`` where there is none (run outside the checkout), and what to do; None
    where it names no such path. With ``--pyargs`` the name is a package, found wherever it is installed."""
    ns = config.known_args_namespace
    if getattr(ns, "pyargs", False):
        return None
    here = config.invocation_params.dir
    named = [arg for arg in getattr(ns, "file_or_dir", None) or []
             if arg.split("::", 1)[0].rstrip("/").split("/", 1)[0] == SUITE]
    absent = [arg for arg in named if not (here / arg.split("::", 1)[0]).exists()]
    if not absent:
        return None
    head = f"{absent[0]}: no such directory in {here}: the command runs the suite"
    checkout = _checkout()
    if checkout is not None:
        return (f"{head} from the root of the clustergate checkout: run it from there (cd {checkout}), or run "
                f"`clustergate run` (from any directory; it takes the same options: clustergate run --report-dir "
                f"DIR ...)")
    return (f"{head} from a checkout, and this clustergate is installed: run `clustergate run` (from any directory; "
            "it takes the same options), or name the installed suite: -m pytest -p clustergate --pyargs acceptance")


def _checkout() -> Path | None:
    """The checkout this clustergate runs from (an editable install or PYTHONPATH); None for an installed one."""
    root = Path(__file__).resolve().parents[3]  # above clustergate/run/launch/
    return root if (root / "pyproject.toml").is_file() and (root / SUITE / "conftest.py").is_file() else None


def unknown_option(parser: pytest.Parser, args: list[str]) -> str | None:
    """pytest's own refusal of ``args`` as one line, with the nearest known option where one is close (``--profle``:
    did you mean --profile?); None where pytest will read them. Read as pytest reads them, into a namespace of its
    own: nothing of the real parse is touched."""
    try:
        parser.parse(list(args), namespace=argparse.Namespace())
    except pytest.UsageError as exc:
        return _one_line(str(exc), parser)
    except Exception:  # --help (pytest's PrintHelp) and whatever else pytest itself handles as it reads them
        return None
    return None


def _one_line(refusal: str, parser: pytest.Parser) -> str:
    """argparse's "usage: ...\\nPROG: error: WHAT\\n  inifile: ...": WHAT, and a way on."""
    lines = refusal.splitlines()
    what = next((line.split(": error: ", 1)[1] for line in lines if ": error: " in line), lines[0] if lines else "")
    if what.startswith("unrecognized arguments: "):
        unknown = [arg.split("=", 1)[0] for arg in what.removeprefix("unrecognized arguments: ").split()
                   if arg.startswith("-")]
        near = near_options(unknown, parser.optparser._option_string_actions)
        what += f" ({'; '.join(near)})" if near else ""
        what += "; pytest --help lists every option, clustergate's under 'cluster acceptance (clustergate)'"
    return what


def problem(config: pytest.Config, parser: pytest.Parser, args: list[str]) -> str | None:
    """The first of the two, or None."""
    return missing_suite(config) or unknown_option(parser, args)
