"""Random all-reduce inputs for guide 14's property claims, as plain data drawn in the pytest process.

An example is ``{"numel": 7, "dtype": "bfloat16", "seed": 3}``: the tensor's size, its dtype, and the seed every
rank builds its own values from (`checks.ring.inputs.rank_values`: small integers, different on each rank).
Sizes run from 1 (fewer elements than ranks: some chunks are all padding) up to a few thousand, so most examples
are not divisible by 3 or 4 and many not by 2; sizes shrink towards 1. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

DTYPES = ("float32", "float64", "bfloat16", "int64")
ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "int64": 8}
MAX_NUMEL = 4099


def examples() -> st.SearchStrategy[dict[str, Any]]:
    """The property claims' ``draw``: one all-reduce input (size, dtype, seed)."""
    numel = st.one_of(st.integers(1, 13), st.integers(14, MAX_NUMEL))
    return st.fixed_dictionaries({"numel": numel, "dtype": st.sampled_from(DTYPES), "seed": st.integers(0, 2**16)})


def nbytes(example: dict[str, Any]) -> int:
    """S: the tensor's bytes."""
    return example["numel"] * ITEMSIZE[example["dtype"]]
