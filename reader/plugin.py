"""The pytest plugin's entry point (``reader.plugin`` in conftest.py's ``pytest_plugins``, or ``-p reader.plugin``).

pytest registers the plugin this module names: the hooks live in `reader.pytest_plugin.hooks`. They are not
imported here, so that pytest imports that module itself (and rewrites its asserts, as for any plugin it names).
"""

from typing import Any

pytest_plugins = ["reader.pytest_plugin.hooks"]


def __getattr__(name: str) -> Any:
    if name == "claim_request":  # re-exported for break-it tests written against reader.plugin
        from reader.pytest_plugin.hooks import claim_request

        return claim_request
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
