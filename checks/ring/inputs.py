"""Each rank's tensor for one drawn example, and what their sum is.

Values are integers in [-4, 4]: with at most 4 ranks every partial sum is an integer of magnitude at most 16, which
float32, float64, bfloat16 (8 significant bits: exact to 256) and int64 all hold exactly. Floating-point addition
is not associative, and the ring adds chunk c in the order c, c+1, …, c−1 (a different order on every chunk),
while gloo's all-reduce has its own order; with values like these no order rounds, so the results must be equal
bit for bit, and a difference is a wrong sum, never rounding.
"""

from __future__ import annotations

from typing import Any

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "int64": torch.int64}
LOW, HIGH = -4, 4


def rank_values(example: dict[str, Any], rank: int) -> torch.Tensor:
    """Rank ``rank``'s tensor: its own generator (the example's seed and the rank), so any rank can rebuild it."""
    generator = torch.Generator().manual_seed(example["seed"] * 64 + rank)
    values = torch.randint(LOW, HIGH + 1, (example["numel"],), generator=generator)
    return values.to(DTYPES[example["dtype"]])


def expected_sum(example: dict[str, Any], world_size: int) -> torch.Tensor:
    """The sum of every rank's tensor, computed locally from the seeds (in int64, then cast: exact)."""
    total = torch.zeros(example["numel"], dtype=torch.int64)
    for r in range(world_size):
        total += rank_values({**example, "dtype": "int64"}, r)
    return total.to(DTYPES[example["dtype"]])
