"""The per-rank memory model of guide 13 against sizes worked out by hand, and against the seeds' formulas."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.zero_memory import IMPLEMENTATIONS, Param, owned_elements, per_rank, textbook

# The toy (checks.workloads.toy): units "0" and "1" and the root holding child "2": 28 + 40 + 30 = 98 elements.
TOY = [
    Param("0", "0.weight", (7, 3)),
    Param("0", "0.bias", (7,)),
    Param("1", "1.weight", (5, 7)),
    Param("1", "1.bias", (5,)),
    Param("root", "2.weight", (5, 5)),
    Param("root", "2.bias", (5,)),
]


def test_ddp_is_16_bytes_per_element_plus_steps() -> None:
    m = per_rank("ddp", TOY, 2, 0)
    assert (m.params, m.grads, m.optim, m.master) == (4 * 98, 4 * 98, 8 * 98 + 4 * 6, 0)


def test_reference_pads_each_group_to_the_world_size() -> None:
    # N=4: 28 and 40 divide, the root's 30 pads to 32: shards of 7, 10, 8; rank 3's root shard holds 2 padding.
    z3 = [per_rank("zero3", TOY, 4, r) for r in range(4)]
    assert {m.params for m in z3} == {4 * (7 + 10 + 8)}
    assert [m.padding_bytes()["params"] for m in z3] == [0, 0, 0, 4 * 2]
    z1 = per_rank("zero1", TOY, 4, 0)
    assert (z1.params, z1.grads, z1.padding_bytes()["params"]) == (4 * 100, 4 * 100, 4 * 2)
    assert z1.optim == 8 * 25 + 4 * 3  # one shard tensor (and one `step`) per group
    z2 = per_rank("zero2", TOY, 4, 3)
    assert (z2.params, z2.grads) == (4 * 100, 4 * 25)


def test_reference_mixed_precision_is_the_papers_2_2_12() -> None:
    m = per_rank("zero2", TOY, 2, 0, "bf16")
    shard = 14 + 20 + 15
    assert (m.params, m.grads, m.master, m.optim) == (2 * 98, 2 * shard, 4 * shard, 8 * shard + 4 * 3)


def test_zero_redundancy_follows_the_greedy_partition() -> None:
    # By hand (tests/models/test_zero_partition.py): rank 0 owns 35 + 7 + 5 = 47, rank 1 25 + 21 + 5 = 51.
    assert owned_elements(TOY, 2) == [47, 51]
    assert per_rank("torch-zero", TOY, 2, 1).optim == 8 * 51 + 4 * 3


def test_fsdp1_state_has_no_padding_and_skips_empty_views() -> None:
    # N=4, use_orig_params=True, fp32: 16-byte alignment is 4 elements. Unit "0": 0.weight at 0 (21), 3 padding,
    # 0.bias at 24 (7), 1 world-size padding: 32, shards of 8. Unit "1": 35 at 0, 1 padding, 5 at 36, 3 padding:
    # 44, shards of 11. Root: 25 at 0, 3 padding, 5 at 28, 3 padding: 36, shards of 9. Rank 3 holds [24, 32),
    # [33, 44) and [27, 36): 0.bias (7); two of 1.weight and 1.bias (5); 2.bias (5): 9 padding elements, and state
    # for 19 elements of 4 tensors (0.weight and 2.weight have none here, so no gradient and no state).
    m = per_rank("full-shard", TOY, 4, 3)
    assert m.params == 4 * (8 + 11 + 9)
    assert m.padding_bytes()["params"] == 4 * 9
    assert m.optim == 8 * 19 + 4 * 4


def test_fsdp1_bf16_aligns_to_8_elements() -> None:
    # Two 36-element LayerNorm vectors: fp32 alignment (4) needs no padding; bf16 compute aligns to 8 elements:
    # 4 padding after the first, 76 in all, even: 4 padding elements across the two ranks.
    ln = [Param("u", "ln.weight", (36,)), Param("u", "ln.bias", (36,))]
    pad = {p: sum(per_rank("shard-grad-op", ln, 2, r, p).padding_bytes()["params"] for r in range(2))
           for p in ("fp32", "bf16")}  # fmt: skip
    assert pad == {"fp32": 0, "bf16": 4 * 4}


def test_fsdp2_pads_dim_0() -> None:
    # N=4: 7 rows -> 2 per rank (rank 3 gets 1), 5 rows -> 2 (rank 2 gets 1, rank 3 none).
    m = per_rank("fsdp2", TOY, 4, 3)
    assert m.params == 4 * (2 * 3 + 2 + 2 * 7 + 2 + 2 * 5 + 2)
    assert m.optim == 8 * (1 * 3 + 1) + 4 * 6


@given(st.lists(st.integers(1, 300), min_size=1, max_size=8), st.sampled_from([1, 2, 4, 8]))
def test_shards_add_up_to_the_padded_whole(sizes: list[int], n: int) -> None:
    params = [Param(f"u{i % 3}", f"p{i}", (k,)) for i, k in enumerate(sizes)]
    for impl in ("zero3", "full-shard", "fsdp2"):
        ranks = [per_rank(impl, params, n, r) for r in range(n)]
        assert len({m.params for m in ranks}) == 1  # equal padded shards
        unpadded = sum(m.params - m.padding_bytes()["params"] for m in ranks)
        assert unpadded == 4 * sum(sizes)  # padding is the only slack
    total_state = sum(per_rank("torch-zero", params, n, r).optim for r in range(n))
    assert total_state == per_rank("ddp", params, n, 0).optim  # a partition: nothing twice, nothing left out


def test_the_seeds_7b_figures() -> None:
    psi = 7 * 10**9
    gb = {s: sum(textbook(s, psi, 8).values()) / 1e9 for s in range(4)}
    assert gb == {0: 112.0, 1: 63.0, 2: 38.5, 3: 14.0}  # seed 002, fp32
    assert sum(textbook(3, psi, 8, "bf16").values()) / 1e9 == 14.0  # seed 000, mixed precision


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_textbook_fraction_is_the_model_up_to_steps_for_tiny_sized_units(impl: str) -> None:
    # Units whose sizes divide by N have no padding: the model is the textbook formula plus the step scalars.
    params = [Param("a", "a.w", (8, 4)), Param("b", "b.w", (16, 2))]
    m = per_rank(impl, params, 2, 0)
    assert m.padding_bytes().get("params", 0) == 0
    stage = {"ddp": 0, "no-shard": 0, "torch-zero": 1, "zero1": 1, "zero2": 2}.get(impl, 3)
    formula = textbook(stage, 64, 2)
    assert Fraction(m.params) == Fraction(formula["params"]) and Fraction(m.grads) == Fraction(formula["grads"])


def test_unknown_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        per_rank("zero4", TOY, 2, 0)
    with pytest.raises(ValueError):
        per_rank("ddp", TOY, 2, 2)
    with pytest.raises(ValueError):
        per_rank("ddp", TOY, 2, 0, "fp8")


# -- the optimizer as an input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "optim, state",
    [
        ("adamw", 8 * 98 + 4 * 6),
        ("adam", 8 * 98 + 4 * 6),
        ("adam-amsgrad", 12 * 98 + 4 * 6),  # exp_avg, exp_avg_sq, max_exp_avg_sq and a step per tensor
        ("sgd", 0),  # no momentum: no state at all
        ("sgd-momentum", 4 * 98),  # one momentum_buffer per parameter, no step
    ],
)
def test_ddps_state_is_the_optimizers_buffers_and_steps(optim: str, state: int) -> None:
    m = per_rank("ddp", TOY, 2, 0, optim=optim)
    assert (m.params, m.grads, m.optim) == (4 * 98, 4 * 98, state)


def test_sharded_state_follows_the_optimizer_over_what_the_rank_updates() -> None:
    # Reference ZeRO-1 at N=4: shards of 7, 10, 8 elements, one tensor per group.
    assert per_rank("zero1", TOY, 4, 0, optim="sgd-momentum").optim == 4 * 25
    assert per_rank("zero1", TOY, 4, 0, optim="adam-amsgrad").optim == 12 * 25 + 4 * 3
    assert per_rank("zero1", TOY, 4, 0, optim="sgd").optim == 0
    # Padding of the root's group (2 elements on rank 3) is state too: the optimizer sees the padded shard.
    assert per_rank("zero3", TOY, 4, 3, optim="sgd-momentum").padding_bytes()["optim"] == 4 * 2
    # Under bf16 the reference keeps its fp32 master whatever the optimizer: the master is what it updates.
    assert per_rank("zero1", TOY, 4, 0, "bf16", optim="sgd").master == 4 * 25
    # FSDP2 at N=2: dim-0 chunks of ceil(d0/2) rows; rank 0 updates 4·3 + 4 + 3·7 + 3 + 3·5 + 3 = 58 elements.
    assert per_rank("fsdp2", TOY, 2, 0, optim="sgd-momentum").optim == 4 * 58
    assert per_rank("fsdp2", TOY, 2, 0, optim="adam").optim == 8 * 58 + 4 * 6


def test_an_optimizer_the_model_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match="knows no optimizer 'lion'; one of adamw, adam, adam-amsgrad, sgd"):
        per_rank("ddp", TOY, 2, 0, optim="lion")


def test_fsdp1_without_orig_params_keeps_one_state_per_flat_shard_padding_included() -> None:
    # No alignment: units of 28, 40 and 30 elements pad to 28, 40, 32 at N=4; shards of 7, 10 and 8, rank 3's root
    # shard holding 2 padding elements, which the optimizer's state covers too (it updates the flat shard).
    m = per_rank("full-shard", TOY, 4, 3, use_orig_params=False)
    assert (m.params, m.grads, m.optim) == (4 * 25, 4 * 25, 8 * 25 + 4 * 3)
    assert m.padding_bytes() == {"params": 4 * 2, "grads": 4 * 2, "optim": 8 * 2, "master": 0}
    no_shard = per_rank("no-shard", TOY, 4, 0, use_orig_params=False, optim="sgd-momentum")
    assert (no_shard.params, no_shard.optim) == (4 * 98, 4 * 98)  # the whole unaligned flat parameters


def test_use_orig_params_is_refused_outside_fsdp1() -> None:
    with pytest.raises(ValueError, match="use_orig_params is an FSDP1 setting; 'fsdp2' has none"):
        per_rank("fsdp2", TOY, 2, 0, use_orig_params=False)
