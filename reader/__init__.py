"""Reading guides over PyTorch FSDP's source, as pytest items and a CLI.

A guide (``readings/NN-slug.md``) is Markdown with TOML front matter. Its *anchors* name torch symbols whose
live source the guide reads; its *claims* name checks that prove behaviour on real process groups.

Rooms, lowest first; each room's ``__init__`` says what it owns and which rooms it may import
(``tests/reader/test_rooms.py`` holds them to it):

- ``source``: torch's source read as text (where it lies, symbols, patterns, fingerprints, anchors).
- ``format``: the guide format (front matter, body parsers, blocks, predict questions).
- ``gate``: the lock, drift, approval, the reports and the upgrade gate.
- ``claims``: a claim's request, run, verdict and failure text (``claims.verdict.decide``), and progress.
- ``pytest_plugin``: guides as pytest items; ``views``: terminal renderables.
- ``study``: the commands that run claims (check, predict, exercise, timeline, memory, layout) and what every
  command opens; ``commands``: ``fsdp-readings`` itself, its table and the commands over guides.

Entry points: ``reader.cli:main`` (the ``fsdp-readings`` script), ``reader.plugin`` (the pytest plugin) and
``python -m reader`` (``__main__``); they re-export, and hold no code.
"""
