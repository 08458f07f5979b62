"""The ``fsdp-readings`` entry point (``reader.cli:main`` in pyproject.toml); the commands live in `reader.commands`."""

from reader.commands.app import build_parser, main, make_console

__all__ = ["build_parser", "main", "make_console"]
