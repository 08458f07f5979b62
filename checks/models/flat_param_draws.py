"""Random FSDP1 units for guide 12's property claims, as plain data, and what the flat-parameter spec says of them.

A *unit* is one module that FSDP1 wraps whole, so it gets one ``FlatParameter``. It is drawn here, in the pytest
process, as a dict of ints, strs and bools (picklable, printable, shrinkable), sent to the rank pool as one
request, and built there by `checks.workloads.drawn_unit.build_unit` with the same values on every rank.
Nothing here imports torch: the spec (`checks.models.flat_param`) is the expected value, and this module only
says which parameters a drawn unit has, in the order FSDP walks them.

A unit::

    {
        "use_orig_params": True,
        "param_dtype": "float32" | "bfloat16",   # MixedPrecision.param_dtype (None for float32)
        "root": [{"name": "w0", "shape": [2, 0], "frozen": False}, ...],   # bare parameters of the root itself
        "modules": [                                                      # children m0, m1, ... in order
            {"kind": "linear", "in": 3, "out": 2, "bias": True, "frozen": False},
            {"kind": "embedding", "num": 4, "dim": 3, "frozen": False},
            {"kind": "layernorm", "dim": 4, "frozen": False},
            {"kind": "bare", "shape": [2, 3], "frozen": False},
            {"kind": "tied", "to": "m0.weight"},   # a module whose `weight` is that earlier parameter
        ],
    }

Frozen parameters (``requires_grad=False``) appear only with ``use_orig_params=True``: without it FSDP refuses a
flat parameter that mixes them (spec rule 8). Every unit has at least one trainable parameter with elements, so
a flat parameter can be built (rule 5) and an optimizer has something to step. LayerNorm widths are even, so the
checks can feed it rows of ±1 that it normalises exactly (see `checks.workloads.drawn_unit`).
"""

from __future__ import annotations

from math import prod
from typing import Any

from hypothesis import strategies as st

from checks.models.flat_param import FlatParamSpec, Param, flat_param

KINDS = ("linear", "embedding", "layernorm", "bare", "tied")
PARAM_DTYPES = ("float32", "bfloat16")
MAX_DIM = 5  # small sides keep every example's model tiny and its values exact (`checks.workloads.drawn_unit` says why)


def _dims(low: int = 0) -> st.SearchStrategy[int]:
    return st.integers(low, MAX_DIM)


def _shapes() -> st.SearchStrategy[list[int]]:
    return st.lists(_dims(), min_size=1, max_size=2)


@st.composite
def _module(draw: st.DrawFn, frozen_ok: bool, tie_targets: list[str]) -> dict[str, Any]:
    kind = draw(st.sampled_from(KINDS if tie_targets else KINDS[:-1]))
    frozen = draw(st.booleans()) if frozen_ok else False
    if kind == "linear":
        return {"kind": kind, "in": draw(_dims()), "out": draw(_dims()), "bias": draw(st.booleans()), "frozen": frozen}
    if kind == "embedding":
        return {"kind": kind, "num": draw(_dims(1)), "dim": draw(_dims()), "frozen": frozen}
    if kind == "layernorm":
        return {"kind": kind, "dim": 2 * draw(st.integers(1, 2)), "frozen": frozen}
    if kind == "bare":
        return {"kind": kind, "shape": draw(_shapes()), "frozen": frozen}
    return {"kind": kind, "to": draw(st.sampled_from(tie_targets))}


@st.composite
def _units(draw: st.DrawFn, max_modules: int) -> dict[str, Any]:
    use_orig_params = draw(st.booleans())
    param_dtype = draw(st.sampled_from(PARAM_DTYPES))
    frozen_ok = use_orig_params
    root = [
        {"name": f"w{i}", "shape": draw(_shapes()), "frozen": draw(st.booleans()) if frozen_ok else False}
        for i in range(draw(st.integers(0, 2)))
    ]
    modules: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, max_modules))):
        modules.append(draw(_module(frozen_ok, _tie_targets(modules))))
    unit = {"use_orig_params": use_orig_params, "param_dtype": param_dtype, "root": root, "modules": modules}
    if not any(p.numel and p.requires_grad for p in params_of(unit) if p.tied_to is None):
        # Something must be trainable and non-empty: a last bare parameter, drawn so it shrinks to one element.
        unit["modules"].append({"kind": "bare", "shape": [draw(st.integers(1, MAX_DIM))], "frozen": False})
    return unit


