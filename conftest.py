"""Registers the suite's pytest plugins: rank pool options and fixtures, and guides as test items."""

pytest_plugins = ["checks.ranks.pytest_plugin", "reader.plugin"]
