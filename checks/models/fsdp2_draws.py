"""Random FSDP2 models for guide 16's property claims, as plain data, and what the dim-0 spec says of them.

A *model* is a root module with bare parameters ``w0, w1, …`` and, optionally, one child ``c`` with its own
``c.w0, …``; ``fully_shard`` is applied to the child (when there is one) and to the root, so a model has one or
two parameter groups, each with its own all-gather. It is drawn in the pytest process as a dict of ints and
strs, sent to the rank pool as one request, and built there by `checks.workloads.drawn_fsdp2`
with the same values on every rank. Nothing here imports torch.

A model::

    {"root": [{"name": "w0", "shape": [9, 2], "dtype": "float32"}, ...],
     "child": [{"name": "w0", "shape": [0], "dtype": "bfloat16"}] | None}

Dim 0 runs from 0 to 9, so on two and four ranks it is often smaller than N, not divisible by N, or zero; the
other dims run from 0 to 3 (a zero there makes a parameter with rows but no elements). Each group is float32 or
bfloat16 throughout: ``FSDPParamGroup._init_mp_dtypes`` raises "FSDP expects uniform original parameter dtype"
for a group that mixes them (measured on 2.13.0), so the child and the root may differ but a group may not.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from checks.models.fsdp2_shards import Shape

DTYPES = ("float32", "bfloat16")
ITEMSIZE = {"float32": 4, "bfloat16": 2}
MAX_DIM0 = 9
MAX_REST = 3


@st.composite
def _param(draw: st.DrawFn, index: int, dtype: str) -> dict[str, Any]:
    d0 = draw(st.integers(0, MAX_DIM0))
    rest = draw(st.lists(st.integers(0, MAX_REST), max_size=2))
    return {"name": f"w{index}", "shape": [d0, *rest], "dtype": dtype}


@st.composite
def _params(draw: st.DrawFn, low: int, high: int) -> list[dict[str, Any]]:
    dtype = draw(st.sampled_from(DTYPES))  # one per group: FSDP2 refuses a group that mixes original dtypes
    return [draw(_param(i, dtype)) for i in range(draw(st.integers(low, high)))]


@st.composite
def _models(draw: st.DrawFn) -> dict[str, Any]:
    root = draw(_params(1, 3))
    child = draw(st.one_of(st.none(), _params(1, 3)))
    return {"root": root, "child": child}


def models() -> st.SearchStrategy[dict[str, Any]]:
    """The property claims' ``draw``: one model, as plain data."""
    return _models()


def params_of(model: dict[str, Any]) -> list[tuple[str, Shape, str]]:
    """``(fqn, shape, dtype)`` of every parameter, in ``named_parameters`` order (the root's, then the child's)."""
    found = [(p["name"], tuple(p["shape"]), p["dtype"]) for p in model["root"]]
    found += [(f"c.{p['name']}", tuple(p["shape"]), p["dtype"]) for p in model["child"] or []]
    return found


def groups_of(model: dict[str, Any]) -> dict[str, list[str]]:
    """The parameter groups ``fully_shard`` makes: the child's (when there is one) and the root's, by fqn."""
    groups = {"": [p["name"] for p in model["root"]]}
    if model["child"] is not None:
        groups = {"c": [f"c.{p['name']}" for p in model["child"]], **groups}
    return groups


def describe(model: dict[str, Any]) -> str:
    """One line a person can read: ``w0(9, 2) | w1(0,) bf16 | c: w0(3,)``."""

    def one(p: dict[str, Any]) -> str:
        return f"{p['name']}{tuple(p['shape'])}{' bf16' if p['dtype'] == 'bfloat16' else ''}"

    text = " | ".join(one(p) for p in model["root"])
    if model["child"] is not None:
        text += " | c: " + " | ".join(one(p) for p in model["child"])
    return text
