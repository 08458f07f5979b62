"""``fsdp-readings``: ``app`` (the command table, the parser, the console, the path shown with no command),
``guides`` (list, show, drift, approve), ``path`` (the reading path and the glossary), ``search``, ``estimate``
and its ``--recommend`` (``recommend``), the input both read (``job_inputs``: the model, the links, bad input),
``inspect`` (and ``inspect_views``), ``site`` (the static site); the commands that run claims are in ``study``.

May import: source, format, gate, claims, views, study, site.
"""
