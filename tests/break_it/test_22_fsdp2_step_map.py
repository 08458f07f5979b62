"""Guide 22: bend FSDP2's step and watch the step map's claims fail."""

import pytest

from checks.breakit.patches import replacing, returning, skipping, wrapping
from checks.guides.g22_fsdp2_step_map.recipes import (
    forward_method_unwrapped,
    lazy_init_every_step,
    post_backward_resharding_anyway,
    pre_backward_as_function,
    reshard_recursively,
    root_hooks_only_its_loss_on_rank_1,
)
from tests.break_it.conftest import named_rows

S = "torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState"
PG = "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup"
F = "torch.distributed.fsdp._fully_shard._fully_shard"
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
