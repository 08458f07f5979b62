"""Guide 04: bend forward prefetch and watch the claims fail."""

import pytest

from checks.breakit.patches import returning, wrapping
from checks.guides.g04_forward_prefetch import (
    forward_target_after_next_iter,
    forward_target_by_module_order,
    next_iter_forgetting_order,
    prefetch_two_ahead,
)

RU = "torch.distributed.fsdp._runtime_utils"
EOD = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"


@pytest.mark.breaks("04-forward-prefetch", "no-prefetch-in-iteration-1")
def test_a_policy_that_prefetches_in_iteration_1_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", forward_target_by_module_order))
    assert run.reason == "prefetched-in-iteration-1"
    assert run.details["observed"][0] == "root -> blocks.0"


@pytest.mark.breaks("04-forward-prefetch", "no-prefetch-in-iteration-1")
def test_forward_prefetch_that_never_starts_is_caught(broken) -> None:
    run = broken(returning(f"{RU}:_get_handle_to_prefetch", None))
    assert run.reason == "never-prefetched"


@pytest.mark.breaks("04-forward-prefetch", "follows-iteration-1-order")
def test_prefetching_two_ahead_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", prefetch_two_ahead))
    assert run.reason == "prefetch-order"
    assert run.details["observed"][0] == "root -> blocks.1"


@pytest.mark.breaks("04-forward-prefetch", "follows-iteration-1-order")
def test_a_guide_that_states_another_order_fails(broken) -> None:
    stated = ["root -> blocks.0", "blocks.0 -> blocks.2"]
    run = broken(stated=stated)
    assert run.reason == "order-differs-from-guide"
    assert run.details["expected"] == stated


@pytest.mark.breaks("04-forward-prefetch", "stale-order-after-change")
def test_an_order_recorded_every_iteration_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.next_iter", next_iter_forgetting_order))
    assert run.reason == "not-the-recorded-order"
    assert (run.details["observed"], run.details["expected"]) == ([], ["root -> blocks.0"])


@pytest.mark.breaks("04-forward-prefetch", "prefetch-holds-next-unit")
def test_no_prefetch_holds_nothing_extra(broken) -> None:
    run = broken(returning(f"{RU}:_get_handle_to_prefetch", None))
    assert (run.reason, run.details["prefetch"]) == ("held-differs", "with")
    assert run.details["observed"]["blocks.0"] == ["root", "blocks.0"]
    assert run.details["expected"]["blocks.0"] == ["root", "blocks.0", "blocks.1"]


@pytest.mark.breaks("04-forward-prefetch", "prefetch-holds-next-unit")
def test_prefetching_two_ahead_holds_the_wrong_unit(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", prefetch_two_ahead))
    assert run.reason == "held-differs"
    assert run.details["observed"]["root"] == ["root", "blocks.1"]


@pytest.mark.breaks("04-forward-prefetch", "prefetch-without-backward")
def test_a_record_that_waits_for_next_iter_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", forward_target_after_next_iter))
    assert (run.reason, run.details["forward"], run.details["observed"]) == ("prefetch-order", 2, [])
