"""The flat-parameter spec (`checks.models.flat_param.flat_param`): units worked by hand from the rules, and
properties over random units. The hand-worked units were also built by real FSDP1 on gloo (2 and 4 ranks) and
every field matched; the arithmetic below is the rules', not torch's output."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks.models.flat_param import FlatParamSpec, Param, ShardParamInfo, flat_param, layout

FAST = settings(max_examples=60, deadline=None, database=None)
OUT = ShardParamInfo.absent()


def _mixed() -> list[Param]:
    # The walk visits the root module first, so its own parameters (bare, zero) come before its children's.
    return [
        Param("bare", (2, 5)),
        Param("zero", (0,)),
        Param("lin.weight", (3, 5)),
        Param("lin.bias", (3,)),
        Param("emb.weight", (7, 3)),
        Param("head.weight", (7, 3), tied_to="emb.weight"),
    ]


def test_mixed_unit_fp32_use_orig_params_at_4() -> None:
    # fp32 aligns to 16 // 4 = 4 elements. bare [0, 10); 10 % 4 = 2 -> pad 2, zero at 12 (a zero-size parameter is
    # aligned too); lin.weight at 12, ends 27; 27 % 4 = 3 -> pad 1, lin.bias [28, 31); pad 1, emb [32, 53).
    # head.weight is emb.weight again: not flattened. 53 % 4 = 1 -> 3 elements of world-size padding: 56, shards 14.
    spec = flat_param(_mixed(), 4, use_orig_params=True)
    assert spec.fqns == ("bare", "zero", "lin.weight", "lin.bias", "emb.weight")
    assert spec.numels == (10, 0, 15, 3, 21) and spec.shapes == ((2, 5), (0,), (3, 5), (3,), (7, 3))
    assert spec.offsets == (0, 12, 12, 28, 32) and spec.padding_before == (0, 2, 0, 1, 1)
    assert spec.numels_with_padding == (10, 2, 0, 15, 1, 3, 1, 21, 3)
    assert spec.is_padding_mask == (False, True, False, False, True, False, True, False, True)
    assert (spec.params_end, spec.tail_padding, spec.flat_numel) == (53, 3, 56)
    assert (spec.padded_unsharded_numel, spec.shard_numel, spec.aligned_numel) == (56, 14, 4)
    assert [(t.module_name, t.param_name, t.prim_module_name, t.prim_param_name) for t in spec.shared] == [
        ("head", "weight", "emb", "weight")
    ]
    assert [spec.shard_range(r) for r in range(4)] == [(0, 14), (14, 28), (28, 42), (42, 56)]
    # Rank 0 [0, 14): bare whole; zero at 12 lies strictly inside, so "in" with 0 elements and end index -1;
    # lin.weight's first 2 elements (12, 13).
    assert spec.shard_param_infos(0) == (
        ShardParamInfo(True, 0, 10, 0, 9),
        ShardParamInfo(True, 12, 0, 0, -1),
        ShardParamInfo(True, 12, 2, 0, 1),
        OUT,
        OUT,
    )
    # Rank 1 [14, 28): the remaining 13 of lin.weight (intra 2..14 inclusive); lin.bias starts at 28, outside.
    assert spec.shard_param_infos(1) == (OUT, OUT, ShardParamInfo(True, 0, 13, 2, 14), OUT, OUT)
    # Rank 2 [28, 42): lin.bias whole; emb's first 10 at shard offset 32 - 28 = 4.
    assert spec.shard_param_infos(2) == (
        OUT,
        OUT,
        OUT,
        ShardParamInfo(True, 0, 3, 0, 2),
        ShardParamInfo(True, 4, 10, 0, 9),
    )
    # Rank 3 [42, 56): emb's last 11 (intra 10..20); the rest is world-size padding.
    assert spec.shard_param_infos(3) == (OUT, OUT, OUT, OUT, ShardParamInfo(True, 0, 11, 10, 20))
    # Sharded views: 1-D of numel_in_shard, (0,) when not in the shard; the tied parameter mirrors its primary.
    assert spec.view_shapes(0) == {
        "bare": (10,),
        "zero": (0,),
        "lin.weight": (2,),
        "lin.bias": (0,),
        "emb.weight": (0,),
        "head.weight": (0,),
    }
    assert spec.view_shapes(3)["head.weight"] == spec.view_shapes(3)["emb.weight"] == (11,)
    assert all(spec.shard_numel_padded(r) == 0 for r in range(4))  # the padding is in the flat parameter


def test_mixed_unit_without_use_orig_params_packs_and_pads_the_last_shards() -> None:
    # No alignment: 10 + 0 + 15 + 3 + 21 = 49 elements; torch.chunk into 4 pieces of ceil(49 / 4) = 13: rank 3
    # holds 49 - 39 = 10 real elements and 3 of padding added when sharding, not in the flat parameter.
    spec = flat_param(_mixed(), 4, use_orig_params=False)
    assert spec.offsets == (0, 10, 10, 25, 28) and spec.numels_with_padding == (10, 0, 15, 3, 21)
    assert (spec.flat_numel, spec.padded_unsharded_numel, spec.shard_numel, spec.tail_padding) == (49, 52, 13, 3)
    assert [spec.shard_numel_padded(r) for r in range(4)] == [0, 0, 0, 3]
    # zero at 10 is inside rank 0's [0, 13); lin.weight [10, 25) spans ranks 0 and 1.
    assert spec.shard_param_infos(0)[1:3] == (ShardParamInfo(True, 10, 0, 0, -1), ShardParamInfo(True, 10, 3, 0, 2))
    assert spec.shard_param_infos(1)[2] == ShardParamInfo(True, 0, 12, 3, 14)
    # Without use_orig_params the originals keep their shapes (as plain tensors).
    assert spec.view_shapes(2)["head.weight"] == (7, 3)


def test_bf16_compute_aligns_fp32_parameters_to_eight_elements() -> None:
    # The alignment is in the compute dtype: 16 // 2 = 8 elements, even though the flat parameter stays fp32.
    params = [Param("a", (21,)), Param("b", (7,))]
    spec = flat_param(params, 2, use_orig_params=True, dtype="float32", compute_dtype="bfloat16")
    assert spec.offsets == (0, 24) and spec.flat_numel == 32 and spec.aligned_numel == 8
    assert flat_param(params, 2, use_orig_params=True).offsets == (0, 24)  # fp32: 21 -> 24 as well
    assert flat_param([Param("a", (17,)), Param("b", (7,))], 2, use_orig_params=True).offsets == (0, 20)
    assert flat_param([Param("a", (17,)), Param("b", (7,))], 2, use_orig_params=True, dtype="float64").offsets == (
        0,
        18,
    )


def test_fewer_chunks_than_ranks_and_a_zero_size_parameter_at_the_end() -> None:
    # 5 elements at 4 ranks, use_orig_params=False: torch.chunk gives pieces 2, 2, 1 and rank 3 an empty one.
    spec = flat_param([Param("a", (5,)), Param("z", (0,))], 4, use_orig_params=False)
    assert [spec.shard_numel_padded(r) for r in range(4)] == [0, 0, 1, 2]
    # z sits at 5: strictly inside rank 2's [4, 6), so in that shard with no elements.
    assert [spec.shard_param_infos(r)[1] for r in range(4)] == [OUT, OUT, ShardParamInfo(True, 1, 0, 0, -1), OUT]


def test_a_zero_size_parameter_on_a_shard_boundary_is_in_no_shard() -> None:
    spec = flat_param([Param("a", (4,)), Param("z", (0,)), Param("b", (4,))], 2, use_orig_params=False)
    assert spec.offsets[1] == 4 and spec.shard_range(1) == (4, 8)  # 0 < 4 < 4 and 4 < 4 < 8 both fail
    assert [spec.shard_param_infos(r)[1] for r in range(2)] == [OUT, OUT]
    assert flat_param([Param("z", (0,)), Param("a", (4,))], 2, use_orig_params=True).shard_param_infos(0)[0] == OUT


def test_no_shard_with_use_orig_params_still_pads_to_the_world_size() -> None:
    # [5, 0] fp32 at 4 ranks: 5 -> pad 3 -> z at 8; 8 % 4 == 0: no tail. NO_SHARD: one range, the whole.
    spec = flat_param([Param("a", (5,)), Param("z", (0,))], 4, use_orig_params=True, sharded=False)
    assert spec.numels_with_padding == (5, 3, 0) and spec.flat_numel == 8 and spec.padded_unsharded_numel is None
    assert all(spec.shard_range(r) == (0, 8) for r in range(4))
    assert spec.shard_param_infos(3) == (ShardParamInfo(True, 0, 5, 0, 4), OUT)  # z at 8 == the end: outside
    assert spec.view_shapes(1) == {"a": (5,), "z": (0,)}  # unflattened unsharded views
    # [5] at 4 ranks: 5 % 4 = 1 -> 3 elements of world-size padding inside the flat parameter, even unsharded.
    alone = flat_param([Param("a", (5,))], 4, use_orig_params=True, sharded=False)
    assert alone.numels_with_padding == (5, 3) and alone.is_padding_mask == (False, True)


def test_world_size_one_is_no_shard() -> None:
    spec = flat_param([Param("a", (5,))], 1, use_orig_params=True)
    assert not spec.sharded and spec.padded_unsharded_numel is None and spec.shard_numel == 5


def test_frozen_parameters_mix_only_with_use_orig_params() -> None:
    params = [Param("w", (4,)), Param("frozen", (3,), requires_grad=False)]
    assert flat_param(params, 2, use_orig_params=True).requires_grad
    assert not flat_param([Param("f", (3,), requires_grad=False)], 2, use_orig_params=False).requires_grad
    with pytest.raises(ValueError, match="uniform requires_grad"):
        flat_param(params, 2, use_orig_params=False)


@pytest.mark.parametrize(
    ("params", "dtype", "match"),
    [
        ([Param("z", (0,)), Param("y", (3, 0))], "float32", "zero-size"),
        ([Param("a", (2,), tied_to="b"), Param("b", (2,))], "float32", "earlier"),
        ([Param("a", (2,)), Param("a", (2,))], "float32", "twice"),
        ([Param("a", (2,))], "int64", "floating"),
        ([Param("a", (2,))], 3, "alignment"),
        ([], "float32", "at least one"),
    ],
)
def test_what_fsdp_cannot_build_is_refused(params: list[Param], dtype: str | int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        flat_param(params, 2, use_orig_params=True, dtype=dtype)


# -- properties -------------------------------------------------------------------------------------------------------
@st.composite
def units(draw: st.DrawFn) -> list[Param]:
    shapes = draw(st.lists(st.lists(st.integers(0, 6), max_size=3), min_size=1, max_size=8))
    params: list[Param] = []
    for i, shape in enumerate(shapes):
        primaries = [p.fqn for p in params if p.tied_to is None]
        tie = draw(st.sampled_from([None, *primaries])) if primaries and draw(st.booleans()) else None
        tied = next((p for p in params if p.fqn == tie), None)
        params.append(Param(f"m{i}.w", tied.shape if tied else tuple(shape), draw(st.booleans()), tie))
    if not any(p.numel for p in params if p.tied_to is None):
        params.append(Param("last", (draw(st.integers(1, 9)),)))
    return params


configs = st.tuples(units(), st.integers(1, 8), st.booleans(), st.sampled_from([1, 2, 4, 8]), st.booleans())


def _build(unit: list[Param], n: int, orig: bool, width: int, sharded: bool) -> FlatParamSpec:
    if not orig:
        unit = [Param(p.fqn, p.shape, True, p.tied_to) for p in unit]
    return flat_param(unit, n, use_orig_params=orig, dtype=4, compute_dtype=width, sharded=sharded)


@FAST
@given(configs)
def test_shards_partition_the_padded_range(config: tuple) -> None:
    spec = _build(*config)
    ranks = range(spec.world_size)
    ranges = [spec.shard_range(r) for r in ranks]
    if spec.sharded:
        assert ranges[0][0] == 0 and ranges[-1][1] == spec.padded_unsharded_numel
        assert all(a[1] == b[0] for a, b in pairwise(ranges))
        assert {hi - lo for lo, hi in ranges} == {spec.shard_numel}
        assert sum(spec.shard_numel_padded(r) for r in ranks) == spec.padded_unsharded_numel - spec.flat_numel
    else:
        assert set(ranges) == {(0, spec.flat_numel)} and spec.padded_unsharded_numel is None


@FAST
@given(configs)
def test_in_shard_pieces_rebuild_each_parameter_once(config: tuple) -> None:
    spec = _build(*config)
    ranks = range(spec.world_size) if spec.sharded else range(1)
    for i, (start, numel) in enumerate(zip(spec.offsets, spec.numels, strict=True)):
        pieces: list[int] = []
        for r in ranks:
            info = spec.shard_param_infos(r)[i]
            if not info.in_shard:
                assert info == ShardParamInfo.absent()
                continue
            lo = spec.shard_range(r)[0]
            # The same element, seen from the shard and from the parameter.
            assert lo + info.offset_in_shard == start + info.intra_param_start_idx
            assert info.numel_in_shard == info.intra_param_end_idx - info.intra_param_start_idx + 1
            assert 0 <= info.offset_in_shard < spec.shard_numel
            pieces += range(info.intra_param_start_idx, info.intra_param_end_idx + 1)
        assert pieces == list(range(numel))


@FAST
@given(configs)
def test_alignment_and_padding_counts(config: tuple) -> None:
    spec = _build(*config)
    step = spec.aligned_numel
    if spec.use_orig_params:
        assert all(s % step == 0 for s in spec.offsets) and all(0 <= b < step for b in spec.padding_before)
    else:
        assert step == 0 and not any(spec.padding_before) and not any(spec.is_padding_mask)
    assert sum(spec.numels_with_padding) == spec.flat_numel
    assert [n for n, pad in zip(spec.numels_with_padding, spec.is_padding_mask, strict=True) if not pad] == list(
        spec.numels
    )
    assert 0 not in [n for n, pad in zip(spec.numels_with_padding, spec.is_padding_mask, strict=True) if pad]
    assert spec.params_end == spec.offsets[-1] + spec.numels[-1]
    assert spec.flat_numel - spec.params_end == (spec.tail_padding if spec.use_orig_params else 0)
    assert 0 <= spec.tail_padding < spec.world_size
    whole = spec.padded_unsharded_numel if spec.sharded else spec.flat_numel
    assert whole == spec.params_end + spec.tail_padding
    if spec.sharded or spec.use_orig_params:
        assert whole % spec.world_size == 0


@FAST
@given(configs)
def test_views_hold_each_parameter_once_and_ties_mirror(config: tuple) -> None:
    spec = _build(*config)
    unit = config[0]
    ranks = range(spec.world_size)
    views = [spec.view_shapes(r) for r in ranks]
    assert all(set(v) == {p.fqn for p in unit} for v in views)
    for tie in spec.shared:
        assert all(v[tie.fqn] == v[tie.prim_fqn] for v in views)
    if spec.use_orig_params and spec.sharded:
        for fqn, numel in zip(spec.fqns, spec.numels, strict=True):
            assert all(len(v[fqn]) == 1 for v in views) and sum(v[fqn][0] for v in views) == numel
    else:
        assert all(v[f] == s for v in views for f, s in zip(spec.fqns, spec.shapes, strict=True))


@FAST
@given(configs)
def test_layout_is_a_view_of_the_spec(config: tuple) -> None:
    unit, n, orig, width, sharded = config
    spec = _build(unit, n, orig, width, sharded)
    flat = layout(list(spec.numels), width, n, align=orig, sharded=sharded)
    assert (flat.starts, flat.numels, flat.unpadded_numel) == (spec.offsets, spec.numels, spec.params_end)
    assert flat.padded_numel == (spec.padded_unsharded_numel or spec.flat_numel)
    assert flat.shard_numel == spec.shard_numel
    assert all(flat.in_shard(r) == spec.in_shard(r) for r in range(flat.world_size))
