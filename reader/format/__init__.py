"""The guide format: a ``readings/NN-slug.md`` file → a `Guide`, or every problem with its line and fix.

- ``guide``: the model (anchors, claims, body regions, notes, expect blocks); ``errors``: problems by line.
- ``parse``: the entry point, over ``front_matter`` (TOML → `Guide`, with ``specs`` for ``[[anchors]]`` and
  ``[[claims]]``, ``toml_fields`` for line-pinned problems) and ``body`` (Markdown → regions, one registered
  parser per fence kind: ``blocks`` for ```source and ```expect, ``predict`` for ```predict and its answers).

May import: source.
"""
