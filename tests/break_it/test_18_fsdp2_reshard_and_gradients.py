"""Guide 18: bend FSDP2's resharding, its gradient reduction, its mixed precision and its accumulation inside the
ranks, and watch each claim fail for its own reason: a root resharded under the default, an int N read as False,
an int 1 that no longer warns, groups kept unsharded, a post-forward reshard made a full one, a sum that is not
divided, a policy's reduce dtype dropped, a gradient sync that cannot be turned off, a reduction in bf16."""

from __future__ import annotations

import pytest

from checks.breakit.patches import wrapping
from checks.guides.g18_fsdp2_reshard_and_gradients import (
    int_n_means_false,
    keep_unsharded_after_backward,
    keep_unsharded_after_forward,
    never_divide,
    reduce_dtype_ignored,
    reduce_every_post_backward,
    reduce_in_bf16,
    reshard_fully,
    root_resharded_anyway,
    silent_int_one,
    sum_without_divide,
    sync_ignored,
)

F2 = "torch.distributed.fsdp._fully_shard"
GROUP = f"{F2}._fsdp_param_group:FSDPParamGroup"
PARAM = f"{F2}._fsdp_param:FSDPParam"
# fully_shard imported the helper by name: patch the name it calls.
POST_FORWARD_MESH = f"{F2}._fully_shard:_get_post_forward_mesh_info"
DIVIDE_FACTORS = f"{F2}._fsdp_collectives:_get_gradient_divide_factors"


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


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "grads-are-ddp-slice")
def test_a_sum_that_is_not_divided_is_caught(broken) -> None:
    run = broken(wrapping(DIVIDE_FACTORS, sum_without_divide))
    assert (run.reason, run.details["case"]) == ("divide-factors-differ", "fp32")
    assert list(run.details["observed"]) == [None, None, "SUM", "SUM"]


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "sum-paths")
def test_a_post_divide_that_never_happens_is_caught(broken) -> None:
    # The factors are still chosen right; only the gradients show that nothing was divided.
    run = broken(wrapping(f"{F2}._fsdp_collectives:_div_if_needed", never_divide))
    assert (run.reason, run.details["case"]) == ("not-bitwise", "force-sum")


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "mixed-precision")
def test_a_dropped_reduce_dtype_is_caught(broken) -> None:
    run = broken(wrapping(f"{PARAM}.init_dtype_attrs", reduce_dtype_ignored))
    assert (run.reason, run.details["policy"]) == ("dtypes-differ", "bf16/fp32")
    assert run.details["observed"]["reduce_scatter"] == ["bfloat16"]


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "accumulate-without-sync")
def test_a_sync_that_cannot_be_turned_off_is_caught(broken) -> None:
    run = broken(wrapping(f"{F2}._fully_shard:FSDPModule.set_requires_gradient_sync", sync_ignored))
    assert (run.reason, run.details["observed"]) == ("reduced-without-sync", 4)


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "accumulate-without-sync")
def test_a_waiting_gradient_left_in_bf16_is_caught(broken) -> None:
    # bf16/fp32 with the reduce dtype dropped: the unsynced gradient waits in bf16 on the unsharded parameter.
    run = broken(wrapping(f"{PARAM}.init_dtype_attrs", reduce_dtype_ignored))
    assert run.reason == "accumulated-dtype-differs"
    assert run.details["observed"] == {"dtypes": ["bfloat16"]}


@pytest.mark.breaks("18-fsdp2-reshard-and-gradients", "five-adamw-steps")
def test_gradients_reduced_in_bf16_are_caught(broken) -> None:
    run = broken(wrapping(f"{PARAM}.init_dtype_attrs", reduce_in_bf16))
    assert (run.reason, run.details["impl"]) == ("losses-differ", "fsdp2")
