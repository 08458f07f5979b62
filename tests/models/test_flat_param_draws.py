"""The drawn units of guide 12 (`checks.models.flat_param_draws`): plain data, every kind the issue asks for,
and what the spec says of them (the walk order, the ties, the frozen parameters)."""

from __future__ import annotations

import pickle

from hypothesis import given, settings

from checks.models.flat_param import Param
from checks.models.flat_param_draws import describe, params_of, spec_of, total_numel, units

FAST = settings(max_examples=150, deadline=None, database=None, derandomize=True)


def _plain(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, (int, str, bool))


@FAST
@given(units())
def test_a_unit_is_plain_picklable_data_the_spec_can_build(unit: dict) -> None:
    assert _plain(unit) and pickle.loads(pickle.dumps(unit)) == unit
    params = params_of(unit)
    assert any(p.numel and p.requires_grad for p in params if p.tied_to is None)
    for world_size in (2, 4):
        spec = spec_of(unit, world_size)
        assert spec.flat_numel >= total_numel(unit) and spec.requires_grad
    assert describe(unit).startswith(("orig", "flat"))


@FAST
@given(units())
def test_frozen_parameters_only_with_use_orig_params(unit: dict) -> None:
    if not unit["use_orig_params"]:
        assert all(p.requires_grad for p in params_of(unit))


@FAST
@given(units())
def test_ties_name_an_earlier_linear_or_embedding_weight(unit: dict) -> None:
    kinds = {f"m{i}.weight": m["kind"] for i, m in enumerate(unit["modules"])}
    for i, m in enumerate(unit["modules"]):
        if m["kind"] == "tied":
            assert int(m["to"][1:].split(".")[0]) < i and kinds[m["to"]] in ("linear", "embedding")
    assert all(m["dim"] % 2 == 0 for m in unit["modules"] if m["kind"] == "layernorm")


def test_every_kind_of_unit_the_issue_asks_for_is_drawn() -> None:
    seen: set[str] = set()

    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(units())
    def collect(unit: dict) -> None:
        params = params_of(unit)
        seen.update(m["kind"] for m in unit["modules"])
        seen.add("orig" if unit["use_orig_params"] else "flat")
        seen.add(unit["param_dtype"])
        if unit["root"]:
            seen.add("root-params")
        if any(p.numel == 0 for p in params):
            seen.add("zero-size")
        if any(not p.requires_grad for p in params):
            seen.add("frozen")
        for n in (2, 4):
            seen.add(f"divides-{n}" if spec_of(unit, n).params_end % n == 0 else f"pads-{n}")

    collect()
    want = {"linear", "embedding", "layernorm", "bare", "tied", "orig", "flat", "float32", "bfloat16"}
    want |= {"root-params", "zero-size", "frozen", "divides-2", "pads-2", "divides-4", "pads-4"}
    assert want <= seen, want - seen


def test_walk_order_root_first_and_a_tie_is_a_second_sighting() -> None:
    unit = {
        "use_orig_params": True,
        "param_dtype": "bfloat16",
        "root": [{"name": "w0", "shape": [3], "frozen": True}],
        "modules": [
            {"kind": "linear", "in": 2, "out": 3, "bias": True, "frozen": False},
            {"kind": "layernorm", "dim": 2, "frozen": True},
            {"kind": "tied", "to": "m0.weight"},
        ],
    }
    assert params_of(unit) == [
        Param("w0", (3,), False),
        Param("m0.weight", (3, 2)),
        Param("m0.bias", (3,)),
        Param("m1.weight", (2,), False),
        Param("m1.bias", (2,), False),
        Param("m2.weight", (3, 2), True, tied_to="m0.weight"),
    ]
    spec = spec_of(unit, 2)
    # bf16 compute aligns fp32 parameters to 8 elements: 3 -> 8, 14 -> 16 (bias), 19 -> 24, 26 -> 32; ends at 34.
    assert spec.offsets == (0, 8, 16, 24, 32) and spec.aligned_numel == 8 and spec.flat_numel == 34
    assert [(t.fqn, t.prim_fqn) for t in spec.shared] == [("m2.weight", "m0.weight")]
    assert total_numel(unit) == 3 + 6 + 3 + 2 + 2


def test_shrinking_goes_toward_one_small_module() -> None:
    # Hypothesis' simplest unit: no root parameters and a single small module, so a shrunk failure is readable.
    from hypothesis import find

    simplest = find(units(), lambda u: True, settings=settings(database=None, derandomize=True))
    assert simplest["root"] == [] and len(simplest["modules"]) == 1 and total_numel(simplest) <= 8
