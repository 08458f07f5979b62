"""Guide 17: bend FSDP2's prefetch and watch its claims fail: a forward that prefetches as FSDP1 does, a backward
prefetch of nothing or of the wrong entry, explicit targets ignored or cut to one, groups kept unsharded, a second
request for a group in flight all-gathered again; the post-forward order cleared after a backward that is not the
last, from the wrong place, or not at all, and (torch >= 2.15) manual finalization ignored, its
deferred reductions dropped, an asynchronous finalization that waits at once, a forward let through before wait()."""

from functools import partial

import pytest
import torch
from packaging.version import Version

from checks.breakit.patches import returning, wrapping
from checks.guides.g17_fsdp2_prefetch.recipes import (
    callback_ignores_manual_mode,
    callback_queued_every_time,
    clear_before_finalize,
    deferred_reductions_dropped,
    finalize_always_waits,
    first_target_only,
    forward_prefetch_like_fsdp1,
    forward_while_reduction_pending,
    ignore_backward_targets,
    ignore_forward_targets,
    implicit_prefetch_always,
    keep_order_across_steps,
    keep_unsharded_after_forward,
    keep_unsharded_without_gradient,
    last_backward_always,
    post_backward_once,
    post_forward_mesh_ignored,
    prefetch_two_back,
    record_first_use_only,
    regather_when_pending,
)
from tests.break_it.conftest import expect_block, named_rows, restated

block = partial(expect_block, "17-fsdp2-prefetch")
rewritten = partial(restated, "17-fsdp2-prefetch")

GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup"
STATE = "torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState"
MODULE = "torch.distributed.fsdp._fully_shard._fully_shard:FSDPModule"
FSDP1_STYLE_FORWARD = wrapping(f"{STATE}._pre_forward", forward_prefetch_like_fsdp1)
NO_IMPLICIT_BACKWARD = returning(f"{GROUP}._backward_prefetch", None)
TWO_BACK = wrapping(f"{GROUP}._backward_prefetch", prefetch_two_back)
CALLBACK = f"{STATE}._root_post_backward_final_callback"
EVERY_BACKWARD_LAST = wrapping(CALLBACK, last_backward_always)
CLEARED_FIRST = wrapping(CALLBACK, clear_before_finalize)
ORDER_KEPT = wrapping(CALLBACK, keep_order_across_steps)
TORCH_2_15 = Version(torch.__version__.split("+")[0]) >= Version("2.15")
needs_old = pytest.mark.skipif(TORCH_2_15, reason=f"the claim is for torch < 2.15; this is {torch.__version__}")
needs_new = pytest.mark.skipif(not TORCH_2_15, reason=f"the claim is for torch >= 2.15; this is {torch.__version__}")
# The paths the guide states for each side (`expect clear-paths-2.13`, `clear-paths-2.15`): the callback alone, or
# 2.15's call chain through wait_for_gradient_reduction.
PATH_2_13 = ["FSDPState._root_post_backward_final_callback"]
PATH_2_15 = [*PATH_2_13, "FSDPState.wait_for_gradient_reduction", "FSDPState._end_backward_iteration"]
CLEAR_PATHS = "clear-paths-2.15" if TORCH_2_15 else "clear-paths-2.13"


@pytest.mark.breaks("17-fsdp2-prefetch", "no-implicit-forward-prefetch")
def test_a_forward_that_prefetches_the_next_unit_is_caught(broken) -> None:
    run = broken(FSDP1_STYLE_FORWARD)
    assert (run.reason, run.details["step"]) == ("forward-prefetched", 1)
    assert run.details["observed"] == ["root→blocks.0", "blocks.0→blocks.1", "blocks.1→blocks.2"]


@pytest.mark.breaks("17-fsdp2-prefetch", "no-implicit-forward-prefetch")
def test_a_model_that_disagrees_on_the_backward_is_caught_too(broken) -> None:
    # Forward untouched: the own-unshard checks pass, and the whole-step comparison with the model fails.
    run = broken(NO_IMPLICIT_BACKWARD)
    assert run.reason == "sequence-differs"
    assert run.details["expected"][run.details["first"]] == "prefetch root→blocks.2"


