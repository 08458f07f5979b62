"""How many units' whole unsharded buffers add up to a measured byte count (guides 04, 06): a memory peak read
as a number of units, without knowing which units they are."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations


def unit_counts(nbytes: int, sizes: Mapping[str, int]) -> set[int]:
    """How many units' whole unsharded buffers add up to ``nbytes``, over every subset of units that does."""
    names = list(sizes)
    return {k for k in range(len(names) + 1) for subset in combinations(names, k) if sum(sizes[n] for n in subset)
            == nbytes}  # fmt: skip
