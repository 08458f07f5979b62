"""Reading guides over PyTorch FSDP's source, as pytest items and a CLI.

A guide (``readings/NN-slug.md``) is Markdown with TOML front matter. Its *anchors* name torch symbols whose
live source the guide reads; its *claims* name checks that prove behaviour on real process groups.

One job per module, in data-flow order:

- ``guide``: the model (front matter, anchors, claims, body regions, notes); ``errors``: problems by line.
- ``parse``: a guide file → ``Guide``; the entry point over ``front_matter`` (TOML → ``Guide``, with ``specs``
  for ``[[anchors]]``/``[[claims]]`` and ``toml_fields`` for line-pinned problems) and ``body`` (the Markdown
  body → regions, one registered parser per fence kind; ``blocks`` registers ```source and ```expect).
- ``checkref``: does a claim's ``module:function`` exist, answered without importing it.
- ``torch_source``: the installed torch, a site-packages dir, a checkout or a wheel (read in place).
- ``index``: a module's symbol table from libcst, cached by content hash (memory + disk).
- ``patterns``: exact code patterns as token sequences; the statement a pattern lands in.
- ``fingerprint``: exact / normalized (AST) / annotations / signature hashes of an anchor's text.
- ``anchors``: symbol (+ pattern) → file, lines, text, fingerprints; or why not, with the nearest names.
- ``lock``: ``readings/anchors.lock``, the approved source, canonical JSON.
- ``drift``: approved vs current → a drift class and a diff in torch's own line numbers.
- ``workspace``: the engine the plugin and the CLI share (resolve, classify, approve, save).
- ``evidence``: which symbols ranks trace for a claim (its ``CheckRequest``) and whether any ran.
- ``runner`` / ``hookspecs``: the seam to the rank pool of ``checks`` (replaceable through a hook).
- ``plugin``: the pytest hooks (options, collection, exit codes); ``items``: guide files, anchor and claim
  items; ``failures``: their failure text; ``session``: the per-session options, resources and findings.
- ``report``: rich summary + JSON/Markdown report; ``render``: a guide for the terminal (``show``).
- ``cli``: ``fsdp-readings`` (``list``, ``show``, ``drift``, ``approve``).
"""