def units(max_modules: int = 4) -> st.SearchStrategy[dict[str, Any]]:
    """The property claims' ``draw``: one FSDP1 unit, as plain data."""
    return _units(max_modules)


def _tie_targets(modules: list[dict[str, Any]]) -> list[str]:
    """Earlier weights a ``tied`` module may share: Linear and Embedding weights (the classic tied head)."""
    return [f"m{i}.weight" for i, m in enumerate(modules) if m["kind"] in ("linear", "embedding")]


def _module_params(index: int, module: dict[str, Any]) -> list[Param]:
    """The parameters of child ``m{index}``, in registration order (an ``nn.Linear`` registers weight, then bias)."""
    name = f"m{index}"
    grad = not module.get("frozen", False)
    kind = module["kind"]
    if kind == "linear":
        shapes = [("weight", (module["out"], module["in"]))]
        if module["bias"]:
            shapes.append(("bias", (module["out"],)))
    elif kind == "embedding":
        shapes = [("weight", (module["num"], module["dim"]))]
    elif kind == "layernorm":
        shapes = [("weight", (module["dim"],)), ("bias", (module["dim"],))]
    elif kind == "bare":
        shapes = [("weight", tuple(module["shape"]))]
    else:
        raise ValueError(f"a tied module has no parameter of its own: {module}")
    return [Param(f"{name}.{p}", shape, grad) for p, shape in shapes]


def params_of(unit: dict[str, Any]) -> list[Param]:
    """The unit's parameters in the order FSDP's handle walks them (spec rule 1): the root's own first, then each
    child's; a tied module's ``weight`` is a second sighting of its target."""
    params = [Param(p["name"], tuple(p["shape"]), not p["frozen"]) for p in unit["root"]]
    by_fqn: dict[str, Param] = {}
    for i, module in enumerate(unit["modules"]):
        if module["kind"] == "tied":
            target = by_fqn[module["to"]]
            params.append(Param(f"m{i}.weight", target.shape, target.requires_grad, tied_to=target.fqn))
            continue
        for param in _module_params(i, module):
            by_fqn[param.fqn] = param
            params.append(param)
    return params


def spec_of(unit: dict[str, Any], world_size: int) -> FlatParamSpec:
    """The spec's flat parameter for the unit on ``world_size`` ranks (FULL_SHARD; fp32 parameters)."""
    compute = None if unit["param_dtype"] == "float32" else unit["param_dtype"]
    return flat_param(
        params_of(unit), world_size, use_orig_params=unit["use_orig_params"], dtype="float32", compute_dtype=compute
    )


def describe(unit: dict[str, Any]) -> str:
    """One line a person can read: ``orig bf16 | w0(2,0) | m0 Linear(3→2) | m1 tied→m0.weight``."""
    parts = [("orig" if unit["use_orig_params"] else "flat") + (" bf16" if unit["param_dtype"] != "float32" else "")]
    parts += [f"{p['name']}{tuple(p['shape'])}{'*' if p['frozen'] else ''}" for p in unit["root"]]
    for i, m in enumerate(unit["modules"]):
        star = "*" if m.get("frozen") else ""
        kind = m["kind"]
        if kind == "linear":
            parts.append(f"m{i} Linear({m['in']}→{m['out']}{'' if m['bias'] else ', no bias'}){star}")
        elif kind == "embedding":
            parts.append(f"m{i} Embedding({m['num']}, {m['dim']}){star}")
        elif kind == "layernorm":
            parts.append(f"m{i} LayerNorm({m['dim']}){star}")
        elif kind == "bare":
            parts.append(f"m{i} bare{tuple(m['shape'])}{star}")
        else:
            parts.append(f"m{i} tied→{m['to']}")
    return " | ".join(parts)


def total_numel(unit: dict[str, Any]) -> int:
    """Elements of the unit's distinct parameters (what the flat parameter holds before any padding)."""
    return sum(prod(p.shape) for p in params_of(unit) if p.tied_to is None)
