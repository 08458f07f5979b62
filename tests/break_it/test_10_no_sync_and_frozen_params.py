"""Guide 10: bend no_sync and the reshard of frozen units and watch its claims fail: a no_sync that reduces
anyway, a backward that frees or keeps the wrong units, a dropped accumulated gradient, a frozen unit left to
the catch-all or never resharded."""

from dataclasses import replace

import pytest

from checks.breakit.patches import returning, skipping, wrapping
from checks.guides.g06_backward_prefetch.recipes import prefetch_two_back
from checks.guides.g08_post_backward_reduce_scatter.recipes import reduce_first_two_swapped
from checks.guides.g10_no_sync_and_frozen_params.recipes import (
    catch_all_freeing_silently,
    ddp_no_sync_syncs_anyway,
    forget_unsharded_grad,
    frozen_gets_grad_views,
    hold_reshard_only,
    reduce_anyway,
    zero_frozen_gradients,
)
from tests.break_it.conftest import guides, named_rows

GUIDE = "10-no-sync-and-frozen-params"
RU = "torch.distributed.fsdp._runtime_utils"
FP = "torch.distributed.fsdp._flat_param"
EOD = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"
C10D = "torch.distributed.distributed_c10d"
REDUCE_ANYWAY = wrapping(f"{RU}:_post_backward_hook", reduce_anyway)


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-keeps-unsharded-grad")
def test_a_no_sync_that_reduces_leaves_shards_not_unsharded_grads(broken) -> None:
    # The reduced shard waits in _saved_grad_shard, and the final callback, still inside no_sync, leaves it there.
    run = broken(REDUCE_ANYWAY)
    assert run.reason == "grad-size"
    assert run.details["observed"] == {"root": None, "blocks.0": None, "blocks.1": None, "blocks.2": None}


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-keeps-unsharded-grad")
def test_missing_gradient_views_are_caught(broken) -> None:
    run = broken(skipping(f"{FP}:FlatParamHandle._use_unsharded_grad_views"))
    assert run.reason == "grad-views"
    assert all(shape is None for shape in run.details["observed"].values())


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-grad-without-orig-params-at-4")
def test_a_no_sync_that_reduces_is_caught_on_4_ranks(broken) -> None:
    run = broken(REDUCE_ANYWAY)
    assert run.reason == "grad-size"
    assert run.details["observed"] == {"0": [None, None], "1": [None, None], "root": [None, None]}


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-grad-with-orig-params-at-4")
def test_a_no_sync_that_reduces_is_caught_with_orig_params(broken) -> None:
    run = broken(REDUCE_ANYWAY)
    assert run.reason == "grad-size"
    assert run.details["expected"] == {"0": [32, 32], "1": [44, 44], "root": [36, 36]}
    assert run.details["observed"] == {"0": [None, None], "1": [None, None], "root": [None, None]}


@pytest.mark.breaks("10-no-sync-and-frozen-params", "full-shard-no-sync-frees")
def test_a_backward_that_never_frees_is_caught(broken) -> None:
    run = broken(returning(f"{RU}:_should_free_in_backward", False))
    assert run.reason == "no-sync-backward"
    assert run.details["observed"][2:4] == ["post_backward blocks.2", "reshard blocks.2"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "full-shard-no-sync-frees")
