"""Guide 11: bend the final callback, the catch-all, the execution record, finalization and HYBRID_SHARD's
reductions, and watch the claims fail (or, for the expected failure, pass)."""

import pytest

from checks.breakit.patches import skipping, wrapping
from checks.guides.g09_no_shard_is_ddp.all_reduces import REDUCER
from checks.guides.g09_no_shard_is_ddp.recipes import (
    reduce_also_over_replicas,
    reduce_with_all_reduce_twice,
    reduce_without_all_reduce,
)
from checks.guides.g11_final_callback_and_hybrid_shard.observing import CATCH_ALL, FINAL_CALLBACK, FINALIZE
from checks.guides.g11_final_callback_and_hybrid_shard.recipes import (
    catch_all_without_free,
    final_callback_keeping_hook_flags,
    final_callback_left_queued,
    final_callback_resetting_first,
    finalize_copying_grad,
    finalize_keeping_called,
    next_iter_clearing_pre_forward,
    next_iter_without_clear,
    next_iter_without_count,
    pre_backward_then_free,
)
from tests.break_it.conftest import named_rows

RU = "torch.distributed.fsdp._runtime_utils"
NEXT_ITER = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData.next_iter"
FOR_OPTIM = "torch.distributed.fsdp._flat_param:FlatParamHandle.prepare_gradient_for_optim"
FAILS_WITH = "replicas-not-synced"  # the claim's xfail.fails_with
REPLICA_ALL_REDUCE = wrapping(REDUCER, reduce_also_over_replicas)


# -- idle-after-backward ----------------------------------------------------------------------------------------
@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "idle-after-backward")
def test_a_pre_backward_flag_left_set_is_caught(broken) -> None:
    run = broken(wrapping(FINAL_CALLBACK, final_callback_keeping_hook_flags))
    assert run.reason == "not-reset"
    assert {fields["_ran_pre_backward_hook"] for fields in run.details["observed"].values()} == {"True"}
    assert named_rows(run) == [("resets", "_ran_pre_backward_hook")]


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "idle-after-backward")
def test_a_callback_left_queued_is_caught(broken) -> None:
    run = broken(wrapping(FINAL_CALLBACK, final_callback_left_queued))
    assert (run.reason, run.details["observed"], run.details["expected"]) == ("callback-still-queued", "True", "False")
    assert named_rows(run) == [("resets", "_post_backward_callback_queued")]


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "idle-after-backward")
def test_no_final_callback_leaves_every_unit_in_backward(broken) -> None:
    run = broken(skipping(FINAL_CALLBACK))
    assert run.reason == "not-reset"
    assert {fields["training_state"] for fields in run.details["observed"].values()} == {"FORWARD_BACKWARD"}


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "idle-after-backward")
def test_resets_done_before_the_callback_are_caught(broken) -> None:
    # Wrong timing: the end state is right, but the callback is not what produced it.
    run = broken(wrapping(FINAL_CALLBACK, final_callback_resetting_first))
    assert run.reason == "already-reset"
    assert set(run.details["observed"]) == {"root", "blocks.0", "blocks.1", "blocks.2"}


# -- catch-all-reshards -----------------------------------------------------------------------------------------
@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "catch-all-reshards")
def test_without_the_catch_all_the_unit_stays_unsharded(broken) -> None:
    run = broken(skipping(CATCH_ALL))
    assert (run.reason, run.details["unit"], run.details["on_local_shard"]) == (
        "unsharded-after-backward",
        "split",
        False,
    )
    assert run.details["unsharded_bytes"] > 0


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "catch-all-reshards")
def test_a_catch_all_that_keeps_the_storage_is_caught(broken) -> None:
    run = broken(wrapping(CATCH_ALL, catch_all_without_free))
    assert (run.reason, run.details["unit"], run.details["expected"]) == ("unsharded-storage-kept", "split", 0)
    assert run.details["observed"] > 0


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "catch-all-reshards")
def test_a_free_from_the_wrong_hook_is_caught(broken) -> None:
    # `split` freed by its own pre-backward hook: resharded, but not by the catch-all.
    run = broken(wrapping(f"{RU}:_pre_backward_hook", pre_backward_then_free))
    assert (run.reason, run.details["mode"]) == ("not-freed-by-catch-all", "BACKWARD_PRE")
    assert run.details["observed"] == ["free dropped from _catch_all_reshard"]
    assert "free split from pre_backward_then_free" in run.details["reshards"]
    assert named_rows(run) == [("catch-all", "BACKWARD_PRE")]


