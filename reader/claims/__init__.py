"""A claim run and judged: its request, its run (once, or over drawn examples), its verdict and failure text.

``verdict.decide`` is the one place a claim's verdict is reached, for pytest and the study commands alike; its
path goes one way, down: ``request`` (the `CheckRequest`, traced for runtime evidence) → ``properties`` (one run,
or hypothesis's examples) → ``evidence`` (did the anchored code run?) → ``text`` (the words of a failure).
``progress`` keeps the last results and a learner's scores in the user's data directory.

May import: source, format, gate.
"""
