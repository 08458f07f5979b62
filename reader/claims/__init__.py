"""A claim run and judged: its request, its run (once, or over drawn examples), its verdict and failure text.

``verdict.decide`` is the one place a claim's verdict is reached, for pytest and the study commands alike; its
path goes one way, down: ``request`` (the `CheckRequest`, traced for runtime evidence) → ``properties`` (one run,
or hypothesis's examples) → ``evidence`` (did the anchored code run?) → ``text`` (the words of a failure).
The `ClaimVerdict` it returns is the record every view reads (``status``: the one vocabulary of results);
``records`` leaves what a run keeps from it, through ``progress`` (the last results and a learner's scores in the
user's data directory) and ``pictures``. The gate's report and approval are built over this room, from verdicts.

May import: source, format.
"""
