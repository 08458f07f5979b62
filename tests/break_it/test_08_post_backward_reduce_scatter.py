"""Guide 08: bend the gradient reduction and watch its claims fail: wrong values, wrong timing, missing or
doubled collectives, a lost accumulation, the wrong dtype."""

import pytest

from checks.breakit.patches import returning, skipping, wrapping
from checks.guides.g08_post_backward_reduce_scatter.recipes import (
    clip_twice_on_rank_1,
    clip_without_all_reduce,
    clip_without_the_clamp,
    clip_without_the_clamp_fsdp1,
    defer_reduction,
    keep_reduced_dtype,
    local_total_norm,
    overwrite_instead_of_accumulate,
    pad_a_chunk_more,
    pad_with_ones,
    reduce_deferred,
    reduce_first_two_swapped,
    reduce_in_fp32,
    reduce_scatter_twice,
    sum_not_mean,
    without_postdivide,
)

RU = "torch.distributed.fsdp._runtime_utils"
C10D = "torch.distributed.distributed_c10d"
PREDIVIDE = "torch.distributed.algorithms._comm_hooks.default_hooks:DefaultState._get_gradient_predivide_factor"
NO_REDUCE_SCATTER = skipping(f"{C10D}:reduce_scatter_single")
FSDP1_CLIP = "torch.distributed.fsdp.fully_sharded_data_parallel:FullyShardedDataParallel.clip_grad_norm_"
CLIP = "torch.nn.utils.clip_grad"
LOCAL_CLIP = wrapping(FSDP1_CLIP, clip_without_all_reduce)
LOCAL_NORM = wrapping(f"{CLIP}:_get_total_norm", local_total_norm)


@pytest.mark.breaks("08-post-backward-reduce-scatter", "one-reduce-scatter-per-unit")
def test_a_doubled_reduce_scatter_is_caught(broken) -> None:
    run = broken(wrapping(f"{C10D}:reduce_scatter_single", reduce_scatter_twice))
    assert run.reason == "reduce-scatters"
    assert [entry.split()[1] for entry in run.details["observed"]] == ["16020"] * 6 + ["3528"] * 2
    assert run.details["observed"][:2] == ["blocks.2 16020", "blocks.2 16020"]


@pytest.mark.breaks("08-post-backward-reduce-scatter", "one-reduce-scatter-per-unit")
def test_two_blocks_reduced_in_swapped_order_are_caught(broken) -> None:
    """The old check compared only sizes, and the three blocks are 16,020 elements each: blocks.1 reduced before
    blocks.2 gave it the same list and passed. Attributed to their units, the reduce-scatters differ at the first."""
    run = broken(wrapping(f"{RU}:_reduce_grad", reduce_first_two_swapped))
    assert (run.reason, run.details["first"]) == ("reduce-scatters", 0)
    assert run.details["observed"][:2] == ["blocks.1 16020", "blocks.2 16020"]


@pytest.mark.breaks("08-post-backward-reduce-scatter", "one-reduce-scatter-per-unit")
def test_a_missing_reduce_scatter_is_caught(broken) -> None:
    run = broken(NO_REDUCE_SCATTER)
    assert (run.reason, run.details["observed"]) == ("reduce-scatters", [])


@pytest.mark.breaks("08-post-backward-reduce-scatter", "one-reduce-scatter-per-unit-at-4")
def test_a_missing_reduce_scatter_is_caught_on_4_ranks(broken) -> None:
    run = broken(NO_REDUCE_SCATTER)
    assert (run.reason, run.details["observed"]) == ("reduce-scatters", [])


@pytest.mark.breaks("08-post-backward-reduce-scatter", "toy-reduce-scatter-pads-at-4")
def test_padding_beyond_a_multiple_of_n_is_caught(broken) -> None:
    # Any other shard length is refused by torch itself when the shard becomes the gradient, before the check
    # compares sizes: the failure is torch's, for the right reason.
    run = broken(wrapping(f"{RU}:_get_reduce_scatter_tensors", pad_a_chunk_more))
    assert run.reason is None and run.error_types == {"builtins.RuntimeError"}
    assert all("the gradient and the tensor are the same size" in r.message for r in run.failed)


