"""What an installed clustergate adds to every pytest run: one switch, and nothing else until it is used.

The ``pytest11`` entry point loads this module (not the plugin) in every pytest run of an environment
where clustergate is installed. It imports neither torch nor the plugin, registers only ``--clustergate``
and the ini key ``clustergate``, and turns the plugin on when one of them asks, as if ``-p clustergate``
had been given. Other ways to ask: ``-p clustergate``, or ``pytest_plugins = ["clustergate"]`` in a
conftest (the checkout's root conftest.py and acceptance/conftest.py do). ``-p no:clustergate`` wins over
all of them. An unrelated project's ``pytest`` never sees the plugin: no summary, no reports/, no lock.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

NAME = "clustergate"
"""The plugin's name: ``-p clustergate`` turns it on, ``-p no:clustergate`` keeps it off."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup(NAME, "cluster acceptance (clustergate)").addoption(
        "--clustergate", action="store_true", default=False,
        help="turn the clustergate acceptance plugin on for this run (as -p clustergate does; the acceptance "
             "suite's conftest turns it on by itself)")
    parser.addini(NAME, type="bool", default=False,
                  help="clustergate: turn the acceptance plugin on for runs under this configuration file")


def asked(config: pytest.Config) -> bool:
    """Whether this run asked for the plugin by option or ini key (a conftest asks by importing it)."""
    return bool(getattr(config.known_args_namespace, NAME, False)) or bool(config.getini(NAME))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> Any:
    # Before the full command line is parsed: the plugin's own options (--thresholds, --profile, ...)
    # must exist by then. Registered as -p clustergate would, but without import_plugin: the package is
    # imported already (this module is in it), which import_plugin would warn cannot be assertion-rewritten.
    manager = early_config.pluginmanager
    if asked(early_config) and not manager.is_blocked(NAME) and manager.get_plugin(NAME) is None:
        import clustergate

        manager.register(clustergate, NAME)
    result = yield
    # The suite's command from outside the checkout (`torchrun ... -m pytest acceptance`), or the plugin on: the
    # command line is checked once every conftest has added its options, said once if refused. Any other project's
    # pytest is left to read its own command line.
    if os.environ.get("TORCHELASTIC_RUN_ID") or manager.get_plugin(NAME) is not None:
        from clustergate.common.exit_codes import Exit
        from clustergate.run.launch import command_line, refusal

        problem = command_line.missing_suite(early_config)
        if problem is None and manager.get_plugin(NAME) is not None:
            problem = command_line.unknown_option(parser, args)
        if problem is not None:
            refusal.leave(refusal.said(problem), Exit.USAGE)
    return result
