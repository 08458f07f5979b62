"""What proves the guides' claims: the rank pool, the probes, and one module of check functions per topic.

A check function is SPMD code: ``fn(ctx: RankContext, **kwargs)`` runs on every rank of a process group, asserts
what its claim says, and returns a picklable value. The pool (`checks.pool`) runs it on N ranks and returns every
rank's outcome.
"""
