"""Guide 03: bend unshard and reshard and watch the claims fail."""

import pytest

from checks.breakit.patches import replacing, set_to, wrapping
from checks.guides.g03_unshard_reshard import (
    all_gather_twice,
    dequeue_at_one,
    every_sharded_strategy,
    reshard_everything,
    reshard_keeping_prefetched,
    reshard_queueing_regardless,
    reshard_views_for_every_strategy,
    unshard_consulting_the_queue,
)
from checks.workloads.gpt import padded_sizes

RU = "torch.distributed.fsdp._runtime_utils"
FP = "torch.distributed.fsdp._flat_param"
NOTHING_RESHARDS = set_to(f"{FP}:RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", ())
SHARD_GRAD_OP_RESHARDS = replacing(f"{FP}:RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", every_sharded_strategy)
NO_VIEWS_KEPT = set_to(f"{FP}:NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", ())
FULL_SHARD_KEEPS_VIEWS = replacing(f"{FP}:NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", reshard_views_for_every_strategy)
BLOCK_BYTES = 4 * padded_sizes(2, 4)["blocks.0"]  # one block's padded unsharded fp32 flat parameter


@pytest.mark.breaks("03-unshard-reshard", "full-shard-frees-non-roots")
def test_full_shard_that_keeps_everything_is_caught(broken) -> None:
    run = broken(NOTHING_RESHARDS)
    assert run.reason == "held-after-forward"
    assert run.details["expected"]["blocks.0"] == 0 and run.details["observed"]["blocks.0"] == BLOCK_BYTES


@pytest.mark.breaks("03-unshard-reshard", "full-shard-frees-non-roots")
def test_freeing_the_root_too_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_forward_reshard", reshard_everything))
    assert run.reason == "held-after-forward"
    assert run.details["observed"]["root"] == 0 and run.details["expected"]["root"] > 0


@pytest.mark.breaks("03-unshard-reshard", "shard-grad-op-frees-nothing")
def test_shard_grad_op_that_frees_is_caught(broken) -> None:
    run = broken(SHARD_GRAD_OP_RESHARDS)
    assert run.reason == "held-after-forward"
    assert run.details["observed"]["blocks.0"] == 0 and run.details["expected"]["blocks.0"] == BLOCK_BYTES


@pytest.mark.breaks("03-unshard-reshard", "shard-grad-op-no-backward-all-gathers")
def test_shard_grad_op_that_regathers_in_backward_is_caught(broken) -> None:
    # With use_orig_params=True, freeing SHARD_GRAD_OP units after forward trips an internal assertion in
    # backward (their views were left unsharded on purpose); without it the re-gather runs and is counted.
    run = broken(SHARD_GRAD_OP_RESHARDS, use_orig_params=False)
    assert run.reason == "all-gather-count"
    assert run.details["observed"] == {"forward": 4, "backward": 3} and run.details["step"] == 1


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit")
def test_a_second_all_gather_per_unit_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", all_gather_twice))
    assert run.reason == "all-gather-sizes"
    expected = run.details["expected"]
    assert run.details["observed"] == [size for size in expected for _ in (1, 2)]


@pytest.mark.breaks("03-unshard-reshard", "reshard-clears-prefetched")
def test_reshard_that_keeps_the_flag_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_reshard", reshard_keeping_prefetched))
    assert (run.reason, run.details) == ("prefetched-kept", {"unit": "root", "free": False})


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit-at-4")
def test_a_second_all_gather_per_unit_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", all_gather_twice))
    assert run.reason == "all-gather-sizes"
    assert run.details["observed"] == [size for size in run.details["expected"] for _ in (1, 2)]


@pytest.mark.breaks("03-unshard-reshard", "rate-limiter-rule")
def test_a_limiter_that_waits_at_one_is_caught(broken) -> None:
    run = broken(wrapping("torch.distributed.fsdp._limiter_utils:_FreeEventQueue.dequeue_if_needed", dequeue_at_one))
    assert run.reason == "queue-differs"
    first = run.details["first"]
    assert run.details["expected"][first].endswith("go") and run.details["observed"][first].endswith("wait")


@pytest.mark.breaks("03-unshard-reshard", "no-rate-limiter-without-limit-all-gathers")
def test_a_queue_consulted_without_the_limit_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_unshard", unshard_consulting_the_queue))
    assert run.reason == "queue-differs"
    assert run.details["expected"] == [] and run.details["observed"]


@pytest.mark.breaks("03-unshard-reshard", "no-rate-limiter-without-limit-all-gathers")
def test_a_reshard_that_queues_without_the_limit_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_reshard", reshard_queueing_regardless))
    assert run.reason == "queued-without-limit" and run.details["observed"] > 0


@pytest.mark.breaks("03-unshard-reshard", "full-shard-reshards-views")
def test_full_shard_that_keeps_its_views_is_caught(broken) -> None:
    run = broken(FULL_SHARD_KEEPS_VIEWS)
    assert run.reason == "views-after-forward"
    # The skipped views still point into the unsharded buffer, whose storage FULL_SHARD has just freed.
    assert run.details["observed"]["blocks.0.attn.qkv.weight"] == "Tensor (108, 36) over the unsharded buffer"
    assert run.details["expected"]["blocks.0.attn.qkv.weight"].startswith("Parameter (")


@pytest.mark.breaks("03-unshard-reshard", "shard-grad-op-keeps-unsharded-views")
def test_shard_grad_op_that_switches_its_views_is_caught(broken) -> None:
    run = broken(NO_VIEWS_KEPT)
    assert run.reason == "views-after-forward"
    assert run.details["expected"]["blocks.0.attn.qkv.weight"] == "Tensor (108, 36) over the unsharded buffer"
    assert run.details["observed"]["blocks.0.attn.qkv.weight"].startswith("Parameter (")


@pytest.mark.breaks("03-unshard-reshard", "root-kept-without-backward")
def test_a_root_freed_after_forward_is_caught(broken) -> None:
    # The first forward's all-gathers are as expected; the root's storage is already gone after it.
    run = broken(wrapping(f"{RU}:_post_forward_reshard", reshard_everything))
    assert (run.reason, run.details) == ("root-freed", {"forward": 1, "observed": 0})


@pytest.mark.breaks("03-unshard-reshard", "memory-over-the-step")
def test_full_shard_that_frees_nothing_holds_as_much_as_shard_grad_op(broken) -> None:
    run = broken(NOTHING_RESHARDS)
    assert run.reason == "extra-unsharded-bytes"
    assert (run.details["observed"], run.details["expected"]) == (0, 3 * BLOCK_BYTES)


@pytest.mark.breaks("03-unshard-reshard", "memory-over-the-step")
def test_doubled_all_gathers_change_what_shard_grad_op_saves(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", all_gather_twice))
    assert run.reason == "all-gathers-saved"
    assert (run.details["observed"], run.details["expected"]) == (6, 3)