@pytest.mark.breaks("17-fsdp2-prefetch", "no-implicit-forward-prefetch")
def test_a_guide_that_unshards_blocks_2_before_blocks_1_is_caught(broken) -> None:
    run = broken(expected=rewritten("forward-unshards", {"blocks.1": "blocks.2", "blocks.2": "blocks.1"}))
    assert (run.reason, run.details["step"]) == ("forward-differs", 1)
    # The first row the run makes false: the third unshard is blocks.1's, not blocks.2's.
    assert named_rows(run) == [("forward-unshards", "blocks.2")]


@pytest.mark.breaks("17-fsdp2-prefetch", "implicit-backward-prefetch")
def test_a_backward_prefetch_of_nothing_is_caught(broken) -> None:
    run = broken(NO_IMPLICIT_BACKWARD)
    assert (run.reason, run.details["workload"], run.details["observed"]) == ("prefetches-differ", "gpt", [])
    assert named_rows(run) == [("backward-implicit", "root")]


@pytest.mark.breaks("17-fsdp2-prefetch", "implicit-backward-prefetch")
def test_prefetching_the_wrong_entry_is_caught(broken) -> None:
    run = broken(TWO_BACK)
    assert run.reason == "prefetches-differ"
    assert run.details["observed"] == ["root→blocks.1", "blocks.2→blocks.0"]
    assert named_rows(run) == [("backward-implicit", "root")]


@pytest.mark.breaks("17-fsdp2-prefetch", "explicit-forward-prefetch")
def test_ignored_forward_targets_are_caught(broken) -> None:
    run = broken(wrapping(f"{STATE}._pre_forward", ignore_forward_targets))
    assert (run.reason, run.details["lookahead"], run.details["observed"]) == ("prefetches-differ", 1, [])
    assert named_rows(run) == [("forward-explicit", "lookahead-1")]


@pytest.mark.breaks("17-fsdp2-prefetch", "explicit-forward-prefetch")
def test_a_lookahead_cut_to_one_is_caught(broken) -> None:
    run = broken(wrapping(f"{MODULE}.set_modules_to_forward_prefetch", first_target_only))
    assert (run.reason, run.details["lookahead"]) == ("prefetches-differ", 2)
    assert run.details["observed"] == ["blocks.0→blocks.1", "blocks.1→blocks.2"]
    assert named_rows(run) == [("forward-explicit", "lookahead-2")]


@pytest.mark.breaks("17-fsdp2-prefetch", "explicit-backward-prefetch")
def test_ignored_backward_targets_are_caught(broken) -> None:
    # Lookahead 1 names what the implicit path prefetches anyway, so it passes; lookahead 2 does not.
    run = broken(wrapping(f"{STATE}._pre_backward", ignore_backward_targets))
    assert (run.reason, run.details["case"]) == ("prefetches-differ", "lookahead-2")
    assert run.details["observed"] == ["root→blocks.2", "blocks.2→blocks.1", "blocks.1→blocks.0"]
    assert named_rows(run) == [("backward-explicit", "lookahead-2")]


@pytest.mark.breaks("17-fsdp2-prefetch", "explicit-backward-prefetch")
def test_explicit_targets_that_still_run_the_implicit_prefetch_are_caught(broken) -> None:
    # default_prefetch forced True: the implicit target is prefetched before the explicit ones. The lookaheads
    # name the implicit target first anyway; only a root that names blocks.0 shows the difference.
    run = broken(wrapping(f"{GROUP}.pre_backward", implicit_prefetch_always))
    assert (run.reason, run.details["case"]) == ("prefetches-differ", "root-to-blocks.0")
    assert run.details["observed"] == ["root→blocks.2", "root→blocks.0", "blocks.2→blocks.1"]
    assert named_rows(run) == [("backward-explicit", "root-to-blocks.0")]


