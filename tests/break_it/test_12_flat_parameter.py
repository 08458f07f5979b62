"""Guide 12: bend the flat parameter inside the ranks (alignment, padding, shard metadata, views, the all-gather,
the reduction) and watch each property fail on a shrunk unit; remove or add CPU offload's failures and watch
those claims fail too."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from checks.breakit.patches import replacing, set_to, skipping, wrapping
from checks.guides.g12_flat_parameter.recipes import (
    aligned_off_by_one,
    allow_writeback_with_rank0_only,
    always_pin,
    double_offloaded_grads,
    everyone_gets_full_params,
    flattened_backwards,
    gather_off_by_one,
    never_offload,
    never_pin,
    no_grad_division,
    pins_nothing,
    shard_offsets_off_by_one,
    to_cpu_as_in_2_14_1,
    unshard_grad_of_own_shard_only,
    views_of_a_rolled_copy,
    writeback_of_rank_0,
    writeback_without_grads,
    zero_padding,
)
from checks.models.flat_param_draws import total_numel
from checks.ranks.protocol import CheckRequest
from tests.break_it.conftest import named_rows

FP = "torch.distributed.fsdp._flat_param"
RU = "torch.distributed.fsdp._runtime_utils"
F2 = "torch.distributed.fsdp._fully_shard"
UP = "torch.distributed.fsdp._unshard_param_utils"
ALIGN_OFF = wrapping(f"{FP}:_get_aligned_numel", aligned_off_by_one)
ZERO_PADDING = wrapping(f"{FP}:_construct_padding_tensor", zero_padding)
FIX_TO_CPU = replacing(f"{FP}:FlatParamHandle.to_cpu", to_cpu_as_in_2_14_1)
FIXED = Version(torch.__version__.split("+")[0]) >= Version("2.14.1")
needs_old = pytest.mark.skipif(FIXED, reason="pins torch < 2.14.1's to_cpu")
needs_new = pytest.mark.skipif(not FIXED, reason=f"the claim is for torch >= 2.14.1; this is {torch.__version__}")


def example(run) -> dict:
    return run.request.kwargs["example"]


# -- (a) the spec ---------------------------------------------------------------------------------------------------
@pytest.mark.breaks("12-flat-parameter", "flat-param-is-the-spec-at-2")
def test_alignment_off_by_one_is_caught_on_a_small_unit(broken) -> None:
    run = broken(ALIGN_OFF)
    assert run.reason in {"numels-with-padding-differs", "aligned-numel-differs"}
    assert example(run)["use_orig_params"] and total_numel(example(run)) <= 10


@pytest.mark.breaks("12-flat-parameter", "flat-param-is-the-spec-at-2")
def test_a_spec_with_the_wrong_alignment_is_caught(broken) -> None:
    # The spec, not torch, is wrong: 20 bytes instead of 16 (5 fp32 elements).
    run = broken(set_to("checks.models.flat_param:ALIGNMENT_BYTES", 20))
    assert run.reason in {"numels-with-padding-differs", "aligned-numel-differs"}
    assert example(run)["use_orig_params"] and total_numel(example(run)) <= 10


@pytest.mark.breaks("12-flat-parameter", "flat-param-is-the-spec-at-4")
def test_shifted_shard_offsets_are_caught_at_4(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._get_shard_metadata", shard_offsets_off_by_one))
    assert run.reason == "shard-param-infos-differs"
    assert run.details["field"] == "shard-param-infos"
    assert len(example(run)["modules"]) + len(example(run)["root"]) <= 2


# -- (b) the slices ---------------------------------------------------------------------------------------------------
@pytest.mark.breaks("12-flat-parameter", "shards-hold-their-slice-at-2")
def test_padding_of_zeros_is_caught(broken) -> None:
    # Only use_orig_params=True builds padding into the flat parameter; sharding's own padding is 0 anyway.
    run = broken(ZERO_PADDING)
    assert run.reason == "local-shard-differs"
    assert example(run)["use_orig_params"] and run.details["expected_value"] == 42.0


@pytest.mark.breaks("12-flat-parameter", "shards-hold-their-slice-at-4")
def test_a_flat_parameter_in_the_wrong_order_is_caught_at_4(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle.flatten_tensors", flattened_backwards))
    assert run.reason == "local-shard-differs"
    assert total_numel(example(run)) <= 8


# -- (c) the all-gather ------------------------------------------------------------------------------------------------
@pytest.mark.breaks("12-flat-parameter", "summon-gathers-originals-at-2")
def test_a_corrupted_all_gather_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", gather_off_by_one))
    assert (run.reason, run.details["index"]) == ("padded-unsharded-differs", 0)


@pytest.mark.breaks("12-flat-parameter", "summon-gathers-originals-at-4")
def test_views_of_the_wrong_elements_are_caught_at_4(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._use_unsharded_flat_param", views_of_a_rolled_copy))
    assert run.reason == "unsharded-param-differs"
    assert total_numel(example(run)) <= 4


# -- (d) the step -----------------------------------------------------------------------------------------------------
@pytest.mark.breaks("12-flat-parameter", "step-matches-unwrapped-at-2")
def test_a_reduction_that_sums_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_div_if_needed", no_grad_division))
    assert run.reason == "local-shard-differs"
    assert total_numel(example(run)) <= 4


@pytest.mark.breaks("12-flat-parameter", "step-matches-unwrapped-at-4")
def test_a_reduction_that_sums_is_caught_at_4(broken) -> None:
    run = broken(wrapping(f"{RU}:_div_if_needed", no_grad_division))
    assert run.reason == "local-shard-differs"
    assert total_numel(example(run)) <= 4


@pytest.mark.breaks("12-flat-parameter", "every-property-200-at-2")
def test_the_long_run_catches_zero_padding(broken) -> None:
    run = broken(ZERO_PADDING)
    assert run.reason == "local-shard-differs" and example(run)["use_orig_params"]


@pytest.mark.breaks("12-flat-parameter", "every-property-200-at-4")
def test_the_long_run_catches_wrong_alignment_at_4(broken) -> None:
    run = broken(ALIGN_OFF)
    assert run.reason in {"numels-with-padding-differs", "aligned-numel-differs"}


# -- the diagram -------------------------------------------------------------------------------------------------------
@pytest.mark.breaks("12-flat-parameter", "layout-at-4")
def test_a_different_alignment_changes_the_diagram(broken) -> None:
    run = broken(ALIGN_OFF)
    assert run.reason == "diagram-differs"
    # Aligned to 5: w1 and m0 start at 10 and m0.bias at 25 with no padding; 2 before m1.weight, 1 at the end.
    assert run.details["line"] == 1
    assert run.details["observed"] == "the unit: 52 elements = 49 in 5 parameters + 2 alignment + 1 world-size"
    assert run.details["lines"][1] == "padding; 4 ranks x 13"  # the head's continuation row
    head = "the unit: 56 elements = 49 in 5 parameters + 4 alignment + 3 world-size"
    assert named_rows(run) == [("layout-at-4", head)]  # the guide's first row, now false


# -- CPU offload -------------------------------------------------------------------------------------------------------
@pytest.mark.breaks("12-flat-parameter", "offload-params-needs-accelerator")
def test_offload_that_pins_nothing_runs_on_cpu(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle.init_flat_param_attributes", pins_nothing))
    assert run.reason == "offload-ran-without-accelerator"


@pytest.mark.gpu
@pytest.mark.world_size(2)
@pytest.mark.breaks("12-flat-parameter", "offload-params-on-gpu")
def test_gradients_left_on_the_device_are_caught(broken) -> None:
    run = broken(skipping(f"{RU}:_offload_grad"))
    assert run.reason in {"grad-not-on-cpu", "offloaded-grad-differs"}


@needs_old
@pytest.mark.breaks("12-flat-parameter", "summon-offload-frees-with-orig-params")
def test_the_2_14_1_to_cpu_keeps_the_storage(broken) -> None:
    run = broken(FIX_TO_CPU)
    assert run.reason == "storage-kept"
    assert all(size > 0 for size in run.details["observed"].values())


@needs_old
@pytest.mark.breaks("12-flat-parameter", "summon-offload-raises-without-orig-params")
def test_the_2_14_1_to_cpu_does_not_raise(broken) -> None:
    run = broken(FIX_TO_CPU)
    assert run.reason == "no-setstorage-error"


@needs_new
@pytest.mark.breaks("12-flat-parameter", "summon-offload-is-a-no-op")
def test_the_2_13_to_cpu_frees_the_storage(broken) -> None:
    # On 2.14.1 and later: put 2.13.0's behaviour back by freeing what to_cpu views.
    run = broken(wrapping(f"{FP}:FlatParamHandle.to_cpu", _free_inside))
    assert run.reason == "storage-freed"


def _free_inside(original, handle):  # pragma: no cover - runs only on torch >= 2.14.1
    raise NotImplementedError


def test_the_no_op_claim_holds_with_2_14_1_s_to_cpu(pool) -> None:
    # The `>= 2.14.1` claim is skipped on 2.13.0; its check passes here with 2.14.1's `to_cpu` patched in, and
    # fails with 2.13.0's own (the setStorage error of the use_orig_params=False half).
    target = "checks.guides.g12_flat_parameter.offload:summon_offload_is_a_no_op"
    fixed = pool.run(CheckRequest(target, world_size=2, patches=(FIX_TO_CPU,)))
    assert fixed.ok, fixed.failure
    if not FIXED:
        as_is = pool.run(CheckRequest(target, world_size=2))
        assert not as_is.ok and "setStorage" in (as_is.results[0].message or "")


@pytest.mark.breaks("12-flat-parameter", "fsdp2-offload-unpinned-runs")
def test_an_offload_that_changes_gradients_is_caught(broken) -> None:
    run = broken(wrapping(f"{F2}._fsdp_collectives:foreach_reduce", double_offloaded_grads))
    assert run.reason == "offloaded-grad-differs"


# -- summon_full_params' arguments -----------------------------------------------------------------------------------
@pytest.mark.breaks("12-flat-parameter", "summon-writeback-keeps-local-part")
def test_a_writeback_that_writes_nothing_is_caught(broken) -> None:
    run = broken(skipping(f"{UP}:_writeback_to_local_shard"))
    assert run.reason == "local-shard-differs"
    assert run.details["observed_value"] + 1 == run.details["expected_value"]


@pytest.mark.breaks("12-flat-parameter", "summon-writeback-keeps-local-part")
def test_a_writeback_that_spreads_rank_0s_edit_is_caught(broken) -> None:
    # What the TODO in `_validate_unshard_params_args` proposes: rank 0 broadcasts its parameters first. Its edit
    # then reaches rank 1's shard, which moves twice.
    run = broken(wrapping(f"{UP}:_writeback_to_local_shard", writeback_of_rank_0))
    assert (run.reason, run.details["failed_rank"]) == ("local-shard-differs", 1)
    assert run.details["observed_value"] - 1 == run.details["expected_value"]


@pytest.mark.breaks("12-flat-parameter", "summon-writeback-with-grads")
def test_a_gradient_gathered_from_one_shard_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle.unshard_grad", unshard_grad_of_own_shard_only))
    assert run.reason == "unsharded-grad-differs"
    assert run.details["observed_value"] == 0 != run.details["expected_value"]


@pytest.mark.breaks("12-flat-parameter", "summon-writeback-with-grads")
def test_a_writeback_that_drops_the_gradients_is_caught(broken) -> None:
    run = broken(wrapping(f"{UP}:_writeback_to_local_shard", writeback_without_grads))
    assert run.reason == "local-grad-differs"
    assert run.details["observed_value"] + 1 == run.details["expected_value"]


@pytest.mark.breaks("12-flat-parameter", "summon-rank0-only")
def test_rank0_only_that_unshards_everywhere_is_caught(broken) -> None:
    run = broken(wrapping(f"{UP}:_unshard_fsdp_state_params", everyone_gets_full_params))
    assert (run.reason, run.details["failed_rank"]) == ("other-rank-unsharded", 1)
    assert run.details["observed"]["shapes"]["w0"] == [2, 5] and run.details["expected"]["shapes"]["w0"] == [0]


@pytest.mark.breaks("12-flat-parameter", "summon-rank0-only")
def test_writeback_with_rank0_only_allowed_is_caught(broken) -> None:
    run = broken(wrapping(f"{UP}:_validate_unshard_params_args", allow_writeback_with_rank0_only))
    assert run.reason == "writeback-rank0-only-allowed"
    assert run.details["observed"]["raised"] == ""


@pytest.mark.breaks("12-flat-parameter", "fsdp2-offload-unpinned-runs")
def test_an_offload_policy_that_never_reaches_the_parameters_is_caught(broken) -> None:
    """On a cpu mesh a parameter that is not offloaded is on the CPU too, and its gradients are the same: the old
    check, which compared devices and gradients, passed. The FSDPParams' flags show the policy was dropped."""
    run = broken(wrapping(f"{F2}._fsdp_param:FSDPParam._init_sharded_param", never_offload))
    assert run.reason == "policy-not-applied"
    assert (run.details["observed"]["offload"], run.details["expected"]["offload"]) == (
        [[False, False]],
        [[True, False]],
    )


@pytest.mark.breaks("12-flat-parameter", "fsdp2-offload-unpinned-runs")
def test_pinning_despite_pin_memory_false_is_caught(broken) -> None:
    """The old check computed whether the parameters were pinned and never compared it. Pinning needs an
    accelerator: where one exists the check now finds the pinned parameters; without one torch itself raises
    while pinning, which fails the claim before any comparison."""
    run = broken(wrapping(f"{F2}._fsdp_param:FSDPParam._init_sharded_param", always_pin))
    if torch.accelerator.is_available():
        assert run.reason == "pinned"
        assert run.details["observed"]["parameters"] == [True]
    else:
        assert run.reason is None and run.error_types == {"builtins.RuntimeError"}
        assert all("accelerator" in r.message or "NVIDIA driver" in r.message for r in run.failed)


@pytest.mark.breaks("12-flat-parameter", "fsdp2-offload-pinned-fails")
def test_fsdp2_that_never_pins_runs_on_cpu(broken) -> None:
    run = broken(wrapping(f"{F2}._fsdp_param:FSDPParam._init_sharded_param", never_pin))
    assert run.reason == "pinned-offload-ran"
