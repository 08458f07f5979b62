"""Guide 17: bend FSDP2's prefetch and watch its claims fail: a forward that prefetches as FSDP1 does, a backward
prefetch of nothing or of the wrong entry, explicit targets ignored or cut to one, groups kept unsharded, a second
request for a group in flight all-gathered again."""

import pytest

from checks.breakit.patches import returning, wrapping
from checks.guides.g17_fsdp2_prefetch import (
    first_target_only,
    forward_prefetch_like_fsdp1,
    ignore_backward_targets,
    ignore_forward_targets,
    implicit_prefetch_always,
    keep_order_across_steps,
    keep_unsharded_after_forward,
    prefetch_two_back,
    regather_when_pending,
)

GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup"
STATE = "torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState"
MODULE = "torch.distributed.fsdp._fully_shard._fully_shard:FSDPModule"
FSDP1_STYLE_FORWARD = wrapping(f"{STATE}._pre_forward", forward_prefetch_like_fsdp1)
NO_IMPLICIT_BACKWARD = returning(f"{GROUP}._backward_prefetch", None)
TWO_BACK = wrapping(f"{GROUP}._backward_prefetch", prefetch_two_back)


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


@pytest.mark.breaks("17-fsdp2-prefetch", "implicit-backward-prefetch")
def test_a_backward_prefetch_of_nothing_is_caught(broken) -> None:
    run = broken(NO_IMPLICIT_BACKWARD)
    assert (run.reason, run.details["workload"], run.details["observed"]) == ("prefetches-differ", "gpt", [])


@pytest.mark.breaks("17-fsdp2-prefetch", "implicit-backward-prefetch")
def test_prefetching_the_wrong_entry_is_caught(broken) -> None:
    run = broken(TWO_BACK)
    assert run.reason == "prefetches-differ"
    assert run.details["observed"] == ["root→blocks.1", "blocks.2→blocks.0"]


@pytest.mark.breaks("17-fsdp2-prefetch", "explicit-forward-prefetch")
def test_ignored_forward_targets_are_caught(broken) -> None:
    run = broken(wrapping(f"{STATE}._pre_forward", ignore_forward_targets))
    assert (run.reason, run.details["lookahead"], run.details["observed"]) == ("prefetches-differ", 1, [])


@pytest.mark.breaks("17-fsdp2-prefetch", "explicit-forward-prefetch")
def test_a_lookahead_cut_to_one_is_caught(broken) -> None:
    run = broken(wrapping(f"{MODULE}.set_modules_to_forward_prefetch", first_target_only))
    assert (run.reason, run.details["lookahead"]) == ("prefetches-differ", 2)
    assert run.details["observed"] == ["blocks.0→blocks.1", "blocks.1→blocks.2"]


@pytest.mark.breaks("17-fsdp2-prefetch", "explicit-backward-prefetch")
def test_ignored_backward_targets_are_caught(broken) -> None:
    # Lookahead 1 names what the implicit path prefetches anyway, so it passes; lookahead 2 does not.
    run = broken(wrapping(f"{STATE}._pre_backward", ignore_backward_targets))
    assert (run.reason, run.details["case"]) == ("prefetches-differ", "lookahead-2")
    assert run.details["observed"] == ["root→blocks.2", "blocks.2→blocks.1", "blocks.1→blocks.0"]


@pytest.mark.breaks("17-fsdp2-prefetch", "explicit-backward-prefetch")
def test_explicit_targets_that_still_run_the_implicit_prefetch_are_caught(broken) -> None:
    # default_prefetch forced True: the implicit target is prefetched before the explicit ones. The lookaheads
    # name the implicit target first anyway; only a root that names blocks.0 shows the difference.
    run = broken(wrapping(f"{GROUP}.pre_backward", implicit_prefetch_always))
    assert (run.reason, run.details["case"]) == ("prefetches-differ", "root-to-blocks.0")
    assert run.details["observed"] == ["root→blocks.2", "root→blocks.0", "blocks.2→blocks.1"]


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


@pytest.mark.breaks("17-fsdp2-prefetch", "all-gathers-per-step")
def test_groups_kept_unsharded_after_forward_are_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}.reshard", keep_unsharded_after_forward))
    assert (run.reason, run.details["reshard"], run.details["config"]) == ("all-gathers", "True", "implicit")
    assert run.details["observed"] == {"forward": 4, "backward": 0}


@pytest.mark.breaks("17-fsdp2-prefetch", "all-gathers-per-step")
def test_a_second_request_all_gathered_again_is_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}.unshard", regather_when_pending))
    assert (run.reason, run.details["reshard"], run.details["config"]) == ("all-gathers", "True", "implicit")
    assert run.details["observed"] == {"forward": 4, "backward": 7}