@pytest.mark.breaks("17-fsdp2-prefetch", "order-of-this-step")
def test_an_order_kept_from_the_previous_step_is_caught(broken) -> None:
    run = broken(wrapping(f"{STATE}._root_post_backward_final_callback", keep_order_across_steps))
    assert (run.reason, run.details["step"]) == ("post-forward-order", 2)
    assert run.details["observed"][:4] == ["blocks.0", "blocks.1", "blocks.2", "root"]


@pytest.mark.breaks("17-fsdp2-prefetch", "order-of-this-step")
def test_explicit_targets_ignored_after_the_reorder_are_caught(broken) -> None:
    run = broken(wrapping(f"{STATE}._pre_backward", ignore_backward_targets))
    assert (run.reason, run.details["case"]) == ("prefetches-differ", "explicit")
    assert run.details["observed"] == ["root→blocks.0", "blocks.0→blocks.1", "blocks.1→blocks.2"]
    assert named_rows(run) == [("reordered-step-2", "explicit")]


@pytest.mark.breaks("17-fsdp2-prefetch", "all-gathers-per-step")
def test_groups_kept_unsharded_after_forward_are_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}.reshard", keep_unsharded_after_forward))
    assert (run.reason, run.details["reshard"], run.details["config"]) == ("all-gathers", "True", "implicit")
    assert run.details["observed"] == {"forward": 4, "backward": 0}
    assert named_rows(run) == [("all-gathers", "True")]


@pytest.mark.breaks("17-fsdp2-prefetch", "all-gathers-per-step")
def test_a_second_request_all_gathered_again_is_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}.unshard", regather_when_pending))
    assert (run.reason, run.details["reshard"], run.details["config"]) == ("all-gathers", "True", "implicit")
    assert run.details["observed"] == {"forward": 4, "backward": 7}
    assert named_rows(run) == [("all-gathers", "True")]


# -- where and when the post-forward order is cleared: one test per bend, run on each side of torch 2.15 ----------
def _order_cleared_after_a_backward_that_is_not_last(broken, path: list[str]) -> None:
    run = broken(EVERY_BACKWARD_LAST)
    assert (run.reason, run.details["step"]) == ("clear-path-differs", "backward 2, not last")
    assert run.details["observed"] == [(path, 4)] and run.details["expected"] == []
    # The guide's length after a backward that is not the last: the order kept, 4 entries.
    assert named_rows(run) == [("order-lengths", "backward 2, not last")]


def _order_cleared_in_the_callback_first(broken, path: list[str]) -> None:
    run = broken(CLEARED_FIRST)
    assert (run.reason, run.details["step"]) == ("clear-path-differs", "backward 1")
    # The early clear comes from the recipe (no fully_shard frame outside it), then torch's own finds it empty.
    assert run.details["observed"] == [([], 4), (path, 0)]
    assert named_rows(run) == [(CLEAR_PATHS, "automatic")]


def _order_kept_across_steps(broken) -> None:
    run = broken(ORDER_KEPT)
    assert run.reason == "order-length-differs"
    assert run.details["observed"][1] == ("backward 1", 4)
    assert named_rows(run) == [("order-lengths", "backward 1")]


@needs_old
@pytest.mark.breaks("17-fsdp2-prefetch", "order-cleared-by-final-callback")
def test_an_order_cleared_after_a_backward_that_is_not_last_is_caught(broken) -> None:
    _order_cleared_after_a_backward_that_is_not_last(broken, PATH_2_13)


@needs_old
@pytest.mark.breaks("17-fsdp2-prefetch", "order-cleared-by-final-callback")
def test_an_order_cleared_before_the_groups_finalize_is_caught(broken) -> None:
    _order_cleared_in_the_callback_first(broken, PATH_2_13)


@needs_old
@pytest.mark.breaks("17-fsdp2-prefetch", "order-cleared-by-final-callback")
def test_an_order_never_emptied_is_caught(broken) -> None:
    _order_kept_across_steps(broken)


