"""The study commands, the ones that run claims: ``check``, ``predict``, ``exercise``, ``timeline``, ``memory``,
``layout``. ``session`` is what every ``fsdp-readings`` command opens (the guides, the torch source, the lock);
``runner`` runs their claims on a pool of this process (through ``claims.verdict.decide``) and records the results;
``answers`` reads a learner's answers, typed or from a file.

May import: source, format, gate, claims, views.
"""
