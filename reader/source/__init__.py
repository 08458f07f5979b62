"""Torch's source, read as text and never imported: where it lies, what each symbol spans, how it is fingerprinted.

- ``torch_source``: the installed torch, a site-packages dir, a checkout or a wheel (read in place).
- ``index``: a module's symbol table from libcst, cached by content hash (memory + disk).
- ``patterns``: exact code patterns as token sequences; the statement a pattern lands in.
- ``fingerprint``: exact / normalized (AST) / annotations / signature hashes of a symbol's text.
- ``anchors``: symbol (+ pattern) → file, lines, text, fingerprints; or why not, with the nearest names.
- ``checkref``: does a claim's ``module:function`` exist, answered from the same index without importing it.
- ``files``: atomic writes (the index cache here, the lock in ``gate``).

May import: nothing else of reader.
"""
