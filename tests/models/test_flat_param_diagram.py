"""The flat-parameter diagram (`checks.models.flat_param_diagram`): the fields it takes, and the picture, which
fits its width and says what the spec says."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from checks.models.flat_param import Param, flat_param
from checks.models.flat_param_diagram import diagram_lines, fields_from_spec, layout_fields
from checks.models.flat_param_draws import spec_of, units

MIXED = [
    Param("w0", (2, 5)),
    Param("w1", (0,)),
    Param("m0.weight", (3, 5)),
    Param("m0.bias", (3,)),
    Param("m1.weight", (7, 3)),
    Param("m2.weight", (7, 3), tied_to="m1.weight"),
]


def test_fields_of_the_mixed_unit_at_4() -> None:
    fields = fields_from_spec(flat_param(MIXED, 4, use_orig_params=True))
    kinds = [(s["kind"], s["offset"], s["numel"]) for s in fields["segments"]]
    assert kinds == [
        ("param", 0, 10), ("align", 10, 2), ("param", 12, 0), ("param", 12, 15), ("align", 27, 1),
        ("param", 28, 3), ("align", 31, 1), ("param", 32, 21), ("tail", 53, 3),
    ]  # fmt: skip
    assert [(r["start"], r["end"]) for r in fields["ranks"]] == [(0, 14), (14, 28), (28, 42), (42, 56)]
    assert fields["shared"] == [{"fqn": "m2.weight", "to": "m1.weight"}]


def test_the_mixed_unit_is_drawn_as_the_guide_shows() -> None:
    lines = diagram_lines(fields_from_spec(flat_param(MIXED, 4, use_orig_params=True), "the unit"))
    assert lines[0] == "the unit: 56 elements = 49 in 5 parameters + 4 alignment + 3 world-size padding; 4 ranks x 14"
    assert lines[1] == "AAAAAAAAAA..CCCCCCCCCCCCCCC.DDD.EEEEEEEEEEEEEEEEEEEEE~~~"
    assert lines[2] == "|r0           |r1           |r2           |r3"  # each `|` above its shard's first element
    assert not any(line[:1].isspace() for line in lines)  # an expect block keeps lines from their first character
    assert "B      12      0  w1 0                r0 in shard, 0 elements" in lines
    assert "E      32     21  m1.weight 7x3       r2 4+10  r3 0+11" in lines
    assert lines[-1] == "=                 m2.weight is m1.weight (tied): not flattened again"


def test_padding_added_by_sharding_is_its_own_kind() -> None:
    fields = fields_from_spec(flat_param(MIXED, 4, use_orig_params=False))
    assert fields["segments"][-1] == {"kind": "shard-pad", "offset": 49, "numel": 3}
    assert "_ shard padding" in "\n".join(diagram_lines(fields))


def test_a_zero_size_parameter_on_a_boundary_is_in_no_shard() -> None:
    fields = fields_from_spec(
        flat_param([Param("a", (4,)), Param("z", (0,)), Param("b", (4,))], 2, use_orig_params=False)
    )
    assert any(line.endswith("in no shard") for line in diagram_lines(fields))


def test_long_units_are_scaled_to_the_width() -> None:
    spec = flat_param([Param(f"block.{i}.weight", (1000 + i,)) for i in range(6)], 4, use_orig_params=True)
    lines = diagram_lines(fields_from_spec(spec), width=80)
    assert all(len(line) <= 80 for line in lines)
    legend = next(line for line in lines if line.startswith("1 char"))
    assert legend.startswith("1 char = 76 elements")  # ceil(6,024 elements / 80 columns)


def test_real_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="one fqn"):
        layout_fields(fqns=["a"], shapes=[[1]], numels_with_padding=[1, 1], is_padding_mask=[False, False],
                      world_size=2, shard_numel=1)  # fmt: skip
    with pytest.raises(ValueError, match="40 columns"):
        diagram_lines(fields_from_spec(flat_param(MIXED, 2, use_orig_params=True)), width=30)


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(units())
def test_every_drawn_unit_fits_100_columns_and_adds_up(unit: dict) -> None:
    for world_size in (2, 4):
        spec = spec_of(unit, world_size)
        fields = fields_from_spec(spec)
        assert sum(s["numel"] for s in fields["segments"]) == fields["padded_numel"]
        assert fields["padded_numel"] == (spec.padded_unsharded_numel or spec.flat_numel)
        lines = diagram_lines(fields)
        assert all(len(line) <= 100 for line in lines)
        header = next(i for i, line in enumerate(lines) if line.startswith("id offset"))
        assert len(lines) - header - 1 == len(fields["segments"]) + len(spec.shared)


def test_the_title_and_legend_continue_on_the_next_row_never_cropped() -> None:
    lines = diagram_lines(fields_from_spec(flat_param(MIXED, 4, use_orig_params=True), "the unit"), width=60)
    assert all(len(line) <= 60 for line in lines) and not any(line.endswith("…") for line in lines[:6])
    words = " ".join(lines).split()
    assert "world-size" in words and "|rN" in words and "shard" in words  # the legend's last key is kept