# -- next-iter-clears-post-forward-order ------------------------------------------------------------------------
@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "next-iter-clears-post-forward-order")
def test_an_uncleared_post_forward_order_is_caught(broken) -> None:
    run = broken(wrapping(NEXT_ITER, next_iter_without_clear))
    assert (run.reason, run.details["iteration"], run.details["moment"]) == ("post-forward-order", 1, "after backward")
    assert run.details["observed"] == ["blocks.0", "blocks.1", "blocks.2", "root"]


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "next-iter-clears-post-forward-order")
def test_an_uncounted_iteration_is_caught(broken) -> None:
    run = broken(wrapping(NEXT_ITER, next_iter_without_count))
    assert (run.reason, run.details["observed"], run.details["expected"]) == ("iteration", 0, 1)


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "next-iter-clears-post-forward-order")
def test_a_lost_pre_forward_order_is_caught(broken) -> None:
    run = broken(wrapping(NEXT_ITER, next_iter_clearing_pre_forward))
    assert (run.reason, run.details["observed"], run.details["iteration"]) == ("pre-forward-order", [], 1)


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "next-iter-clears-post-forward-order")
def test_no_next_iter_is_caught(broken) -> None:
    run = broken(skipping(NEXT_ITER))
    assert (run.reason, run.details["moment"]) == ("post-forward-order", "after backward")


# -- finalize-moves-shard-to-grad -------------------------------------------------------------------------------
@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "finalize-moves-shard-to-grad")
def test_a_copied_gradient_is_caught(broken) -> None:
    run = broken(wrapping(FOR_OPTIM, finalize_copying_grad))
    assert run.reason == "grad-not-moved"
    assert run.details["observed"]["grad_is_saved_shard"] is False and run.details["observed"]["has_saved"] is False


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "finalize-moves-shard-to-grad")
def test_a_gradient_left_in_the_saved_shard_is_caught(broken) -> None:
    run = broken(skipping(FOR_OPTIM))
    assert run.reason == "grad-not-moved"
    assert run.details["observed"] == {"grad_is_saved_shard": False, "has_saved": True, "post_backward_called": False}


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "finalize-moves-shard-to-grad")
def test_post_backward_called_left_set_is_caught(broken) -> None:
    run = broken(wrapping(FINALIZE, finalize_keeping_called))
    assert run.reason == "grad-not-moved" and run.details["observed"]["post_backward_called"] is True


# -- hybrid-default-groups-average (strict xfail: removing the bug makes the check pass) --------------------------
@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "hybrid-default-groups-average")
def test_a_replica_all_reduce_makes_the_expected_failure_pass(broken) -> None:
    # What a fix for pytorch#154888 would add: the check passes, which a strict xfail reports as an unexpected pass.
    run = broken(REPLICA_ALL_REDUCE)
    assert run.ok


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "hybrid-default-groups-average")
def test_a_shard_group_of_two_makes_the_expected_failure_pass(broken) -> None:
    # The world as the shard group: no clamp, a real reduce-scatter; every replica (one) holds DDP's shard.
    run = broken(groups="shard-over-world")
    assert run.ok


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "hybrid-default-groups-average")
def test_a_sum_instead_of_a_mean_is_not_the_expected_failure(broken) -> None:
    # Replicas synced, but to the sum of the local gradients: the check fails for another reason, and the xfail
    # does not swallow it.
    run = broken(REPLICA_ALL_REDUCE, skipping(f"{RU}:_div_if_needed"))
    assert run.reason == "not-ddp-gradient" and run.reason != FAILS_WITH


# -- hybrid-2x2-matches-ddp -------------------------------------------------------------------------------------
@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "hybrid-2x2-matches-ddp")
def test_a_missing_replica_all_reduce_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_reduce_grad", reduce_without_all_reduce))
    assert run.reason == "reductions"
    assert [line.split()[0] for line in run.details["observed"]] == ["reduce_scatter"] * 4


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "hybrid-2x2-matches-ddp")
def test_a_doubled_replica_all_reduce_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_reduce_grad", reduce_with_all_reduce_twice))
    assert run.reason == "reductions" and len(run.details["observed"]) == 12


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "hybrid-2x2-matches-ddp")
def test_an_undivided_gradient_is_no_summation_order(broken) -> None:
    run = broken(skipping(f"{RU}:_div_if_needed"))
    assert run.reason == "not-a-summation-order" and run.details["observed"] > 0


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "hybrid-2x2-matches-ddp")
def test_the_parameter_bound_is_checked(broken) -> None:
    # Measured: 1.7e-8 after step 1.
    run = broken(bound=1e-8)
    assert (run.reason, run.details["step"], run.details["bound"]) == ("param-beyond-bound", 1, 1e-8)


@pytest.mark.breaks("11-final-callback-and-hybrid-shard", "hybrid-2x2-matches-ddp")
def test_the_gradient_bound_is_checked(broken) -> None:
    # Measured: 3.0e-8 in every step.
    run = broken(grad_bound=1e-8)
    assert (run.reason, run.details["step"], run.details["bound"]) == ("grad-beyond-bound", 1, 1e-8)
