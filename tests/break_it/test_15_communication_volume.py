"""Guide 15: bend what a step communicates (a freed root, a kept root, an extra all-gather, a missing
reduce-scatter, a comm hook on DDP, a real ring reduce-scatter in gloo's place) and watch the claims fail.

Not here, because it is not a break: DDP with smaller buckets issues more all-reduces of the same bytes;
`ddp-all-reduce` asserts that as part of the claim.
"""

from dataclasses import replace

import pytest

from checks.breakit.patches import replacing, wrapping
from checks.expected import Expected
from checks.guides.g15_communication_volume import (
    all_gather_twice,
    ddp_with_comm_hook,
    free_root_after_forward,
    fsdp2_all_gather_twice,
    fsdp2_local_reduce_scatter,
    reduce_grad_without_reduce_scatter,
    root_kept_after_forward,
    root_resharded_after_forward,
    with_ring_reduce_scatter,
    with_shard_grad_op,
    without_shard_grad_op,
)
from tests.break_it.conftest import guides, named_rows

RU = "torch.distributed.fsdp._runtime_utils"
FS = "torch.distributed.fsdp._fully_shard"
FREE_ROOT = wrapping(f"{RU}:_post_forward_reshard", free_root_after_forward)
SHARD_GRAD_OP_FREES = (
    replacing(f"{RU}:RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", with_shard_grad_op),
    replacing("torch.distributed.fsdp._flat_param:NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", without_shard_grad_op),
)
GATHER_TWICE = wrapping("torch.distributed.fsdp._flat_param:FlatParamHandle._all_gather_flat_param", all_gather_twice)
NO_REDUCE_SCATTER = wrapping(f"{RU}:_reduce_grad", reduce_grad_without_reduce_scatter)
FSDP2_ROOT_KEPT = wrapping(f"{FS}._fsdp_state:FSDPState._lazy_init", root_kept_after_forward)
FSDP2_ROOT_RESHARDED = wrapping(f"{FS}._fsdp_state:FSDPState._lazy_init", root_resharded_after_forward)
FSDP2_GATHER_TWICE = wrapping(f"{FS}._fsdp_param_group:foreach_all_gather", fsdp2_all_gather_twice)
FSDP2_NO_REDUCE_SCATTER = wrapping(f"{FS}._fsdp_collectives:DefaultReduceScatter.__call__", fsdp2_local_reduce_scatter)
RING_REDUCE_SCATTER = replacing("torch.distributed:reduce_scatter_single", with_ring_reduce_scatter)
DDP_INIT = "torch.nn.parallel.distributed:DistributedDataParallel.__init__"
DDP_TWICE = wrapping(DDP_INIT, ddp_with_comm_hook, hook_name="twice")
DDP_BF16 = wrapping(DDP_INIT, ddp_with_comm_hook, hook_name="bf16")
FULL_SHARD_RATIO = 4201 / 2866


def backward(run) -> dict:
    return run.details["observed"]["backward"]


def rebuild_as(*texts: str) -> Expected:
    """The guide's ``rebuild`` block stating ``texts`` instead, one per row (the same lines)."""
    expected = guides()["15-communication-volume"].expect_blocks()["rebuild"].expected
    assert expected is not None and len(texts) == len(expected)
    rows = tuple(replace(row, text=t, key=t, cells=(t,)) for row, t in zip(expected.rows, texts, strict=True))
    return replace(expected, rows=rows)


# -- ddp-all-reduce ----------------------------------------------------------------------------------------------
@pytest.mark.breaks("15-communication-volume", "ddp-all-reduce")
def test_a_second_all_reduce_per_bucket_is_caught(broken) -> None:
    run = broken(DDP_TWICE)
    assert (run.reason, backward(run), run.details["step"]) == ("counts-differ-from-model", {"all_reduce": 2}, 1)


@pytest.mark.breaks("15-communication-volume", "ddp-all-reduce")
def test_bf16_compressed_buckets_are_caught(broken) -> None:
    # The same one all-reduce per step, of half the bytes.
    run = broken(DDP_BF16)
    assert (run.reason, run.details["observed"], run.details["expected"]) == (
        "bytes-differ-from-model", [103176, 103176.0], [206352, 206352.0])  # fmt: skip