@pytest.mark.breaks("08-post-backward-reduce-scatter", "toy-reduce-scatter-pads-at-4")
def test_padding_with_ones_is_caught(broken) -> None:
    """The old check compared only lengths (32 in, 8 per rank), which padding with ones keeps: it passed. The
    reduce-scatter's input, read where torch hands it over, holds the 1s, halved by the pre-divide."""
    run = broken(wrapping(f"{RU}:_get_reduce_scatter_tensors", pad_with_ones))
    assert (run.reason, run.details["unit"], run.details["padding"]) == ("padding-not-zero", "root", [0.5, 0.5])


@pytest.mark.breaks("08-post-backward-reduce-scatter", "reduce-scatter-in-post-backward")
def test_reductions_deferred_to_the_end_of_backward_are_caught(broken) -> None:
    run = broken(
        wrapping(f"{RU}:_reduce_grad", defer_reduction),
        wrapping(f"{RU}:_post_backward_final_callback", reduce_deferred),
    )
    assert run.reason == "reduce-scatter-timing"
    assert run.details["observed"][-4:] == ["reduce_scatter"] * 4 and run.details["first"] == 3


@pytest.mark.breaks("08-post-backward-reduce-scatter", "sharded-grad-is-ddp-slice")
def test_a_sum_instead_of_a_mean_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_div_if_needed", sum_not_mean))
    assert run.reason == "not-bitwise" and run.details["max_abs_diff"] > 0


@pytest.mark.breaks("08-post-backward-reduce-scatter", "sharded-grad-is-ddp-slice")
def test_no_reduction_at_all_is_caught(broken) -> None:
    run = broken(NO_REDUCE_SCATTER)
    assert run.reason == "not-bitwise"


def test_a_lost_post_divide_cannot_show_on_2_ranks(pool, request) -> None:
    # The guide says so: at N=2 the post-divide factor is 1 and _div_if_needed skips it. The claim still passes.
    from reader.pytest_plugin.hooks import claim_request
    from tests.break_it.conftest import guides

    guide = guides()["08-post-backward-reduce-scatter"]
    patch = wrapping(f"{RU}:_reduce_grad", without_postdivide)
    run = pool.run(claim_request(request.config, guide, guide.claim("sharded-grad-is-ddp-slice"), patches=(patch,)))
    assert run.ok, run.failure


@pytest.mark.breaks("08-post-backward-reduce-scatter", "sharded-grad-close-to-ddp-at-4")
def test_a_lost_post_divide_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{RU}:_reduce_grad", without_postdivide))
    assert run.reason == "beyond-tolerance"
    # Twice the mean: the difference is the whole gradient, far beyond the ulp-sized bound.
    assert run.details["max_abs_diff"] > 1e5 * run.details["bound"]


@pytest.mark.breaks("08-post-backward-reduce-scatter", "sharded-grad-close-to-ddp-at-4")
def test_a_sum_instead_of_a_mean_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{RU}:_div_if_needed", sum_not_mean))
    assert run.reason == "beyond-tolerance"


@pytest.mark.breaks("08-post-backward-reduce-scatter", "divide-factors")
def test_a_predivide_of_one_is_caught(broken) -> None:
    run = broken(returning(PREDIVIDE, 1.0))
    assert run.reason == "divide-factors"
    assert (run.details["observed"], run.details["expected"]) == ({"pre": 1.0, "post": 2.0}, {"pre": 2.0, "post": 1.0})


@pytest.mark.breaks("08-post-backward-reduce-scatter", "divide-factors")
def test_a_division_that_never_happens_is_caught(broken) -> None:
    """The old check read the factors FSDP stores on each unit, and `_div_if_needed` doing nothing leaves them
    (2, 1): it passed. Observed on the data, the reduce-scatter's input is the gradient undivided."""
    run = broken(wrapping(f"{RU}:_div_if_needed", sum_not_mean))
    assert run.reason == "divide-factors"
    assert (run.details["observed"], run.details["expected"]) == ({"pre": 1.0, "post": 1.0}, {"pre": 2.0, "post": 1.0})


@pytest.mark.breaks("08-post-backward-reduce-scatter", "divide-factors-at-4")
def test_a_predivide_of_one_is_caught_on_4_ranks(broken) -> None:
    run = broken(returning(PREDIVIDE, 1.0))
    assert run.reason == "divide-factors"
    assert run.details["observed"] == {"pre": 1.0, "post": 4.0}


