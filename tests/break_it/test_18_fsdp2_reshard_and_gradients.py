"""Guide 18: bend FSDP2's resharding, its gradient reduction, its mixed precision and its accumulation inside the
ranks, and watch each claim fail for its own reason: a root resharded under the default, an int N read as False,
an int 1 that no longer warns, groups kept unsharded, a post-forward reshard made a full one, a sum that is not
divided, a policy's reduce dtype dropped, a gradient sync that cannot be turned off, a reduction in bf16. Where
torch 2.15 changed the behaviour a claim reads, each side's claim is broken on its own side: 2.15's reduce dtype
chosen as 2.13 chose it, its upcast of a waiting gradient skipped, its unsharded ``grad_dtype`` unset; 2.13's given
2.15's ``grad_dtype``."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from packaging.version import Version

from checks.breakit.patches import wrapping
from checks.guides.g18_fsdp2_reshard_and_gradients.gradients import require_counts_near
from checks.guides.g18_fsdp2_reshard_and_gradients.recipes import (
    grad_dtype_is_reduce_dtype,
    grad_dtype_unset,
    int_n_means_false,
    keep_unsharded_after_backward,
    keep_unsharded_after_forward,
    never_divide,
    reduce_dtype_ignored,
    reduce_every_post_backward,
    reduce_in_bf16,
    reduce_in_gradient_dtype,
    reshard_fully,
    root_resharded_anyway,
    silent_int_one,
    sum_without_divide,
    sync_ignored,
    upcast_always_deferred,
)
from checks.violation import Violation
from tests.break_it.conftest import expect_block, named_rows, restated

block = partial(expect_block, "18-fsdp2-reshard-and-gradients")
rewritten = partial(restated, "18-fsdp2-reshard-and-gradients")

F2 = "torch.distributed.fsdp._fully_shard"
GROUP = f"{F2}._fsdp_param_group:FSDPParamGroup"
PARAM = f"{F2}._fsdp_param:FSDPParam"
# fully_shard imported the helper by name: patch the name it calls.
POST_FORWARD_MESH = f"{F2}._fully_shard:_get_post_forward_mesh_info"
DIVIDE_FACTORS = f"{F2}._fsdp_collectives:_get_gradient_divide_factors"
GRAD_DTYPE = Version(torch.__version__.split("+")[0]) >= Version("2.15")  # FSDP2 sets the gradient dtype
needs_old = pytest.mark.skipif(GRAD_DTYPE, reason=f"the claim is for torch < 2.15; this is {torch.__version__}")
needs_new = pytest.mark.skipif(not GRAD_DTYPE, reason=f"the claim is for torch >= 2.15; this is {torch.__version__}")


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "settings-at-2")
def test_a_root_resharded_under_the_default_is_caught(broken) -> None:
    run = broken(wrapping(f"{F2}._fsdp_state:FSDPState._lazy_init", root_resharded_anyway))
    assert (run.reason, run.details["setting"]) == ("states-differ", "None")
    assert run.details["observed"]["root"] == "SHARDED"


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "settings-at-2")
def test_an_int_n_read_as_false_is_caught(broken) -> None:
    run = broken(wrapping(POST_FORWARD_MESH, int_n_means_false))
    assert (run.reason, run.details["setting"]) == ("states-differ", "2")


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "settings-at-2")
def test_an_int_one_without_its_warning_is_caught(broken) -> None:
    run = broken(wrapping(POST_FORWARD_MESH, silent_int_one))
    assert (run.reason, run.details["setting"]) == ("warning-differs", "1")
    assert (run.details["observed"], run.details["expected"]) == (False, True)


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "settings-at-2")
def test_a_guide_that_says_2_warns_is_caught(broken) -> None:
    # torch and the model agree that 2 is silent; only the guide's row says otherwise.
    run = broken(expected=rewritten("settings-at-2", {"2": "SHARDED  SHARDED  4  4  warns"}))
    assert (run.reason, run.details["setting"]) == ("table-differs", "2")
    assert named_rows(run) == [("settings-at-2", "2")]


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "cost-at-2")
def test_groups_kept_unsharded_after_forward_are_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}.reshard", keep_unsharded_after_forward))
    assert (run.reason, run.details["setting"]) == ("held-differs", "True")
    assert (run.details["observed"], run.details["expected"]) == (206352, 0)


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "cost-at-2")
def test_groups_kept_unsharded_after_backward_are_caught(broken) -> None:
    # Held and sent bytes are unchanged; only the peak sees every block alive at once in backward.
    run = broken(wrapping(f"{GROUP}.post_backward", keep_unsharded_after_backward))
    assert (run.reason, run.details["setting"]) == ("peak-differs", "True")
    assert (run.details["observed"], run.details["expected"]) == (206352, 78192)


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "cost-at-2")
def test_a_guide_that_says_the_default_holds_nothing_is_caught(broken) -> None:
    run = broken(expected=rewritten("cost-at-2", {"None": "0  103,176  199,296  302,472  78,192"}))
    assert (run.reason, run.details["setting"]) == ("table-differs", "None")
    assert (run.details["observed"]["held"], run.details["expected"]["held"]) == ("14,112", "0")
    assert named_rows(run) == [("cost-at-2", "None")]


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "unit-used-twice")
def test_a_reduce_scatter_per_use_is_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}.post_backward", reduce_every_post_backward))
    assert (run.reason, run.details["setting"]) == ("collectives-differ", "True")
    assert run.details["observed"]["reduce_scatter"] == [16020, 16020, 16020, 16020, 3528]


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "int-at-4")
def test_a_full_reshard_instead_of_the_smaller_mesh_is_caught(broken) -> None:
    run = broken(wrapping(f"{GROUP}._to_sharded_post_forward", reshard_fully))
    assert (run.reason, run.details["setting"]) == ("held-differs", "2")
    assert (run.details["observed"], run.details["expected"]) == (0, 103176)


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "int-at-4")
def test_a_guide_that_gives_2_trues_backward_bytes_is_caught(broken) -> None:
    run = broken(expected=rewritten("int-at-4", {"2": "103,176  154,764  309,528  464,292  78,192"}))
    assert (run.reason, run.details["setting"]) == ("table-differs", "2")
    assert named_rows(run) == [("int-at-4", "2")]


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "grads-are-ddp-slice")
def test_a_sum_that_is_not_divided_is_caught(broken) -> None:
    run = broken(wrapping(DIVIDE_FACTORS, sum_without_divide))
    assert (run.reason, run.details["case"]) == ("divide-factors-differ", "fp32")
    assert list(run.details["observed"]) == [None, None, "SUM", "SUM"]


@needs_old
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "sum-paths")
def test_a_post_divide_that_never_happens_is_caught(broken) -> None:
    # The factors are still chosen right; only the gradients show that nothing was divided.
    run = broken(wrapping(f"{F2}._fsdp_collectives:_div_if_needed", never_divide))
    assert (run.reason, run.details["case"]) == ("not-bitwise", "force-sum")


@needs_old
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "sum-paths")
def test_a_tied_weight_rounded_per_use_before_2_15_is_caught(broken) -> None:
    # 2.15's grad_dtype on 2.13's FSDP2: only the tied weight's gradient moves, in the fp16 leg.
    run = broken(wrapping(f"{PARAM}.init_unsharded_param", grad_dtype_is_reduce_dtype))
    assert (run.reason, run.details["case"]) == ("not-bitwise", "fp16")


@needs_new
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "sum-paths-2.15")
def test_a_post_divide_that_never_happens_on_2_15_is_caught(broken) -> None:
    run = broken(wrapping(f"{F2}._fsdp_collectives:_div_if_needed", never_divide))
    assert (run.reason, run.details["case"]) == ("not-bitwise", "force-sum")


@needs_new
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "sum-paths-2.15")
def test_a_tied_weight_summed_before_rounding_on_2_15_is_caught(broken) -> None:
    run = broken(wrapping(f"{PARAM}.init_unsharded_param", grad_dtype_unset))
    assert (run.reason, run.details["case"]) == ("not-bitwise", "fp16")


@needs_old
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "tied-fp16-sum-then-round")
def test_round_each_before_2_15_is_caught(broken) -> None:
    run = broken(wrapping(f"{PARAM}.init_unsharded_param", grad_dtype_is_reduce_dtype))
    assert run.reason == "tied-order-differs"
    assert run.details["observed"] == ["round-each"]


@needs_old
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "tied-fp16-sum-then-round")
def test_a_guide_that_swaps_the_two_orders_values_is_caught(broken) -> None:
    swapped = "sum-then-round 0.00250244140625  round-each 0.00249481201171875"
    run = broken(expected=rewritten("tied-fp16", {"[0, 3]": swapped}))
    assert run.reason == "figures-differ"
    assert named_rows(run) == [("tied-fp16", "[0, 3]")]


@needs_new
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "tied-fp16-round-each")
def test_sum_then_round_on_2_15_is_caught(broken) -> None:
    run = broken(wrapping(f"{PARAM}.init_unsharded_param", grad_dtype_unset))
    assert run.reason == "tied-order-differs"
    assert run.details["observed"] == ["sum-then-round"]


@needs_new
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "tied-fp16-round-each")
def test_a_guide_count_past_the_slack_is_caught_on_2_15(broken) -> None:
    run = broken(expected=rewritten("tied-fp16", {"counts": COUNTS.replace("337", "341")}))
    assert (run.reason, run.details["slack"]) == ("figures-differ", SLACK)
    assert named_rows(run) == [("tied-fp16", "counts")]


@needs_new
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "mixed-precision-2.15")
def test_a_reduction_in_the_gradients_dtype_on_2_15_is_caught(broken) -> None:
    # 2.13's choice, `reduce_dtype or grad_dtype`, inside 2.15: bf16/None reduce-scatters in bf16 again.
    run = broken(wrapping(f"{GROUP}._get_reduce_dtype", reduce_in_gradient_dtype))
    assert (run.reason, run.details["policy"]) == ("dtypes-differ", "bf16/None")
    assert run.details["observed"]["reduce_scatter"] == ["bfloat16"]


@needs_new
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "mixed-precision-2.15")
def test_a_waiting_gradient_never_cast_up_on_2_15_is_caught(broken) -> None:
    # The reduce-scatters are still fp32 (the copy-in casts); only the unsynced gradient stays bf16.
    run = broken(wrapping(f"{GROUP}._set_unsharded_grad_dtypes", upcast_always_deferred))
    assert (run.reason, run.details["policy"]) == ("dtypes-differ", "bf16/None")
    assert run.details["observed"]["reduce_scatter"] == ["float32"]
    assert run.details["observed"]["waits"] == ["bfloat16"]


@needs_new
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "mixed-precision-2.15")
def test_a_guide_with_2_13s_bf16_row_is_caught_on_2_15(broken) -> None:
    run = broken(expected=rewritten("precision-2.15", {"bf16/None": "bfloat16  bfloat16  AVG  float32  bfloat16"}))
    assert (run.reason, run.details["policy"]) == ("table-differs", "bf16/None")
    assert named_rows(run) == [("precision-2.15", "bf16/None")]


@needs_old
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "mixed-precision")
def test_a_dropped_reduce_dtype_is_caught(broken) -> None:
    run = broken(wrapping(f"{PARAM}.init_dtype_attrs", reduce_dtype_ignored))
    assert (run.reason, run.details["policy"]) == ("dtypes-differ", "bf16/fp32")
    assert run.details["observed"]["reduce_scatter"] == ["bfloat16"]


@needs_old
@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "mixed-precision")
def test_a_guide_with_2_15s_bf16_row_is_caught_before_2_15(broken) -> None:
    run = broken(expected=rewritten("precision", {"bf16/None": "bfloat16  float32  AVG  float32  float32"}))
    assert (run.reason, run.details["policy"]) == ("table-differs", "bf16/None")
    assert (run.details["observed"]["reduce"], run.details["expected"]["reduce"]) == ("bfloat16", "float32")
    assert named_rows(run) == [("precision", "bf16/None")]


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "accumulate-without-sync")
def test_a_sync_that_cannot_be_turned_off_is_caught(broken) -> None:
    run = broken(wrapping(f"{F2}._fully_shard:FSDPModule.set_requires_gradient_sync", sync_ignored))
    assert (run.reason, run.details["observed"]) == ("reduced-without-sync", 4)


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "accumulate-without-sync")
def test_a_waiting_gradient_left_in_bf16_is_caught(broken) -> None:
    # bf16/fp32 with the waiting gradient left in bf16 on the unsharded parameter: before 2.15 by dropping the
    # reduce dtype. From 2.15 a dropped one means fp32, the parameters' dtype, and an unsynced first backward gets
    # fp32 from autograd (the grad_dtype is switched off only when reducing), then the cast up after it: both go.
    if GRAD_DTYPE:
        run = broken(
            wrapping(f"{PARAM}.init_unsharded_param", grad_dtype_unset),
            wrapping(f"{GROUP}._set_unsharded_grad_dtypes", upcast_always_deferred),
        )
    else:
        run = broken(wrapping(f"{PARAM}.init_dtype_attrs", reduce_dtype_ignored))
    assert run.reason == "accumulated-dtype-differs"
    assert run.details["observed"] == {"dtypes": ["bfloat16"]}


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "five-adamw-steps")
def test_gradients_reduced_in_bf16_are_caught(broken) -> None:
    run = broken(wrapping(f"{PARAM}.init_dtype_attrs", reduce_in_bf16))
    assert (run.reason, run.details["impl"]) == ("losses-differ", "fsdp2")


# The tied-fp16 counts are held within the guide's count_slack of its figures, torch-free: a count one past the slack, a
# changed element count or changed words fail for the figures' reason.
SLACK = 3  # the tied-fp16 claims' count_slack
COUNTS = "1,152 elements, 337 differ: 192 in rank 0's rows, 145 in rank 1's"


@pytest.mark.parametrize(
    "seen",
    [
        COUNTS.replace("337", "336").replace("192", "191"),  # another CPU's kernels (measured)
        COUNTS.replace("337", "340").replace("145", "142"),  # the slack, each way
    ],
)
def test_tied_counts_within_the_slack_hold(seen: str) -> None:
    tied = block("tied-fp16")
    require_counts_near(seen, tied, tied.row("counts"), SLACK)


@pytest.mark.parametrize(
    "seen",
    [
        COUNTS.replace("337", "341"),  # one past the slack
        COUNTS.replace("1,152", "1,151"),  # the element count is exact
        COUNTS.replace("rank 0's rows", "rank 0's columns"),  # other words
    ],
)
def test_tied_counts_past_the_slack_fail_for_the_figures_reason(seen: str) -> None:
    tied = block("tied-fp16")
    with pytest.raises(Violation) as failure:
        require_counts_near(seen, tied, tied.row("counts"), SLACK)
    assert failure.value.reason == "figures-differ"
    assert [(row["block"], row["key"]) for row in failure.value.expect_rows] == [("tied-fp16", "counts")]


def test_the_counts_are_the_guides() -> None:
    assert block("tied-fp16").row("counts").value == COUNTS