@pytest.mark.breaks("15-communication-volume", "ddp-all-reduce")
def test_the_rebuild_block_is_checked(broken) -> None:
    run = broken(expected=rebuild_as("broadcast 41 int64", "broadcast 1 int64"))
    assert (run.reason, run.details["observed"]) == ("rebuild-broadcasts", ["broadcast 41 int32", "broadcast 1 int32"])
    assert named_rows(run) == [("rebuild", "broadcast 41 int64")]  # the first row that differs


@pytest.mark.breaks("15-communication-volume", "ddp-all-reduce-at-4")
def test_bf16_compressed_buckets_are_caught_at_4(broken) -> None:
    run = broken(DDP_BF16)
    assert (run.reason, run.details["observed"]) == ("bytes-differ-from-model", [103176, 154764.0])


# -- fsdp2-full-reshard ------------------------------------------------------------------------------------------
@pytest.mark.breaks("15-communication-volume", "fsdp2-full-reshard")
def test_a_root_kept_unsharded_is_caught(broken) -> None:
    # What torch did before pytorch#154704: the root is not gathered again, and the step costs FULL_SHARD's ratio.
    run = broken(FSDP2_ROOT_KEPT)
    assert (run.reason, backward(run)) == ("counts-differ-from-model", {"all_gather": 3, "reduce_scatter": 4})
    assert run.details["ratio"] == pytest.approx(FULL_SHARD_RATIO) and run.details["model_ratio"] == 1.5


@pytest.mark.breaks("15-communication-volume", "fsdp2-full-reshard")
def test_an_extra_fsdp2_all_gather_is_caught(broken) -> None:
    run = broken(FSDP2_GATHER_TWICE)
    assert run.reason == "counts-differ-from-model" and run.details["observed"]["forward"] == {"all_gather": 8}


@pytest.mark.breaks("15-communication-volume", "fsdp2-full-reshard")
def test_a_missing_fsdp2_reduce_scatter_is_caught(broken) -> None:
    run = broken(FSDP2_NO_REDUCE_SCATTER)
    assert (run.reason, backward(run)) == ("counts-differ-from-model", {"all_gather": 4})


@pytest.mark.breaks("15-communication-volume", "fsdp2-full-reshard-at-4")
def test_a_root_kept_unsharded_is_caught_at_4(broken) -> None:
    run = broken(FSDP2_ROOT_KEPT)
    assert run.reason == "counts-differ-from-model" and run.details["ratio"] == pytest.approx(FULL_SHARD_RATIO)


# -- fsdp2-default-keeps-root ------------------------------------------------------------------------------------
@pytest.mark.breaks("15-communication-volume", "fsdp2-default-keeps-root")
def test_a_default_root_resharded_is_caught(broken) -> None:
    run = broken(FSDP2_ROOT_RESHARDED)
    assert (run.reason, backward(run)) == ("counts-differ-from-model", {"all_gather": 4, "reduce_scatter": 4})
    assert run.details["ratio"] == 1.5


# -- full-shard --------------------------------------------------------------------------------------------------
@pytest.mark.breaks("15-communication-volume", "full-shard")
def test_a_root_freed_after_forward_costs_one_and_a_half(broken) -> None:
    run = broken(FREE_ROOT)
    assert (run.reason, backward(run)) == ("counts-differ-from-model", {"all_gather": 4, "reduce_scatter": 4})
    assert run.details["ratio"] == 1.5 and run.details["model_ratio"] == pytest.approx(FULL_SHARD_RATIO)


@pytest.mark.breaks("15-communication-volume", "full-shard")
def test_an_extra_all_gather_is_caught(broken) -> None:
    run = broken(GATHER_TWICE)
    assert run.reason == "counts-differ-from-model" and run.details["observed"]["forward"] == {"all_gather": 8}


@pytest.mark.breaks("15-communication-volume", "full-shard")
def test_a_missing_reduce_scatter_is_caught(broken) -> None:
    run = broken(NO_REDUCE_SCATTER)
    assert (run.reason, backward(run)) == ("counts-differ-from-model", {"all_gather": 3})