def test_a_reduction_inside_no_sync_shows_in_the_backward_order(broken) -> None:
    run = broken(REDUCE_ANYWAY)
    assert run.reason == "no-sync-backward"
    assert "reduce_grad blocks.2" in run.details["observed"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-reduces-nothing")
def test_reduce_scatters_inside_no_sync_are_caught(broken) -> None:
    run = broken(REDUCE_ANYWAY)
    assert run.reason == "no-sync-reduce-scatter"
    assert run.details["observed"] == ["blocks.2 16020", "blocks.1 16020", "blocks.0 16020", "root 3528"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-reduces-nothing")
def test_backward_all_gathers_in_another_order_are_caught(broken) -> None:
    """Prefetching two units back all-gathers blocks.1, blocks.2, blocks.0 in backward: three 16,020-element
    all-gathers, the sizes the old check compared, so it passed. Named by unit, the order differs."""
    run = broken(wrapping(f"{EOD}.get_handle_to_backward_prefetch", prefetch_two_back))
    assert (run.reason, run.details["first"]) == ("no-sync-backward-all-gather", 0)
    assert run.details["observed"] == ["blocks.1 16020", "blocks.2 16020", "blocks.0 16020"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-reduces-nothing")
def test_the_synced_steps_reduce_scatters_in_another_order_are_caught(broken) -> None:
    """blocks.1 reduced before blocks.2 in the synced step: the same four sizes, which the old check compared."""
    run = broken(wrapping(f"{RU}:_reduce_grad", reduce_first_two_swapped))
    assert (run.reason, run.details["first"]) == ("sync-reduce-scatter", 0)
    assert run.details["observed"][:2] == ["blocks.1 16020", "blocks.2 16020"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-reduces-nothing")
def test_missing_all_gathers_are_caught(broken) -> None:
    # FSDP1 on CPU all-gathers through the list form; skipped, nothing reaches the recorder.
    run = broken(skipping(f"{C10D}:all_gather"))
    assert (run.reason, run.details["observed"]) == ("no-sync-forward-all-gather", [])


@pytest.mark.breaks("10-no-sync-and-frozen-params", "accumulation-is-whole-batch")
def test_a_dropped_accumulated_gradient_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle.prepare_gradient_for_backward", forget_unsharded_grad))
    assert run.reason == "beyond-tolerance"
    assert run.details["max_abs_diff"] > 1e4 * run.details["bound"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "accumulation-is-whole-batch")
def test_gradient_views_are_what_keeps_the_accumulation(broken) -> None:
    # Without the views, the root's pre-forward sees no original parameter with a .grad and drops the flat one.
    run = broken(skipping(f"{FP}:FlatParamHandle._use_unsharded_grad_views"))
    assert run.reason == "beyond-tolerance"
    assert run.details["max_abs_diff"] > 1e4 * run.details["bound"]


def test_reducing_inside_no_sync_gives_the_same_gradient(pool, request) -> None:
    # The guide says so: no_sync trades memory for communication, not values. Reduced every micro-batch, the shards
    # accumulate in _saved_grad_shard (guide 08) to the same gradient, and the claim still passes.
    from reader.pytest_plugin.hooks import claim_request

    guide = guides()[GUIDE]
    run = pool.run(
        claim_request(request.config, guide, guide.claim("accumulation-is-whole-batch"), patches=(REDUCE_ANYWAY,))
    )
    assert run.ok, run.failure


@pytest.mark.breaks("10-no-sync-and-frozen-params", "shard-grad-op-no-sync-keeps-params")
def test_shard_grad_op_freeing_inside_no_sync_is_caught(broken) -> None:
    run = broken(returning(f"{RU}:_should_free_in_backward", True))
    assert run.reason == "no-sync-backward"
    assert run.details["observed"][2:4] == ["post_backward blocks.2", "free blocks.2"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "shard-grad-op-no-sync-keeps-params")
def test_storage_freed_behind_the_recorder_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_catch_all_reshard", catch_all_freeing_silently))
    assert run.reason == "held-after-backward"
    assert set(run.details["observed"].values()) == {0}


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-middle-reshards-in-backward")
def test_a_frozen_unit_left_to_the_catch_all_is_caught(broken) -> None:
    run = broken(skipping(f"{RU}:_register_post_backward_reshard_only_hook"))
    assert run.reason == "frozen-timing"
    assert run.details["observed"][-2:] == ["final_callback root", "free blocks.1"]
    assert named_rows(run) == [("frozen-middle", "post_backward blocks.1 (reshard only)")]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-middle-reshards-in-backward")
def test_a_reshard_only_hook_that_does_nothing_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_backward_reshard_only_hook", hold_reshard_only))
    assert run.reason == "frozen-timing"
    assert "post_backward blocks.1 (reshard only)" not in run.details["observed"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-middle-reshards-in-backward")
def test_a_frozen_unit_kept_unsharded_is_caught(broken) -> None:
    run = broken(returning(f"{RU}:_should_free_in_backward", False))
    assert run.reason == "frozen-timing"
    assert "reshard blocks.1" in run.details["observed"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-root-waits-for-catch-all")
def test_a_frozen_root_never_resharded_is_caught(broken) -> None:
    run = broken(skipping(f"{RU}:_catch_all_reshard"))
    assert run.reason == "frozen-timing"
    assert run.details["observed"][-1] == "final_callback root"
    assert named_rows(run) == [("frozen-root", "free root")]  # the row no event matches


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-root-waits-for-catch-all")
def test_a_frozen_root_resharded_without_freeing_is_caught(broken) -> None:
    run = broken(returning(f"{RU}:_should_free_in_backward", False))
    assert run.reason == "frozen-timing"
    assert run.details["observed"][-2:] == ["final_callback root", "reshard root"]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-parameter-gets-no-grad")
def test_a_frozen_parameter_given_a_gradient_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._use_sharded_grad_views", frozen_gets_grad_views))
    assert run.reason == "frozen-has-grad"
    assert run.details["observed"][0] == "after backward 1"


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-parameter-gets-no-grad")
def test_a_frozen_parameters_gradient_left_uncomputed_is_caught(broken) -> None:
    # Zeroing the frozen region changes no parameter (nobody reads it): only the flat gradient shows it.
    run = broken(wrapping(f"{RU}:_reduce_grad", zero_frozen_gradients))
    assert run.reason == "flat-grad-differs"


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-parameter-gets-no-grad")
def test_a_layout_that_moves_the_frozen_parameter_is_caught_by_its_split(broken) -> None:
    # Alignment to 8 elements instead of 4 pads the block's 36-element parameters, so the frozen weight starts
    # later in the flat parameter and rank 0's shard holds less of it than the guide's 2,538.
    run = broken(returning(f"{FP}:_get_aligned_numel", 8))
    assert run.reason == "frozen-split"
    assert run.details["expected"] == [2538, 2646] and run.details["observed"] != [2538, 2646]


@pytest.mark.breaks("10-no-sync-and-frozen-params", "frozen-parameter-gets-no-grad")
def test_the_frozen_parameters_split_is_the_guides(broken) -> None:
    # A wrong figure in the guide is refused by the model first, before torch is compared with it.
    run = broken(shard_elements=[2646, 2538])
    assert run.reason == "frozen-split-model"
    assert run.details["observed"] == [2538, 2646]


# -- no-sync-steps ---------------------------------------------------------------------------------------------------
@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-steps")
def test_a_full_shard_that_reduces_inside_no_sync_is_caught_at_its_first_step(broken) -> None:
    run = broken(REDUCE_ANYWAY)
    assert run.reason == "reduce-differs-from-model"
    assert (run.details["strategy"], run.details["step"]) == ("full-shard", 1)
    assert len(run.details["observed"]) == 4 and run.details["expected"] == []


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-steps")
def test_a_shard_grad_op_that_frees_inside_no_sync_gathers_again_in_step_2(broken) -> None:
    run = broken(returning(f"{RU}:_should_free_in_backward", True))
    assert run.reason == "forward-differs-from-model"
    assert (run.details["strategy"], run.details["step"]) == ("shard-grad-op", 2)
    assert len(run.details["observed"]) == 4 and run.details["expected"] == []


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-steps")
def test_a_ddp_no_sync_that_syncs_anyway_is_caught(broken) -> None:
    run = broken(wrapping("torch.nn.parallel.distributed:DistributedDataParallel.no_sync", ddp_no_sync_syncs_anyway))
    assert run.reason == "all-reduce-differs-from-model"
    assert (run.details["strategy"], run.details["step"]) == ("ddp", 1)
    assert run.details["expected"] == [] and sum(int(n) for n in run.details["observed"]) == 51588


@pytest.mark.breaks("10-no-sync-and-frozen-params", "no-sync-steps")
def test_a_guide_that_has_shard_grad_op_gather_in_step_2_is_caught(broken) -> None:
    guide = guides()[GUIDE]
    stated = guide.expect_blocks(guide.read_on)["no-sync-steps"].expected
    step_1 = stated.row("shard-grad-op 1 no_sync")
    wrong = replace(
        step_1, text=step_1.text.replace("AG 4+0", "AG 0+0"), value=step_1.value.replace("AG 4+0", "AG 0+0")
    )
    run = broken(expected=replace(stated, rows=tuple(wrong if row is step_1 else row for row in stated.rows)))
    assert run.reason == "steps-differ-from-guide"
    assert named_rows(run) == [("no-sync-steps", "shard-grad-op 1 no_sync")]