@needs_new
@pytest.mark.breaks("17-fsdp2-prefetch", "order-cleared-at-end-of-iteration")
def test_an_order_cleared_after_a_backward_that_is_not_last_is_caught_on_2_15(broken) -> None:
    _order_cleared_after_a_backward_that_is_not_last(broken, PATH_2_15)


@needs_new
@pytest.mark.breaks("17-fsdp2-prefetch", "order-cleared-at-end-of-iteration")
def test_an_order_cleared_in_the_callback_as_in_2_13_is_caught_on_2_15(broken) -> None:
    # The 2.13 place (the callback itself, here before the groups finalize) is not 2.15's call path.
    _order_cleared_in_the_callback_first(broken, PATH_2_15)


@needs_new
@pytest.mark.breaks("17-fsdp2-prefetch", "order-cleared-at-end-of-iteration")
def test_an_order_never_emptied_is_caught_on_2_15(broken) -> None:
    _order_kept_across_steps(broken)


@needs_new
@pytest.mark.breaks("17-fsdp2-prefetch", "manual-finalization-keeps-order")
def test_a_callback_that_ignores_manual_finalization_is_caught(broken) -> None:
    run = broken(wrapping(CALLBACK, callback_ignores_manual_mode))
    assert (run.reason, run.details["step"]) == ("clear-path-differs", 1)
    assert run.details["observed"] == [(PATH_2_15, 4)] and run.details["expected"] == []
    assert named_rows(run) == [("manual-lengths", "backward, manual")]


@needs_new
@pytest.mark.breaks("17-fsdp2-prefetch", "manual-finalization-keeps-order")
def test_deferred_reductions_dropped_are_caught(broken) -> None:
    run = broken(wrapping(CALLBACK, deferred_reductions_dropped))
    assert run.reason == "reduce-scatters-differ"
    assert run.details["observed"] == {"backward": 3, "finalize_backward": 0}


@needs_new
@pytest.mark.breaks("17-fsdp2-prefetch", "manual-finalization-keeps-order")
def test_an_asynchronous_finalization_that_waits_at_once_is_caught(broken) -> None:
    run = broken(wrapping(f"{STATE}.finalize_backward", finalize_always_waits))
    assert (run.reason, run.details["step"]) == ("clear-path-differs", 2)
    assert run.details["expected"] == [] and len(run.details["observed"]) == 1
    assert named_rows(run) == [("manual-lengths", "finalize_backward, async")]


@needs_new
@pytest.mark.breaks("17-fsdp2-prefetch", "manual-finalization-keeps-order")
def test_a_forward_let_through_before_wait_is_caught(broken) -> None:
    run = broken(wrapping(f"{STATE}._pre_forward", forward_while_reduction_pending))
    assert (run.reason, run.details["step"]) == ("forward-before-wait-ran", 2)


@needs_new
@pytest.mark.breaks("17-fsdp2-prefetch", "manual-finalization-keeps-order")
def test_no_backward_prefetch_under_manual_finalization_is_caught(broken) -> None:
    run = broken(NO_IMPLICIT_BACKWARD)
    assert (run.reason, run.details["observed"]) == ("prefetches-differ", [])
    assert named_rows(run) == [("backward-implicit", "root")]


# -- per-unit settings -------------------------------------------------------------------------------------------
@pytest.mark.breaks("17-fsdp2-prefetch", "per-unit-settings")
def test_an_int_setting_read_as_true_is_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}._to_sharded_post_forward", post_forward_mesh_ignored))
    assert run.reason == "sequence-differs"
    assert "reshard blocks.2" in run.details["expected"] and "reshard blocks.2" not in run.details["observed"]


@pytest.mark.breaks("17-fsdp2-prefetch", "per-unit-settings")
def test_per_unit_settings_ignored_in_forward_are_caught(broken) -> None:
    # Every group kept after forward, as if each unit's setting were False: blocks.0 is never freed.
    run = broken(wrapping(f"{GROUP}.reshard", keep_unsharded_after_forward))
    assert run.reason == "sequence-differs"
    assert "free blocks.0" in run.details["expected"]


