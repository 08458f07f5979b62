"""The communication-volume model: per-step bytes per strategy from shapes, padding and N, without torch."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks.models import comm_volume as cv

ROOT = "root"


def tiny_shapes(vocab: int = 32, block: int = 64, embd: int = 36, layers: int = 3) -> dict[str, list[tuple[int, ...]]]:
    """mini_gpt tiny's parameter shapes per unit, written out from its config (vocab 32, block 64, n_embd 36)."""
    e = embd
    one_block = [(e,), (e,), (3 * e, e), (3 * e,), (e, e), (e,), (e,), (e,), (4 * e, e), (4 * e,), (e, 4 * e), (e,)]
    return {ROOT: [(vocab, e), (block, e), (e,), (e,)], **{f"blocks.{i}": list(one_block) for i in range(layers)}}


TOY = {ROOT: [(5, 5), (5,)], "0": [(7, 3), (7,)], "1": [(5, 7), (5,)]}


def volume(strategy: str, shapes: dict, n: int, **kwargs) -> cv.Volume:
    return cv.step(strategy, shapes, n, root=ROOT, **kwargs)


def test_tiny_sizes() -> None:
    numels = {u: sum(a * (b[0] if b else 1) for a, *b in shapes) for u, shapes in tiny_shapes().items()}
    assert numels == {ROOT: 3528, "blocks.0": 16020, "blocks.1": 16020, "blocks.2": 16020}


@pytest.mark.parametrize(("n", "ring"), [(2, 206352), (4, 309528)])
def test_ddp_is_two_n_minus_one_over_n_s(n: int, ring: int) -> None:
    ddp = volume("ddp", tiny_shapes(), n)
    assert (ddp.logical, ddp.ring) == (206352, ring)
    assert ddp.ring == Fraction(2 * (n - 1), n) * 4 * 51588


@pytest.mark.parametrize("n", [2, 4])
def test_tiny_ratios_are_the_closed_forms(n: int) -> None:
    ddp = volume("ddp", tiny_shapes(), n)
    expected = {
        "fsdp2": Fraction(3, 2),
        "full-shard": Fraction(4201, 2866),
        "fsdp2-default": Fraction(4201, 2866),
        "shard-grad-op": Fraction(1),
        "fsdp2-no-reshard": Fraction(1),
    }
    for strategy, ratio in expected.items():
        assert cv.ratio(volume(strategy, tiny_shapes(), n), ddp) == ratio == cv.textbook_ratio(strategy, 51588, 3528)
    assert volume("fsdp2", tiny_shapes(), n).logical == 3 * ddp.logical


def test_counts_per_phase() -> None:
    assert volume("full-shard", tiny_shapes(), 2).counts() == {
        "forward": {"all_gather": 4}, "backward": {"all_gather": 3, "reduce_scatter": 4}}  # fmt: skip
    assert volume("fsdp2", tiny_shapes(), 2).counts()["backward"] == {"all_gather": 4, "reduce_scatter": 4}
    assert volume("shard-grad-op", tiny_shapes(), 2).counts()["backward"] == {"reduce_scatter": 4}
    assert volume("ddp", tiny_shapes(), 2).counts() == {"forward": {}, "backward": {"all_reduce": 1}}


def test_gloo_counts_reduce_scatters_as_all_reduces() -> None:
    ddp = cv.gloo_step(volume("ddp", tiny_shapes(), 2))
    assert cv.ratio(cv.gloo_step(volume("shard-grad-op", tiny_shapes(), 2)), ddp) == Fraction(3, 2)
    assert cv.ratio(cv.gloo_step(volume("fsdp2", tiny_shapes(), 2)), ddp) == 2
    assert cv.ratio(cv.gloo_step(volume("full-shard", tiny_shapes(), 2)), ddp) == Fraction(4 * 51588 - 3528, 2 * 51588)


def test_the_toy_pads_at_4() -> None:
    rings = {s: volume(s, TOY, 4, use_orig_params=False).ring for s in ("ddp", "full-shard", "shard-grad-op", "fsdp2")}
    assert rings == {"ddp": 588, "full-shard": 804, "shard-grad-op": 600, "fsdp2": 1296}
    assert cv.fsdp2_padded(TOY, 4) == {ROOT: 48, "0": 32, "1": 64}


def test_buckets_do_not_change_bytes() -> None:
    assert cv.ddp_step(100, 4, 4, [60, 40]).ring == cv.ddp_step(100, 4, 4).ring
    with pytest.raises(ValueError, match="do not add up"):
        cv.ddp_step(100, 4, 4, [60])


