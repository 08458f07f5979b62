"""One module per guide: ``gNN_<slug>.py`` holds the claim functions of ``readings/NN-<slug>.md`` and, at its end,
the break-it recipes that bend what those claims assert (``tests/break_it/test_NN_<slug>.py`` applies them).

A claim function is SPMD code: ``fn(ctx: RankContext, **kwargs)`` runs on every rank, raises a
`checks.violation.Violation` when its claim does not hold, and returns plain data (the observed value).

May import: breakit, models, probes, ranks, ring, workloads, zero.
"""
