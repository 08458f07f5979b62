"""``fsdp-readings``, one module per command: ``app`` (the command table, parser and console), ``session``
(what every command opens), ``guides`` (list, show, drift, approve), ``check``, ``predict``, ``exercise``,
``timeline``, ``memory``, ``layout``, ``estimate``; ``runner`` runs their claims, ``answers`` reads a learner's.

May import: source, format, gate, claims, views.
"""
