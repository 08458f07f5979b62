"""Guide 03: bend unshard and reshard and watch the claims fail."""

import pytest

from checks.breakers import wrapping
from checks.protocol import Patch

RU = "torch.distributed.fsdp._runtime_utils"
FP = "torch.distributed.fsdp._flat_param"
NOTHING_RESHARDS = Patch(f"{FP}:RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", "checks.sabotage:value", {"value": ()})
SHARD_GRAD_OP_RESHARDS = Patch(
    f"{FP}:RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", "checks.breakers:every_sharded_strategy"
)


@pytest.mark.breaks("03-unshard-reshard", "full-shard-frees-non-roots")
def test_full_shard_that_keeps_everything_is_caught(broken) -> None:
    run = broken(NOTHING_RESHARDS)
    assert "FULL_SHARD: unsharded bytes held after forward" in run.failure
    assert "'blocks.0': 64080" in run.failure


@pytest.mark.breaks("03-unshard-reshard", "full-shard-frees-non-roots")
def test_freeing_the_root_too_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_forward_reshard", "reshard_everything"))
    assert "'root': 0" in run.failure


@pytest.mark.breaks("03-unshard-reshard", "shard-grad-op-frees-nothing")
def test_shard_grad_op_that_frees_is_caught(broken) -> None:
    run = broken(SHARD_GRAD_OP_RESHARDS)
    assert "SHARD_GRAD_OP: unsharded bytes held after forward" in run.failure


@pytest.mark.breaks("03-unshard-reshard", "shard-grad-op-no-backward-all-gathers")
def test_shard_grad_op_that_regathers_in_backward_is_caught(broken) -> None:
    # With use_orig_params=True, freeing SHARD_GRAD_OP units after forward trips an internal assertion in
    # backward (their views were left unsharded on purpose); without it the re-gather runs and is counted.
    run = broken(SHARD_GRAD_OP_RESHARDS, use_orig_params=False)
    assert "step 1: 4 all-gathers in forward and 3 in backward; SHARD_GRAD_OP should give 4 and 0" in run.failure


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit")
def test_a_second_all_gather_per_unit_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", "all_gather_twice"))
    assert "forward 1's all-gather sizes (one per unit) differs from the expectation" in run.failure


@pytest.mark.breaks("03-unshard-reshard", "reshard-clears-prefetched")
def test_reshard_that_keeps_the_flag_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_reshard", "reshard_keeping_prefetched"))
    assert "root: _reshard(free=False) left _prefetched=True" in run.failure


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit-at-4")
def test_a_second_all_gather_per_unit_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", "all_gather_twice"))
    assert "forward 1's all-gather sizes (one per unit) differs from the expectation" in run.failure


@pytest.mark.breaks("03-unshard-reshard", "rate-limiter-rule")
def test_a_limiter_that_waits_at_one_is_caught(broken) -> None:
    run = broken(wrapping("torch.distributed.fsdp._limiter_utils:_FreeEventQueue.dequeue_if_needed", "dequeue_at_one"))
    assert "free-event queue (limit_all_gathers=True) differs from the expectation" in run.failure


@pytest.mark.breaks("03-unshard-reshard", "no-rate-limiter-without-limit-all-gathers")
def test_a_queue_consulted_without_the_limit_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_unshard", "unshard_consulting_the_queue"))
    assert "free-event queue (limit_all_gathers=False) differs from the expectation" in run.failure
