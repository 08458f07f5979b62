"""Guide 03: bend unshard and reshard and watch the claims fail."""

from dataclasses import replace

import pytest

from checks.breakit.patches import replacing, set_to, wrapping
from checks.guides.g03_unshard_reshard import (
    all_gather_twice,
    dequeue_at_one,
    every_sharded_strategy,
    reshard_everything,
    reshard_keeping_blocks_1_in_backward,
    reshard_keeping_prefetched,
    reshard_queueing_regardless,
    reshard_views_for_every_strategy,
    unshard_blocks_0_again_for_a_kept_unit,
    unshard_blocks_1_before_blocks_0,
    unshard_consulting_the_queue,
    unshard_consulting_the_queue_in_iteration_1,
)
from checks.workloads.gpt import padded_sizes
from tests.break_it.conftest import guides, named_rows

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
    assert run.reason == "all-gathers-by-unit"
    assert run.details["observed"] == [row for row in run.details["expected"] for _ in (1, 2)]


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit")
def test_a_guide_listing_the_blocks_out_of_order_fails(broken) -> None:
    block = guides()["03-unshard-reshard"].expect_blocks()["forward-all-gathers"].expected
    root, blocks_0, blocks_1, blocks_2 = block.rows
    run = broken(expected=replace(block, rows=(root, blocks_1, blocks_0, blocks_2)))
    stated = ["root 3528", "blocks.1 16020", "blocks.0 16020", "blocks.2 16020"]
    assert (run.reason, run.details["observed"]) == ("guide-differs-from-model", stated)
    assert named_rows(run) == [("forward-all-gathers", "blocks.1"), ("forward-all-gathers", "blocks.0")]


@pytest.mark.breaks("03-unshard-reshard", "reshard-clears-prefetched")
def test_reshard_that_keeps_the_flag_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_reshard", reshard_keeping_prefetched))
    assert (run.reason, run.details) == ("prefetched-kept", {"unit": "root", "free": False})


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit-at-4")
def test_a_second_all_gather_per_unit_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", all_gather_twice))
    assert run.reason == "all-gathers-by-unit"
    assert run.details["observed"] == [row for row in run.details["expected"] for _ in (1, 2)]


@pytest.mark.breaks("03-unshard-reshard", "rate-limiter-rule")
def test_a_limiter_that_waits_at_one_is_caught(broken) -> None:
    run = broken(wrapping("torch.distributed.fsdp._limiter_utils:_FreeEventQueue.dequeue_if_needed", dequeue_at_one))
    assert run.reason == "queue-differs"
    pairs = zip(run.details["expected"], run.details["observed"], strict=False)
    expected, observed = next((e, o) for e, o in pairs if e != o)
    assert expected.endswith("go") and observed.endswith("wait")


@pytest.mark.breaks("03-unshard-reshard", "rate-limiter-rule")
def test_a_guide_figure_for_the_queue_off_the_rule_fails(broken) -> None:
    run = broken(pending_at_start=3)
    assert (run.reason, run.details["observed"], run.details["expected"]) == ("pending-differs-from-guide", 3, 4)


@pytest.mark.breaks("03-unshard-reshard", "no-rate-limiter-without-limit-all-gathers")
def test_a_queue_consulted_without_the_limit_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_unshard", unshard_consulting_the_queue))
    assert run.reason == "queue-differs"
    assert run.details["expected"] == [] and run.details["observed"][0] == "unshard 0 go"


@pytest.mark.breaks("03-unshard-reshard", "no-rate-limiter-without-limit-all-gathers")
def test_a_reshard_that_queues_without_the_limit_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_reshard", reshard_queueing_regardless))
    assert (run.reason, run.details["iteration"]) == ("queue-differs", 1)
    assert run.details["expected"] == [] and run.details["observed"][0] == "queue 1"


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
    assert run.reason == "unsharded-after-forward"
    assert run.details["observed"]["FULL_SHARD"] == run.details["expected"]["SHARD_GRAD_OP"]


@pytest.mark.breaks("03-unshard-reshard", "memory-over-the-step")
def test_doubled_all_gathers_change_what_shard_grad_op_saves(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", all_gather_twice))
    assert run.reason == "all-gathers-per-step"
    assert run.details["observed"] == {"FULL_SHARD": 14, "SHARD_GRAD_OP": 8}


@pytest.mark.breaks("03-unshard-reshard", "memory-over-the-step")
def test_a_guide_figure_off_the_model_fails(broken) -> None:
    run = broken(extra_bytes=3 * BLOCK_BYTES + 4)
    assert run.reason == "guide-differs-from-model"
    assert run.details["expected"]["extra_bytes"] == 3 * BLOCK_BYTES


GATHER_BLOCKS_1_FIRST = wrapping(f"{RU}:_pre_forward_unshard", unshard_blocks_1_before_blocks_0)
GATHER_BLOCKS_0_TWICE = (
    wrapping(f"{RU}:_reshard", reshard_keeping_blocks_1_in_backward),
    wrapping(f"{RU}:_pre_forward_unshard", unshard_blocks_0_again_for_a_kept_unit),
)
IN_ORDER = ["root 3528", "blocks.0 16020", "blocks.1 16020", "blocks.2 16020"]


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit")
def test_blocks_gathered_out_of_order_are_caught(broken) -> None:
    run = broken(GATHER_BLOCKS_1_FIRST)
    assert (run.reason, run.details["expected"]) == ("all-gathers-by-unit", IN_ORDER)
    assert run.details["observed"] == ["root 3528", "blocks.1 16020", "blocks.0 16020", "blocks.2 16020"]
    # The first row the run makes false: blocks.0 is not the second all-gather.
    assert named_rows(run) == [("forward-all-gathers", "blocks.0")]


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit")
def test_a_block_gathered_twice_and_one_never_is_caught(broken) -> None:
    # Forward 1 is as expected; forward 2 finds blocks.1 kept from backward and gathers blocks.0 in its place.
    run = broken(*GATHER_BLOCKS_0_TWICE)
    assert (run.reason, run.details["forward"]) == ("all-gathers-by-unit", 2)
    assert run.details["observed"] == ["root 3528", "blocks.0 16020", "blocks.0 16020", "blocks.2 16020"]
    assert named_rows(run) == [("forward-all-gathers", "blocks.1")]  # never gathered in forward 2


@pytest.mark.breaks("03-unshard-reshard", "one-all-gather-per-unit-at-4")
def test_blocks_gathered_out_of_order_are_caught_on_4_ranks(broken) -> None:
    run = broken(GATHER_BLOCKS_1_FIRST)
    assert run.reason == "all-gathers-by-unit"
    assert run.details["observed"][1:3] == ["blocks.1 16020", "blocks.0 16020"]


@pytest.mark.breaks("03-unshard-reshard", "no-rate-limiter-without-limit-all-gathers")
def test_a_queue_consulted_in_iteration_1_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_unshard", unshard_consulting_the_queue_in_iteration_1))
    assert (run.reason, run.details["iteration"]) == ("queue-differs", 1)
    assert run.details["expected"] == [] and run.details["observed"][0] == "unshard 0 go"
