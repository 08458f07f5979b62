"""Guide 04: bend forward prefetch and watch the claims fail."""

import pytest

from checks.breakers import wrapping
from checks.protocol import Patch

RU = "torch.distributed.fsdp._runtime_utils"
EOD = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"


@pytest.mark.breaks("04-forward-prefetch", "no-prefetch-in-iteration-1")
def test_a_policy_that_prefetches_in_iteration_1_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", "forward_target_by_module_order"))
    assert "iteration 1 prefetched in forward: ['root -> blocks.0'" in run.failure


@pytest.mark.breaks("04-forward-prefetch", "no-prefetch-in-iteration-1")
def test_forward_prefetch_that_never_starts_is_caught(broken) -> None:
    run = broken(Patch(f"{RU}:_get_handle_to_prefetch", "checks.sabotage:returns", {"value": None}))
    assert "iteration 2 did not prefetch in forward either" in run.failure


@pytest.mark.breaks("04-forward-prefetch", "follows-iteration-1-order")
def test_prefetching_two_ahead_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", "prefetch_two_ahead"))
    assert "iteration 2 prefetched ['root -> blocks.1'" in run.failure


@pytest.mark.breaks("04-forward-prefetch", "follows-iteration-1-order")
def test_a_guide_that_states_another_order_fails(broken) -> None:
    run = broken(stated=["root -> blocks.0", "blocks.0 -> blocks.2"])
    assert "does not give the prefetches the guide states" in run.failure


@pytest.mark.breaks("04-forward-prefetch", "stale-order-after-change")
def test_an_order_recorded_every_iteration_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.next_iter", "next_iter_forgetting_order"))
    assert "iteration 2 prefetched []; the iteration-1 order predicts ['root -> blocks.0']" in run.failure
