"""Guide 22: bend FSDP2's step and watch the step map's claims fail."""

import pytest

from checks.breakit.patches import replacing, returning, skipping, wrapping
from checks.guides.g22_fsdp2_step_map.recipes import (
    cap_never_reached,
    divide_factor_recursively,
    forward_method_unwrapped,
    lazy_init_every_step,
    max_buffers_in_force_at_once,
    post_backward_resharding_anyway,
    pre_backward_as_function,
    reduce_without_hook,
    reset_keeping_callback_flag,
    reshard_recursively,
    root_hooks_only_its_loss_on_rank_1,
    unshard_in_backward_ignored,
)
from tests.break_it.conftest import named_rows

S = "torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState"
PG = "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup"
F = "torch.distributed.fsdp._fully_shard._fully_shard"
C = "torch.distributed.fsdp._fully_shard._fsdp_collectives"
ROOT_PRE_BACKWARD = (
    "backward  root      pre-backward: queue final callback, pre_backward, _backward_prefetch, "
    "_prefetch_unshard blocks.2, unshard blocks.2 (all-gather)"
)


@pytest.mark.breaks("22-fsdp2-step-map", "step-map")
def test_no_backward_prefetch_changes_the_map(broken) -> None:
    run = broken(returning(f"{PG}._backward_prefetch", None))
    assert run.reason == "step-differs"
    # The first row a step without prefetch makes false: the root's pre-backward prefetches nothing ...
    assert [(block, " ".join(key.split())) for block, key in named_rows(run)] == [
        ("step", " ".join(ROOT_PRE_BACKWARD.split()))
    ]
    # ... and each block then all-gathers its own group in its pre-backward.
    assert any(row.startswith("backward blocks.2 pre-backward: pre_backward, unshard (all-gather)")
               for row in run.details["observed"])  # fmt: skip


@pytest.mark.breaks("22-fsdp2-step-map", "step-map")
def test_a_final_callback_never_queued_leaves_the_next_step_reducing_nothing(broken) -> None:
    run = broken(skipping(f"{S}._register_root_post_backward_final_callback"))
    assert run.reason == "step-differs"
    # Nothing reset the first step's states: the second forward runs as a recompute inside backward (no claim of
    # the step, no reshard, no hooks), and its backward runs no FSDP hook at all, reducing no gradient.
    observed = run.details["observed"]
    assert observed[0] == "forward root pre-forward: (returns at once)"
    assert all(row.startswith("forward ") for row in observed) and len(observed) == 8
    assert named_rows(run)[0][1].startswith("forward   root      pre-forward: _root_pre_forward")


@pytest.mark.breaks("22-fsdp2-step-map", "first-step")
def test_lazy_init_run_again_every_step_is_caught(broken) -> None:
    run = broken(wrapping(f"{S}._lazy_init", lazy_init_every_step))
    assert run.reason == "first-step-differs"
    assert run.details["differing"] == []  # the second step's root pre-forward initialises again
    assert "_init_shared_state" in run.details["second"][0]


@pytest.mark.breaks("22-fsdp2-step-map", "hooks-on-tensors")
def test_a_pre_backward_function_instead_of_tensor_hooks_is_caught(broken) -> None:
    run = broken(replacing(f"{S}._register_pre_backward_hook", pre_backward_as_function))
    assert run.reason == "hooks-differ"
    # Every output row is false (no tensor hook), and so is the pre-backward Function's: one per unit now.
    false = ["logits", "loss", "blocks.0 output", "blocks.1 output", "blocks.2 output", "pre-backward Function"]
    assert [key for _, key in named_rows(run)] == false


@pytest.mark.breaks("22-fsdp2-step-map", "same-on-every-rank")
def test_a_rank_whose_root_hooks_one_output_fewer_is_caught(broken) -> None:
    run = broken(wrapping(f"{S}._register_pre_backward_hook", root_hooks_only_its_loss_on_rank_1))
    assert run.reason == "differs-between-ranks"
    assert run.details == {"what": "the step map", "differing": [1]}


@pytest.mark.breaks("22-fsdp2-step-map", "same-on-every-rank-at-4")
def test_a_rank_whose_root_hooks_one_output_fewer_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{S}._register_pre_backward_hook", root_hooks_only_its_loss_on_rank_1))
    assert run.reason == "differs-between-ranks"
    assert run.details["differing"] == [1]


@pytest.mark.breaks("22-fsdp2-step-map", "forward-method")
def test_a_registration_that_wraps_nothing_is_caught(broken) -> None:
    run = broken(wrapping(f"{F}:register_fsdp_forward_method", forward_method_unwrapped))
    assert run.reason == "forward-method-differs"
    # The registered head fails as the unregistered one did; the rows after it (the weight, generate) are as
    # the guide says, since nothing ran.
    assert [key for _, key in named_rows(run)] == ["head, registered", "the head's weight after it",
                                                    "generate, not registered"]  # fmt: skip


@pytest.mark.breaks("22-fsdp2-step-map", "explicit-unshard")
def test_a_recursive_reshard_is_caught(broken) -> None:
    run = broken(wrapping(f"{F}:FSDPModule.reshard", reshard_recursively))
    assert run.reason == "explicit-unshard-differs"
    assert named_rows(run) == [("explicit-unshard", "unsharded after model.reshard()")]
    assert run.details["observed"]["unsharded after model.reshard()"] == "none"