@pytest.mark.breaks("17-fsdp2-prefetch", "per-unit-settings")
def test_a_guide_that_says_blocks_1_is_freed_is_caught(broken) -> None:
    run = broken(expected=rewritten("per-unit-settings", {"blocks.1": "freed after forward"}))
    assert run.reason == "settings-differ-from-guide"
    assert named_rows(run) == [("per-unit-settings", "blocks.1")]


# -- a root without parameters ---------------------------------------------------------------------------------------
@pytest.mark.breaks("17-fsdp2-prefetch", "root-without-parameters")
def test_a_callback_queued_by_every_state_is_caught(broken) -> None:
    run = broken(wrapping(f"{STATE}._register_root_post_backward_final_callback", callback_queued_every_time))
    assert run.reason == "sequence-differs"
    assert sum(e.startswith("final_callback") for e in run.details["observed"]) > 1


@pytest.mark.breaks("17-fsdp2-prefetch", "root-without-parameters")
def test_a_backward_prefetch_that_skips_a_unit_is_caught_without_root_parameters(broken) -> None:
    run = broken(TWO_BACK)
    assert run.reason == "sequence-differs"
    assert "prefetch 2→0" in run.details["observed"]


@pytest.mark.breaks("17-fsdp2-prefetch", "root-without-parameters")
def test_a_guide_that_says_the_root_queues_the_callback_is_caught(broken) -> None:
    stated = {"root events": "root_pre_forward final_callback", "final callback queued by": "root"}
    run = broken(expected=rewritten("root-without-parameters", stated))
    assert run.reason == "root-differs-from-guide"
    assert named_rows(run) == [("root-without-parameters", key) for key in stated]


# -- several forwards before backward -------------------------------------------------------------------------------
@pytest.mark.breaks("17-fsdp2-prefetch", "several-forwards")
def test_a_post_forward_order_without_multiplicity_is_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}._record_post_forward", record_first_use_only))
    assert (run.reason, run.details["case"]) == ("post-forward-order", "one backward")
    assert run.details["observed"] == ["blocks.0", "blocks.1", "blocks.2", "root"]


@pytest.mark.breaks("17-fsdp2-prefetch", "several-forwards")
def test_a_group_kept_unsharded_until_its_gradient_is_caught(broken) -> None:
    # The first forward's uses find their blocks unsharded: three all-gathers fewer in backward.
    run = broken(wrapping(f"{GROUP}.post_backward", keep_unsharded_without_gradient))
    assert (run.reason, run.details["case"]) == ("sequence-differs", "one backward")
    expected, observed = run.details["expected"], run.details["observed"]
    assert expected.count("unshard blocks.2") == observed.count("unshard blocks.2") + 1


@pytest.mark.breaks("17-fsdp2-prefetch", "several-forwards")
def test_a_post_backward_that_runs_once_loses_the_reduce_scatters(broken) -> None:
    run = broken(wrapping(f"{GROUP}.post_backward", post_backward_once))
    assert (run.reason, run.details["case"]) == ("sequence-differs", "one backward")
    assert "reduce_grad blocks.2" in run.details["expected"]
    assert "reduce_grad blocks.2" not in run.details["observed"]


@pytest.mark.breaks("17-fsdp2-prefetch", "several-forwards")
def test_every_backward_taken_as_the_last_is_caught(broken) -> None:
    # The first backward clears the indices even after set_is_last_backward(False): no prefetch in the second.
    run = broken(EVERY_BACKWARD_LAST)
    assert (run.reason, run.details["case"]) == ("sequence-differs", "two, the first not last")


@pytest.mark.breaks("17-fsdp2-prefetch", "several-forwards")
def test_a_guide_that_says_one_backward_reduces_twice_per_group_is_caught(broken) -> None:
    run = broken(expected=rewritten("several-forwards", {"one backward": "7  6  5  7  8"}))
    assert (run.reason, run.details["case"]) == ("model-differs-from-guide", "one backward")
    assert named_rows(run) == [("several-forwards", "one backward")]
