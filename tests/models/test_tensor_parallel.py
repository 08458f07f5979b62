"""The tensor-parallel model: each parameter's placement and local shape under ColwiseParallel /
RowwiseParallel, the all-reduces of one step (count, elements, pass, tensor), their ring bytes, and the placements
FSDP2 gives a tensor-parallel parameter on a 2-D mesh."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models import tensor_parallel as tpm


def test_mlp_shards_on_two_ranks() -> None:
    got = [(s.name, s.placement, s.local_shape) for s in tpm.shards(tpm.mlp(16, 64).linears, 2)]
    assert got == [
        ("mlp.fc.weight", "Shard(dim=0)", (32, 16)),  # rows of the weight: half the output features
        ("mlp.fc.bias", "Shard(dim=0)", (32,)),
        ("mlp.proj.weight", "Shard(dim=1)", (16, 32)),  # columns: half the input features
        ("mlp.proj.bias", "Replicate()", (16,)),  # added once, after the partial sums are all-reduced
    ]


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([8, 16, 32]))
def test_shards_hold_one_nth_but_the_rowwise_bias(degree: int, d_model: int) -> None:
    region = tpm.attention(d_model)
    held = sum(s.local_numel for s in tpm.shards(region.linears, degree))
    weights_and_colwise_biases = 4 * d_model * d_model + 3 * d_model
    assert held * degree == weights_and_colwise_biases + degree * d_model  # o's bias whole on every rank


def test_an_uneven_split_is_refused() -> None:
    with pytest.raises(ValueError, match="does not split evenly over 3 ranks"):
        tpm.shards(tpm.mlp(16, 64).linears, 3)
    with pytest.raises(ValueError, match="style is"):
        tpm.shards([tpm.Linear("x", 4, 4, "diagonal")], 2)


def test_mlp_all_reduces_once_each_way() -> None:
    ops = tpm.region_collectives(tpm.mlp(16, 64), tokens=16, degree=2)
    assert [(o.op, o.numel, o.backward, o.tensor) for o in ops] == [
        ("all_reduce", 256, False, "output"),
        ("all_reduce", 256, True, "input gradient"),
    ]


def test_attention_all_reduces_its_input_gradient_once_per_projection() -> None:
    plain = tpm.region_collectives(tpm.attention(16), tokens=16, degree=2)
    prepared = tpm.region_collectives(tpm.attention(16, prepared_input=True), tokens=16, degree=2)
    assert [o.backward for o in plain] == [False, True, True, True]  # q, k and v each annotate the input
    assert [o.backward for o in prepared] == [False, True]  # one DTensor: the three partials add up first


def test_an_input_without_gradient_all_reduces_nothing_in_backward() -> None:
    assert [o.backward for o in tpm.region_collectives(tpm.mlp(16, 64), 16, 2, input_requires_grad=False)] == [False]
    assert tpm.region_collectives(tpm.mlp(16, 64), 16, 1) == []  # one rank: nothing to reduce


def test_a_step_runs_forward_in_order_and_backward_in_reverse() -> None:
    ops = tpm.collectives([tpm.attention(16, prepared_input=True), tpm.mlp(16, 64)], tokens=16, degree=2)
    assert [(o.region, o.backward) for o in ops] == [("attn", False), ("mlp", False), ("mlp", True), ("attn", True)]
    first_without = tpm.collectives([tpm.attention(16), tpm.mlp(16, 64)], 16, 2, first_input_requires_grad=False)
    assert [(o.region, o.backward) for o in first_without] == [("attn", False), ("mlp", False), ("mlp", True)]


def test_the_elements_are_activations_whatever_the_parameters() -> None:
    small, large = (tpm.collectives([tpm.mlp(16, hidden)], tokens=16, degree=2) for hidden in (32, 4096))
    assert [o.numel for o in small] == [o.numel for o in large] == [16 * 16, 16 * 16]


@given(st.integers(1, 4), st.sampled_from([2, 4, 8]), st.sampled_from([64, 512]))
def test_megatron_count_four_all_reduces_per_block(n_layer: int, degree: int, tokens: int) -> None:
    d_model = 16
    want = 4 * n_layer * Fraction(2 * (degree - 1), degree) * tokens * d_model * 4
    assert tpm.transformer_step(n_layer, tokens, d_model, 64, degree) == want


def test_fsdp_over_tp_placements_and_local_shapes() -> None:
    fc_weight, fc_bias, proj_weight, proj_bias = tpm.shards(tpm.mlp(16, 64).linears, 2)
    assert tpm.fsdp_over_tp_placements(fc_weight, 2) == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    assert tpm.fsdp_over_tp_placements(proj_weight, 2) == "(Shard(dim=0), Shard(dim=1))"
    assert tpm.fsdp_over_tp_placements(proj_bias, 2) == "(Shard(dim=0), Replicate())"
    assert tpm.fsdp_over_tp_local(fc_weight, 2) == (16, 16)
    assert tpm.fsdp_over_tp_local(proj_weight, 2) == (8, 32)
    assert tpm.fsdp_over_tp_local(fc_bias, 2) == (16,)
