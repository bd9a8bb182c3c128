"""Fixtures shared by the suite's own tests."""

pytest_plugins = ["pytester"]