units = st.dictionaries(
    st.sampled_from([ROOT, "a", "b", "c"]),
    st.lists(st.tuples(st.integers(1, 9), st.integers(1, 5)), min_size=1, max_size=3),
    min_size=1,
).filter(lambda d: ROOT in d)


@settings(max_examples=40, deadline=None)
@given(units, st.sampled_from([2, 3, 4, 8]))
def test_without_padding_the_closed_forms_hold_at_any_n(raw: dict, n: int) -> None:
    # Every dim 0 a multiple of 4N: neither FSDP1 (alignment, world size) nor FSDP2 (dim 0) pads.
    shapes = {u: [(4 * n * a, b) for a, b in ps] for u, ps in raw.items()}
    theta = sum(r * c for ps in shapes.values() for r, c in ps)
    root = sum(r * c for r, c in shapes[ROOT])
    ddp = volume("ddp", shapes, n)
    for strategy in cv.STRATEGIES:
        assert cv.ratio(volume(strategy, shapes, n), ddp) == cv.textbook_ratio(strategy, theta, root)


@settings(max_examples=40, deadline=None)
@given(units, st.sampled_from([2, 3, 4]))
def test_padding_only_adds(raw: dict, n: int) -> None:
    shapes = {u: [(a, b) for a, b in ps] for u, ps in raw.items()}
    theta = sum(a * b for ps in shapes.values() for a, b in ps)
    root = sum(a * b for a, b in shapes[ROOT])
    ddp = volume("ddp", shapes, n)
    for strategy in cv.STRATEGIES[1:]:
        assert cv.ratio(volume(strategy, shapes, n), ddp) >= cv.textbook_ratio(strategy, theta, root)


def test_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        volume("zero4", tiny_shapes(), 2)


# -- steps inside no_sync ------------------------------------------------------------------------------------------
def summary(volumes: list[cv.Volume]) -> list[tuple[list[str], list[str], list[str], int]]:
    """Per step: units all-gathered in forward, in backward, reduce-scattered, and elements all-reduced."""
    return [
        (
            [o.unit for o in v.ops if o.op == "all_gather" and not o.backward],
            [o.unit for o in v.ops if o.op == "all_gather" and o.backward],
            [o.unit for o in v.ops if o.op == "reduce_scatter"],
            sum(o.numel for o in v.ops if o.op == "all_reduce"),
        )
        for v in volumes
    ]


SYNCS = [False, False, True, True]  # two micro-batches inside no_sync, the synced one, then a normal step


def test_full_shard_gathers_every_step_and_reduces_only_when_synced() -> None:
    steps = cv.accumulation_steps("full-shard", TOY, 2, SYNCS, root=ROOT)
    every = [ROOT, "0", "1"]
    assert summary(steps) == [
        (every, ["1", "0"], [], 0),
        (every, ["1", "0"], [], 0),
        (every, ["1", "0"], ["1", "0", ROOT], 0),
        (every, ["1", "0"], ["1", "0", ROOT], 0),
    ]
    # A synced step is the ordinary step, padded sizes included (28 → 28 aligned, 40 → 40, 30 → 32 at N=2).
    assert steps[2] == cv.step("full-shard", TOY, 2, root=ROOT)


def test_shard_grad_op_keeps_what_no_sync_gathered_until_a_synced_step_frees_it() -> None:
    steps = cv.accumulation_steps("shard-grad-op", TOY, 2, SYNCS, root=ROOT)
    assert summary(steps) == [
        ([ROOT, "0", "1"], [], [], 0),  # gathered once, kept: no_sync frees nothing
        ([], [], [], 0),  # still unsharded: nothing to gather
        ([], [], ["1", "0", ROOT], 0),  # the synced step reduces, and frees
        ([ROOT, "0", "1"], [], ["1", "0", ROOT], 0),  # an ordinary step again
    ]


def test_ddp_inside_no_sync_communicates_nothing() -> None:
    steps = cv.accumulation_steps("ddp", TOY, 2, SYNCS, root=ROOT)
    assert [s[3] for s in summary(steps)] == [0, 0, 98, 98]  # 25 + 5 + 21 + 7 + 35 + 5 elements


def test_a_strategy_whose_no_sync_is_not_modelled_is_refused() -> None:
    with pytest.raises(ValueError, match="modelled for ddp, full-shard, shard-grad-op, not 'fsdp2'"):
        cv.accumulation_steps("fsdp2", TOY, 2, SYNCS, root=ROOT)


