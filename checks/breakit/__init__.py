"""The break-it machinery: how a test bends torch inside the ranks for one check, then puts it back.

- `patches`: build a `Patch` from a recipe function (``wrapping(target, recipe)``), so a misspelt recipe is an
  import error in the test, not a rank-side failure.
- `sabotage`: generic factories (skip, return a value, raise, wrap).

A guide's own recipes (the wrappers that bend exactly what its claims assert) live at the end of its module in
`checks.guides`; its break-it tests live in ``tests/break_it/test_NN_<slug>.py``.
- `exercises`: a guide's break-it patches offered as puzzles (``fsdp-readings exercise``), and where a guide
  declares them (`exercise_modules`).

The ranks apply a patch (`checks.ranks.patching`); this room only builds them.

May import: ranks.
"""