@pytest.mark.breaks("08-post-backward-reduce-scatter", "accumulation-sums")
def test_an_accumulation_that_overwrites_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_accumulate_sharded_grad", overwrite_instead_of_accumulate))
    assert run.reason == "not-summed" and run.details["max_abs_diff"] > 0


@pytest.mark.breaks("08-post-backward-reduce-scatter", "reduce-and-stored-dtypes")
def test_a_reduce_dtype_that_ignores_the_policy_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_backward_hook", reduce_in_fp32))
    assert run.reason == "reduce-dtype"
    assert (run.details["observed"], run.details["expected"]) == (["torch.float32"], ["torch.bfloat16"])


@pytest.mark.breaks("08-post-backward-reduce-scatter", "reduce-and-stored-dtypes")
def test_a_gradient_left_in_bf16_is_caught(broken) -> None:
    # torch itself refuses the bf16 gradient for an fp32 parameter before the check can read the stored dtype.
    run = broken(wrapping(f"{RU}:_cast_grad_to_param_dtype", keep_reduced_dtype))
    assert run.reason is None and run.error_types == {"builtins.RuntimeError"}
    assert all("attempting to assign a gradient with dtype 'c10::BFloat16'" in r.message for r in run.failed)


# -- clip_grad_norm_ -------------------------------------------------------------------------------------------------
@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp1-clip-grad-norm")
def test_a_clip_by_each_ranks_own_norm_is_caught(broken) -> None:
    run = broken(LOCAL_CLIP)
    assert run.reason == "norm-differs"
    assert run.details["observed"] < run.details["expected"]  # one shard's norm, not the whole model's


@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp1-clip-grad-norm")
def test_a_shard_scaled_twice_is_caught(broken) -> None:
    run = broken(wrapping(FSDP1_CLIP, clip_twice_on_rank_1))
    assert (run.reason, run.details["failed_rank"], run.details["rank"]) == ("not-one-factor", 1, 1)
    assert run.details["observed"]  # the parameters with elements on rank 1, scaled twice


@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp1-clip-grad-norm-at-4")
def test_a_clip_by_each_ranks_own_norm_is_caught_on_4_ranks(broken) -> None:
    run = broken(LOCAL_CLIP)
    assert run.reason == "norm-differs"


@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp2-clip-grad-norm")
def test_a_dtensor_norm_of_local_shards_is_caught(broken) -> None:
    run = broken(LOCAL_NORM)
    assert run.reason == "norm-differs"
    assert run.details["observed"] < run.details["expected"]


@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp2-clip-grad-norm")
def test_gradients_left_unscaled_are_caught(broken) -> None:
    run = broken(skipping(f"{CLIP}:_clip_grads_with_norm_"))
    assert run.reason == "not-one-factor"
    assert len(run.details["observed"]) == 40  # every parameter of mini_gpt tiny


@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp2-clip-grad-norm-at-4")
def test_a_dtensor_norm_of_local_shards_is_caught_on_4_ranks(broken) -> None:
    run = broken(LOCAL_NORM)
    assert run.reason == "norm-differs"


@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp1-clip-never-scales-up")
def test_an_fsdp1_clip_without_the_clamp_is_caught(broken) -> None:
    run = broken(wrapping(FSDP1_CLIP, clip_without_the_clamp_fsdp1))
    assert run.reason == "scaled-up" and run.details["expected"] == []
    assert run.details["observed"]  # the parameters with elements in this rank's shard, all scaled up


@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp2-clip-never-scales-up")
def test_an_fsdp2_clip_without_the_clamp_is_caught(broken) -> None:
    run = broken(wrapping(f"{CLIP}:_clip_grads_with_norm_", clip_without_the_clamp))
    assert run.reason == "scaled-up"
    assert len(run.details["observed"]) == 40 and run.details["expected"] == []


@pytest.mark.breaks("08-post-backward-reduce-scatter", "fsdp2-clip-never-scales-up")
def test_a_max_norm_below_the_norm_is_refused(broken) -> None:
    # the claim's premise: with max_norm under the norm the clamp is not what is tested, and the check says so
    run = broken(max_norm=0.5)
    assert run.reason == "norm-above-max" and run.details["max_norm"] == 0.5