@pytest.mark.breaks("22-fsdp2-step-map", "explicit-unshard")
def test_a_handle_that_does_not_wait_is_caught(broken) -> None:
    # The copy-out is left to the next pre-forward: the weight stays a DTensor after wait(), and that
    # pre-forward waits.
    run = broken(skipping(f"{F}:_UnshardHandleImpl.wait"))
    assert run.reason == "explicit-unshard-differs"
    assert [key for _, key in named_rows(run)][:2] == [
        "blocks.0 weight after wait",
        "blocks.0 pre-forward after a wait",
    ]


@pytest.mark.breaks("22-fsdp2-step-map", "kept-after-forward")
def test_a_setter_that_sets_nothing_is_caught(broken) -> None:
    run = broken(skipping(f"{F}:FSDPModule.set_reshard_after_forward"))
    assert run.reason == "kept-rows-differ"
    assert run.details["observed"] == []  # the map is the default's: no row changed
    assert [key.split()[:2] for _, key in named_rows(run)] == [["forward", "blocks.0"]]


@pytest.mark.breaks("22-fsdp2-step-map", "kept-after-backward")
def test_a_post_backward_that_reshards_anyway_is_caught(broken) -> None:
    # The flag is set, and the group's post-backward ignores it: the map is the default's again.
    run = broken(wrapping(f"{PG}.post_backward", post_backward_resharding_anyway))
    assert run.reason == "kept-rows-differ"
    assert run.details["observed"] == []


@pytest.mark.breaks("22-fsdp2-step-map", "unshard-in-backward")
def test_an_unshard_that_ignores_the_flag_is_caught(broken) -> None:
    run = broken(wrapping(f"{PG}.unshard", unshard_in_backward_ignored))
    assert run.reason == "unshard-rows-differ"
    assert run.details["observed"] == []  # the map is the default's: pos_emb all-gathers in backward again


@pytest.mark.breaks("22-fsdp2-step-map", "custom-collectives")
def test_a_reduce_that_drops_the_hook_is_caught(broken) -> None:
    run = broken(wrapping(f"{C}:foreach_reduce", reduce_without_hook))
    assert run.reason == "hook-sizes-differ"
    assert run.details["observed"] == []


@pytest.mark.breaks("22-fsdp2-step-map", "custom-collectives")
def test_an_ignored_custom_all_gather_is_caught(broken) -> None:
    run = broken(skipping(f"{F}:FSDPModule.set_custom_all_gather"))
    assert run.reason == "model-differs"
    assert run.details["observed"][0] == 0  # no all-gather went through the custom comm


@pytest.mark.breaks("22-fsdp2-step-map", "divide-factor")
def test_a_recursive_divide_factor_is_caught(broken) -> None:
    run = broken(wrapping(f"{F}:FSDPModule.set_gradient_divide_factor", divide_factor_recursively))
    assert run.reason == "divide-factor-differs"
    # Sums are forced on the root only: the blocks' factor of 4 is a PREMUL_SUM, which gloo refuses.
    assert [key for _, key in named_rows(run)] == [
        "with set_force_sum_reduction_for_comms(True), root",
        "with set_force_sum_reduction_for_comms(True), blocks",
    ]
    assert "PREMUL_SUM" in run.details["observed"]["with set_force_sum_reduction_for_comms(True), blocks"]


@pytest.mark.breaks("22-fsdp2-step-map", "separate-reduce-scatter-group")
def test_a_reduce_scatter_left_on_the_all_gather_group_is_caught(broken) -> None:
    run = broken(skipping(f"{PG}._set_separate_reduce_scatter_group"))
    assert run.reason == "reduce-scatter-group-differs"
    assert named_rows(run) == [("separate-reduce-scatter-group", "their process groups")]


@pytest.mark.breaks("22-fsdp2-step-map", "reduce-scatter-buffers")
def test_a_cap_that_changes_after_the_first_forward_is_caught(broken) -> None:
    run = broken(wrapping(f"{F}:FSDPModule.set_reduce_scatter_max_input_buffers", max_buffers_in_force_at_once))
    assert run.reason == "buffers-differ"
    assert named_rows(run) == [("reduce-scatter-buffers", "set to 4 after the first step")]


@pytest.mark.breaks("22-fsdp2-step-map", "reduce-scatter-buffers")
def test_buffers_never_reclaimed_are_caught(broken) -> None:
    run = broken(wrapping(f"{S}._init_shared_state", cap_never_reached))
    assert run.reason == "cap-differs"
    assert run.details["observed"] == [1, 2, 3, 4]  # the default cap of 1 no longer holds


@pytest.mark.breaks("22-fsdp2-step-map", "reset-iter-state")
def test_a_reset_that_does_nothing_is_caught(broken) -> None:
    run = broken(skipping(f"{S}._reset_iter_state"))
    assert run.reason == "reset-differs"
    assert [key for _, key in named_rows(run)] == [
        "after a forward that raised, reset",
        "after a backward that raised, reset",
        "after a backward that raised, reset, reduced",
    ]


@pytest.mark.breaks("22-fsdp2-step-map", "reset-iter-state")
def test_a_reset_that_keeps_the_callback_flag_is_caught(broken) -> None:
    run = broken(wrapping(f"{S}._reset_iter_state", reset_keeping_callback_flag))
    assert run.reason == "reset-differs"
    assert [key for _, key in named_rows(run)] == [
        "after a backward that raised, reset",
        "after a backward that raised, reset, reduced",
    ]


@pytest.mark.breaks("22-fsdp2-step-map", "share-comm-ctx")
def test_a_share_that_shares_nothing_is_caught(broken) -> None:
    run = broken(skipping(f"{F}:share_comm_ctx"))
    assert run.reason == "comm-ctx-differs"
    assert named_rows(run) == [("share-comm-ctx", "share_comm_ctx([a, b])")]
