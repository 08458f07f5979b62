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
