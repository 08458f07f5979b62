"""fp32 summation orders: every value a sum of a few fp32 terms can take, for claims that two reductions differ
by summation order alone."""

from __future__ import annotations

import itertools

import torch


def pairwise_sums(terms: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every value a sum of ``terms`` can take in fp32 when it is computed as a tree of pairwise additions, in
    any order and grouping (15 trees for four terms; addition of two is commutative, so a tree is unordered)."""
    if len(terms) == 1:
        return [terms[0]]
    out, seen = [], set()
    indices = range(len(terms))
    for k in range(1, len(terms)):
        for left in itertools.combinations(indices, k):
            right = tuple(i for i in indices if i not in left)
            key = frozenset((left, right))
            if key in seen:
                continue
            seen.add(key)
            for a in pairwise_sums([terms[i] for i in left]):
                for b in pairwise_sums([terms[i] for i in right]):
                    out.append(a + b)
    return out
