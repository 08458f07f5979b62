"""The reshard model of guide 18: where each unit goes after forward, its all-gathers, its bytes."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models import fsdp2_reshard as model

UNITS = ("root", "blocks.0", "blocks.1", "blocks.2")
TINY = {"root": 3528, "blocks.0": 16020, "blocks.1": 16020, "blocks.2": 16020}  # mini_gpt tiny, N = 2 or 4


@pytest.mark.parametrize(
    ("setting", "n", "effective", "warns"),
    [(None, 2, True, False), (True, 2, True, False), (False, 2, False, False), (1, 2, False, True), (2, 2, True, False),
     (2, 4, 2, False), (4, 4, True, False), (1, 4, False, True)],
)  # fmt: skip
def test_resolve(setting: bool | int | None, n: int, effective: bool | int, warns: bool) -> None:
    assert model.resolve(setting, n) == (effective, warns)


@pytest.mark.parametrize(("setting", "n"), [(0, 2), (3, 2), (3, 4), (5, 4), (-1, 4)])
def test_an_int_that_does_not_divide_is_refused(setting: int, n: int) -> None:
    with pytest.raises(ValueError, match="factor"):
        model.resolve(setting, n)


def test_the_root_is_kept_only_under_the_default() -> None:
    assert model.post_forward_world_size(None, 4, is_root=True) is None
    assert model.post_forward_world_size(None, 4, is_root=False) == 4
    assert model.post_forward_world_size(True, 4, is_root=True) == 4
    assert model.post_forward_world_size(2, 4, is_root=True) == 2


@pytest.mark.parametrize(("setting", "backward"), [(True, 4), (None, 3), (False, 0), (1, 0), (2, 4)])
def test_backward_all_gathers_at_2(setting: bool | int | None, backward: int) -> None:
    gathers = model.all_gathers(UNITS, "root", setting, 2)
    assert gathers["forward"] == [(u, 2) for u in UNITS]
    assert len(gathers["backward"]) == backward


def test_backward_order_is_root_then_blocks_from_the_last() -> None:
    assert [u for u, _ in model.all_gathers(UNITS, "root", 2, 4)["backward"]] == ["root", "blocks.2", "blocks.1",
                                                                                  "blocks.0"]  # fmt: skip
    assert {n for _, n in model.all_gathers(UNITS, "root", 2, 4)["backward"]} == {2}


@pytest.mark.parametrize(
    ("setting", "n", "held", "step"),
    [(True, 2, 0, 309528), (None, 2, 14112, 302472), (False, 2, 206352, 206352), (True, 4, 0, 464292),
     (2, 4, 103176, 412704), (None, 4, 14112, 453708), (False, 4, 206352, 309528)],
)  # fmt: skip
def test_the_guides_numbers(setting: bool | int | None, n: int, held: int, step: int) -> None:
    assert model.held_after_forward(TINY, "root", setting, n, 4) == held
    assert model.ring_step_bytes(TINY, "root", setting, n, 4)["step"] == step


@given(st.sampled_from([2, 4, 8, 16]), st.data())
def test_an_int_sits_between_true_and_false(n: int, data: st.DataObject) -> None:
    k = data.draw(st.sampled_from([d for d in range(2, n) if n % d == 0] or [n]))
    sizes = {u: 16 * n * (i + 1) for i, u in enumerate(UNITS)}
    held = {s: model.held_after_forward(sizes, "root", s, n, 4) for s in (True, k, False)}
    sent = {s: model.ring_step_bytes(sizes, "root", s, n, 4)["step"] for s in (True, k, False)}
    assert held[True] <= held[k] <= held[False]
    assert sent[False] <= sent[k] <= sent[True]
    assert isinstance(sent[k], Fraction)


def test_the_unsharded_peak_of_guide_17s_sequences() -> None:
    from checks.models.fsdp2_prefetch import step_sequence

    blocks = ("blocks.0", "blocks.1", "blocks.2")
    peaks = {s: model.unsharded_peak(step_sequence(blocks, "root", reshard_after_forward=s), TINY, 4)
             for s in (True, None, False)}  # fmt: skip
    assert peaks == {True: 78192, None: 78192, False: 206352}


def test_a_unit_used_twice() -> None:
    uses = ["blocks.0", "blocks.1", "blocks.1", "blocks.2"]
    step = model.repeated_use_step(uses, "root", True)
    assert step["forward"] == ["root", *uses]
    assert step["backward"] == ["root", "blocks.2", "blocks.1", "blocks.1", "blocks.0"]
    assert step["reduce_scatter"] == ["blocks.2", "blocks.1", "blocks.0", "root"]
    assert model.repeated_use_step(uses, "root", None)["backward"] == step["backward"][1:]
    with pytest.raises(ValueError, match="unsharded"):
        model.repeated_use_step(uses, "root", False)