@pytest.mark.breaks("15-communication-volume", "full-shard-at-4")
def test_a_root_freed_after_forward_is_caught_at_4(broken) -> None:
    run = broken(FREE_ROOT)
    assert run.reason == "counts-differ-from-model" and run.details["ratio"] == 1.5


# -- shard-grad-op -----------------------------------------------------------------------------------------------
@pytest.mark.breaks("15-communication-volume", "shard-grad-op")
def test_shard_grad_op_freeing_after_forward_is_caught(broken) -> None:
    # SHARD_GRAD_OP listed among the strategies that free after forward becomes FULL_SHARD's communication.
    run = broken(*SHARD_GRAD_OP_FREES)
    assert (run.reason, backward(run)) == ("counts-differ-from-model", {"all_gather": 3, "reduce_scatter": 4})
    assert run.details["ratio"] == pytest.approx(FULL_SHARD_RATIO)


@pytest.mark.breaks("15-communication-volume", "shard-grad-op")
def test_a_missing_reduce_scatter_is_caught_under_shard_grad_op(broken) -> None:
    run = broken(NO_REDUCE_SCATTER)
    assert (run.reason, backward(run)) == ("counts-differ-from-model", {})


@pytest.mark.breaks("15-communication-volume", "shard-grad-op-at-4")
def test_an_extra_all_gather_is_caught_at_4(broken) -> None:
    run = broken(GATHER_TWICE)
    assert run.reason == "counts-differ-from-model" and run.details["ratio"] == 1.5


# -- padding-at-4 ------------------------------------------------------------------------------------------------
@pytest.mark.breaks("15-communication-volume", "padding-at-4")
def test_a_model_without_padding_is_wrong(broken) -> None:
    # FULL_SHARD's root is 32 elements, not 30, in its forward all-gather and its reduce-scatter: 16 bytes more.
    run = broken(pad=False)
    assert run.reason == "bytes-differ-from-model"
    assert run.details["observed"] == [1072, 804.0] and run.details["expected"] == [1056, 792.0]


@pytest.mark.breaks("15-communication-volume", "padding-at-4")
def test_a_missing_reduce_scatter_is_caught_on_the_toy(broken) -> None:
    run = broken(NO_REDUCE_SCATTER)
    assert (run.reason, backward(run)) == ("counts-differ-from-model", {"all_gather": 2})


# -- gloo --------------------------------------------------------------------------------------------------------
@pytest.mark.breaks("15-communication-volume", "gloo-reduce-scatter-is-all-reduce")
def test_a_ring_reduce_scatter_is_not_an_all_reduce(broken) -> None:
    run = broken(RING_REDUCE_SCATTER)
    assert run.reason == "reduce-scatter-event-not-all-reduce"
    assert {name for name, _ in run.details["observed"]} <= {"send", "recv"}


@pytest.mark.breaks("15-communication-volume", "gloo-reduce-scatter-is-all-reduce")
def test_the_header_size_is_checked(broken) -> None:
    run = broken(header_bytes=0)
    assert (run.reason, run.details["payload"], run.details["model"]) == ("wire-above-gloo-model", 525440, 524288.0)


@pytest.mark.breaks("15-communication-volume", "gloo-wire-per-step")
def test_a_ring_reduce_scatter_writes_less(broken) -> None:
    # A true ring reduce-scatter sends (N−1)/N·S: SHARD_GRAD_OP's wire falls to the ring model, below gloo's.
    run = broken(RING_REDUCE_SCATTER)
    assert run.reason == "wire-below-gloo-model"
    assert run.details["payload"] < run.details["model"] and run.details["ring_model"] == 412704.0


@pytest.mark.breaks("15-communication-volume", "gloo-wire-per-step")
def test_an_extra_all_gather_writes_more(broken) -> None:
    run = broken(GATHER_TWICE)
    assert run.reason == "wire-above-gloo-model" and run.details["payload"] > run.details["model"]


@pytest.mark.breaks("15-communication-volume", "gloo-wire-per-step-at-4")
def test_a_ring_reduce_scatter_writes_less_at_4(broken) -> None:
    run = broken(RING_REDUCE_SCATTER)
    assert run.reason == "wire-below-gloo-model"