# -- FSDP2 with a setting per unit, and ints -------------------------------------------------------------------------
def test_fsdp2_backward_gathers_each_unit_over_the_ranks_it_was_resharded_to() -> None:
    # N=4: the root kept (None), unit 0 resharded to 2 ranks, unit 1 kept (False). FSDP2 pads each parameter's
    # dim 0 to a multiple of 4: root (5,5)+(5,) → 8·5 + 8 = 48; 0: (7,3)+(7,) → 8·3 + 8 = 32; 1: (5,7)+(5,) → 8·7 + 8.
    v = cv.fsdp2_step(TOY, 4, {ROOT: None, "0": 2, "1": False}, root=ROOT)
    sizes = {ROOT: 48, "0": 32, "1": 64}
    assert [(o.op, o.unit, o.numel, o.ranks(4), o.backward) for o in v.ops] == [
        ("all_gather", ROOT, 48, 4, False),
        ("all_gather", "0", 32, 4, False),
        ("all_gather", "1", 64, 4, False),
        ("all_gather", "0", 32, 2, True),  # from the 2 ranks unit 0 kept its post-forward shard on
        ("reduce_scatter", "1", 64, 4, True),
        ("reduce_scatter", "0", 32, 4, True),
        ("reduce_scatter", ROOT, 48, 4, True),
    ]
    # Ring bytes: (N−1)/N · S for each op of the whole world, (k−1)/k · S for the post-forward gather over k = 2.
    whole = sum(sizes.values()) * 4
    assert v.ring == Fraction(3, 4) * whole * 2 + Fraction(1, 2) * 32 * 4


def test_fsdp2_step_with_one_setting_is_the_strategys_step() -> None:
    for setting, strategy in ((True, "fsdp2"), (None, "fsdp2-default"), (False, "fsdp2-no-reshard")):
        assert cv.fsdp2_step(TOY, 4, setting, root=ROOT) == cv.step(strategy, TOY, 4, root=ROOT)


def test_fsdp2_settings_the_model_cannot_take_are_refused() -> None:
    with pytest.raises(ValueError, match=r"names no setting for \['0', '1'\]"):
        cv.fsdp2_step(TOY, 4, {ROOT: True}, root=ROOT)
    with pytest.raises(ValueError, match="must be a factor of 4, not 3"):
        cv.fsdp2_step(TOY, 4, 3, root=ROOT)


def test_fsdp2_step_sends_what_guide_18s_reshard_model_says() -> None:
    """Guide 18 holds `fsdp2_reshard.ring_step_bytes` to real runs for every setting, the int 2 on four ranks
    included; the per-unit model agrees with it where both apply."""
    from checks.models import fsdp2_reshard

    padded = cv.fsdp2_padded(TOY, 4)
    for setting in (True, None, False, 2, 1, 4):
        want = fsdp2_reshard.ring_step_bytes(padded, ROOT, setting, 4, element_bytes=4)["step"]
        assert cv.fsdp2_step(TOY, 4, setting, root=ROOT).ring == want, setting


# -- units without parameters ------------------------------------------------------------------------------------------
TOY_LAYERS = {"0": [(7, 3), (7,)], "1": [(5, 7), (5,)], "2": [(5, 5), (5,)]}  # 28, 40 and 30 elements


def test_a_root_without_parameters_issues_nothing_and_full_shard_keeps_nothing() -> None:
    # Worked by hand at N=2 (28, 40 and 30 are even, so no padding): three all-gathers in forward, three again in
    # backward (no unit is the kept root), three reduce-scatters; nothing of size 0.
    volume = cv.step("full-shard", {"root": [], **TOY_LAYERS}, 2, root="root", use_orig_params=False)
    assert [(op.op, op.numel, op.backward) for op in volume.ops] == [
        ("all_gather", 28, False), ("all_gather", 40, False), ("all_gather", 30, False),
        ("all_gather", 30, True), ("all_gather", 40, True), ("all_gather", 28, True),
        ("reduce_scatter", 30, True), ("reduce_scatter", 40, True), ("reduce_scatter", 28, True),
    ]  # fmt: skip
    with_root = cv.step("full-shard", {"root": [(4,)], **TOY_LAYERS}, 2, root="root", use_orig_params=False)
    assert sum(op.backward and op.op == "all_gather" for op in with_root.ops) == 3  # the root kept, "2" freed


def test_the_root_must_be_named_and_the_backward_order_known() -> None:
    with pytest.raises(ValueError, match="give it an empty shape list"):
        cv.step("full-shard", TOY_LAYERS, 2, root="root")
    with pytest.raises(ValueError, match=r"backward_order names units not given: \['3'\]"):
        cv.step("full-shard", {"root": [], **TOY_LAYERS}, 2, root="root", backward_order=["3", "2", "1", "0"])
    kept = cv.fsdp2_step({"root": [], **TOY_LAYERS}, 2, {"root": None, "0": True, "1": False, "2": True}, root="root")
    assert [op.unit for op in kept.ops if op.backward and op.op == "all_gather"] == ["2", "0"]
