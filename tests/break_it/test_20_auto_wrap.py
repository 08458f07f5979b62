"""Guide 20: bend FSDP's wrap code (a policy that misses a target or takes the wrong modules, a walk that skips a
child, ``>`` for ``>=``, emptied defaults, a remainder not subtracted, the mixed-precision override, its hooks or
its overrides missing, ``all`` for ``any``, kwargs dropped, an inverted lambda, the exact type for
``isinstance``), the tied weight's view of its shard, FSDP2's managed modules and states, and the step a
granularity runs, and watch each claim fail for its reason."""

import pytest

from checks.breakit.patches import replacing, skipping, wrapping
from checks.guides.g20_auto_wrap.recipes import (
    all_policies,
    also_linears,
    empty_set,
    exact_classes,
    fsdp2_first_half,
    fsdp2_skip_dtensors,
    fsdp2_through_nested,
    kwargs_dropped,
    lambda_inverted,
    no_backward_prefetch,
    overrides_without_hooks,
    policy_takes_mlps,
    remainder_not_subtracted,
    shard_view_copied,
    skip_first_target,
    skip_last_child,
    small_default,
    strictly_larger,
    targets_unchanged,
    unaligned,
    without_overrides,
)
from tests.break_it.conftest import named_rows, restated

WRAP = "torch.distributed.fsdp.wrap"
SIZE = f"{WRAP}:size_based_auto_wrap_policy"
FSDP2_INIT = "torch.distributed.fsdp._fully_shard._fsdp_init"

SKIP_FIRST = wrapping(f"{WRAP}:ModuleWrapPolicy._run_policy", skip_first_target)
TAKES_MLPS = wrapping(f"{WRAP}:ModuleWrapPolicy._run_policy", policy_takes_mlps)
EXACT_CLASSES = wrapping(f"{WRAP}:ModuleWrapPolicy._run_policy", exact_classes)
SKIP_LAST_CHILD = wrapping(f"{WRAP}:_post_order_apply", skip_last_child)
ALSO_LINEARS = wrapping(f"{WRAP}:transformer_auto_wrap_policy", also_linears)
STRICTLY_LARGER = wrapping(SIZE, strictly_larger)
SMALL_DEFAULT = wrapping(SIZE, small_default)
NO_FORCE_LEAF = replacing(f"{SIZE}.FORCE_LEAF_MODULES", empty_set)
NO_EXCLUDE = replacing(f"{SIZE}.EXCLUDE_WRAP_MODULES", empty_set)
WHOLE_COUNT = wrapping(f"{WRAP}:_recursive_wrap", remainder_not_subtracted)
KWARGS_DROPPED = wrapping(f"{WRAP}:CustomPolicy._run_policy", kwargs_dropped)
ALL_POLICIES = wrapping(f"{WRAP}:_or_policy", all_policies)
LAMBDA_INVERTED = wrapping(f"{WRAP}:lambda_auto_wrap_policy", lambda_inverted)
NESTING_UNCHECKED = skipping("torch.distributed.fsdp._wrap_utils:_check_nested_wrapping")
NO_MP_TARGETS = wrapping(f"{WRAP}:_run_mixed_precision_override_policy", targets_unchanged)
NO_CAST_HOOKS = wrapping("torch.distributed.fsdp._common_utils:_override_module_mixed_precision",
                         overrides_without_hooks)  # fmt: skip
OVERRIDES_IGNORED = wrapping(f"{WRAP}:_wrap", without_overrides)
THROUGH_NESTED = wrapping(f"{FSDP2_INIT}:_get_managed_modules", fsdp2_through_nested)
SKIP_DTENSORS = wrapping(f"{FSDP2_INIT}:_get_managed_states", fsdp2_skip_dtensors)
NO_PREFETCH = wrapping("torch.distributed.fsdp._runtime_utils:_get_handle_to_prefetch", no_backward_prefetch)
FIRST_HALF = wrapping(f"{FSDP2_INIT}:_get_managed_states", fsdp2_first_half)
SHARD_COPIED = wrapping("torch.distributed.fsdp._flat_param:FlatParamHandle._use_sharded_views", shard_view_copied)
UNALIGNED = wrapping("torch.distributed.fsdp._flat_param:_get_aligned_numel", unaligned)
# The first row of `root-first-errors`, the unnamed mesh's: the first the bent calls no longer raise.
TYPE_ERROR = "TypeError: Invariant encountered: value was None when it should not be"


def names(units: dict) -> list[str]:
    return list(units)


# -- per-block-units ----------------------------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "per-block-units")
def test_a_policy_that_misses_a_block_is_caught(broken) -> None:
    run = broken(SKIP_FIRST)
    assert (run.reason, run.details["policy"]) == ("units-differ-from-model", "module")
    assert names(run.details["observed"]) == ["root", "blocks.1", "blocks.2"]
    # blocks.0 is no unit, and the root takes its parameters.
    assert named_rows(run) == [("gpt-units", "blocks.0"), ("gpt-units", "root")]


@pytest.mark.breaks("20-auto-wrap", "per-block-units")
def test_a_walk_that_skips_a_child_is_caught(broken) -> None:
    # The ModuleList's last child, blocks.2, is never visited, so never wrapped: the root takes its parameters.
    run = broken(SKIP_LAST_CHILD)
    assert (run.reason, run.details["policy"]) == ("units-differ-from-model", "module")
    assert "blocks.2" not in run.details["observed"]
    assert named_rows(run) == [("gpt-units", "blocks.2"), ("gpt-units", "root")]


@pytest.mark.breaks("20-auto-wrap", "per-block-units")
def test_a_policy_that_takes_the_wrong_modules_is_caught(broken) -> None:
    run = broken(ALSO_LINEARS)
    assert (run.reason, run.details["policy"]) == ("units-differ-from-model", "transformer")
    assert "blocks.0.attn.qkv" in run.details["observed"]


@pytest.mark.breaks("20-auto-wrap", "per-block-units")
def test_the_guides_units_are_checked(broken) -> None:
    run = broken(expected=restated("20-auto-wrap", "gpt-units", {"root": "51588 in 40 parameters"}))
    assert run.reason == "units-differ-from-guide"
    assert run.details["observed"]["root"] == "3528 in 4 parameters, shared lm_head.weight"
    assert named_rows(run) == [("gpt-units", "root")]


@pytest.mark.breaks("20-auto-wrap", "per-block-units-at-4")
def test_a_policy_that_misses_a_block_is_caught_at_4(broken) -> None:
    run = broken(SKIP_FIRST)
    assert run.reason == "units-differ-from-model"
    assert named_rows(run) == [("gpt-units", "blocks.0"), ("gpt-units", "root")]


# -- nn.Transformer --------------------------------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "subclasses-wrapped")
def test_exact_classes_are_caught(broken) -> None:
    # `type(m) in classes` takes no BatchNorm1d, a subclass of the listed _BatchNorm: only the root is left.
    run = broken(EXACT_CLASSES)
    assert (run.reason, run.details["policy"]) == ("units-differ-from-model", "module")
    assert names(run.details["observed"]) == ["root"]
    assert names(run.details["expected"]) == ["blocks.0.norm", "blocks.1.norm", "root"]
    block = "edge-subclass-units"
    assert named_rows(run) == [(block, "blocks.0.norm"), (block, "blocks.1.norm"), (block, "root")]


@pytest.mark.breaks("20-auto-wrap", "transformer-layers")
def test_transformer_layers_with_linears_are_caught(broken) -> None:
    run = broken(ALSO_LINEARS)
    assert (run.reason, run.details["policy"]) == ("units-differ-from-model", "transformer")


@pytest.mark.breaks("20-auto-wrap", "transformer-layers")
def test_a_whole_count_wraps_the_encoder(broken) -> None:
    # Asked with its whole 4,480 instead of the 32 its layers left, the encoder becomes a unit.
    run = broken(WHOLE_COUNT)
    assert (run.reason, run.details["policy"]) == ("units-differ-from-model", "size")
    assert "encoder" in run.details["observed"] and "decoder" in run.details["observed"]
    # Each takes its final LayerNorm from the root; the two units themselves are no row of the block.
    assert named_rows(run) == [("transformer-units", "root")]


@pytest.mark.breaks("20-auto-wrap", "transformer-size-mid-layer")
def test_attention_no_longer_a_leaf_is_caught(broken) -> None:
    run = broken(NO_FORCE_LEAF)
    assert run.reason == "units-differ-from-model"
    assert "encoder.layers.0.self_attn" in run.details["observed"]


@pytest.mark.breaks("20-auto-wrap", "transformer-size-mid-layer")
def test_a_whole_count_inside_layers_is_caught(broken) -> None:
    # encoder and decoder become units too, with the final LayerNorms the root's row states.
    run = broken(WHOLE_COUNT)
    assert run.reason == "units-differ-from-model"
    assert named_rows(run) == [("transformer-size-units", "root")]


# -- the size policy on the edge-case tree ---------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "size-crossed-mid-block")
def test_strictly_larger_is_caught(broken) -> None:
    # up's 288 no longer reaches 288: each block is one unit of 856.
    run = broken(STRICTLY_LARGER)
    assert run.reason == "units-differ-from-model"
    assert names(run.details["observed"]) == ["root", "blocks.0", "blocks.1"]
    assert named_rows(run) == [
        ("edge-size-units", name) for name in ("blocks.0.up", "blocks.0", "blocks.1.up", "blocks.1")
    ]


@pytest.mark.breaks("20-auto-wrap", "size-crossed-mid-block")
def test_no_forced_leaf_is_caught(broken) -> None:
    # The attention becomes a unit, and what each block has left (280) no longer reaches 288.
    run = broken(NO_FORCE_LEAF)
    assert run.reason == "units-differ-from-model"
    assert names(run.details["observed"]) == ["root", "blocks.0.attn", "blocks.0.up", "blocks.1.attn", "blocks.1.up"]


@pytest.mark.breaks("20-auto-wrap", "size-list-excluded")
def test_a_module_list_unit_is_caught(broken) -> None:
    run = broken(NO_EXCLUDE)
    assert run.reason == "units-differ-from-model" and "blocks" in run.details["observed"]
    assert named_rows(run) == [("edge-one-unit", "root")]


@pytest.mark.breaks("20-auto-wrap", "size-defaults")
def test_a_smaller_default_is_caught(broken) -> None:
    run = broken(SMALL_DEFAULT)
    assert run.reason == "units-differ-from-model" and "blocks.0.attn.qkv" in run.details["observed"]


@pytest.mark.breaks("20-auto-wrap", "size-defaults")
def test_an_emptied_attribute_is_caught(broken) -> None:
    run = broken(NO_FORCE_LEAF)
    assert run.reason == "defaults-differ" and run.details["observed"]["FORCE_LEAF_MODULES"] == []


# -- custom and or -----------------------------------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "custom-kwargs")
def test_dropped_kwargs_are_caught(broken) -> None:
    run = broken(KWARGS_DROPPED)
    assert run.reason == "units-differ-from-model"
    assert run.details["observed"]["blocks.1"]["strategy"] == "FULL_SHARD"
    assert named_rows(run) == [("edge-custom-units", "blocks.1")]


@pytest.mark.breaks("20-auto-wrap", "or-policy")
def test_all_instead_of_any_is_caught(broken) -> None:
    # Both must agree: the size policy never descends into a BatchNorm (16 < 600), the lambda never takes a block.
    run = broken(ALL_POLICIES)
    assert run.reason == "units-differ-from-model" and names(run.details["observed"]) == ["root"]
    assert named_rows(run) == [("edge-or-units", row) for row in ("blocks.0.norm", "blocks.0", "blocks.1.norm",
                                                                  "blocks.1", "root")]  # fmt: skip


@pytest.mark.breaks("20-auto-wrap", "or-policy")
def test_an_inverted_lambda_is_caught(broken) -> None:
    assert broken(LAMBDA_INVERTED).reason == "units-differ-from-model"


# -- nesting ---------------------------------------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "nested-wrapping-refused")
def test_nesting_unchecked_is_caught(broken) -> None:
    # Nothing raises the ValueError; the callable walk meets _recursive_wrap's own check, an AssertionError.
    run = broken(NESTING_UNCHECKED)
    assert run.reason == "nesting-not-refused"
    assert not run.details["observed"]["module"].startswith("ValueError")
    assert run.details["observed"]["transformer"].startswith("AssertionError: Child module")


# -- mixed precision ---------------------------------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "batchnorm-own-unit-policy")
def test_no_batchnorm_targets_are_caught(broken) -> None:
    run = broken(NO_MP_TARGETS)
    assert run.reason == "units-differ-from-model" and "blocks.0.norm" not in run.details["observed"]


@pytest.mark.breaks("20-auto-wrap", "batchnorm-own-unit-policy")
def test_missing_cast_hooks_are_caught(broken) -> None:
    run = broken(NO_CAST_HOOKS)
    assert run.reason == "dtypes-differ"
    assert run.details["observed"]["blocks.0.norm input"] == "bfloat16"
    assert named_rows(run) == [("mp-dtypes", "blocks.0.norm input")]


@pytest.mark.breaks("20-auto-wrap", "batchnorm-own-unit-callable")
def test_ignored_overrides_are_caught(broken) -> None:
    run = broken(OVERRIDES_IGNORED)
    assert run.reason == "units-differ-from-model"
    assert run.details["observed"]["blocks.0.norm"]["param_dtype"] == "bfloat16"
    # The rows that say `mixed_precision=None`.
    assert named_rows(run) == [("edge-mp-size-units", "blocks.0.norm"), ("edge-mp-size-units", "blocks.1.norm")]


@pytest.mark.breaks("20-auto-wrap", "batchnorm-own-unit-callable")
def test_missing_cast_hooks_in_the_callable_walk_are_caught(broken) -> None:
    assert broken(NO_CAST_HOOKS).reason == "dtypes-differ"


@pytest.mark.breaks("20-auto-wrap", "batchnorm-own-unit-callable")
def test_all_instead_of_any_under_mixed_precision_is_caught(broken) -> None:
    assert broken(ALL_POLICIES).reason == "units-differ-from-model"


# -- the split tie -----------------------------------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "tied-head-split")
def test_a_linear_policy_missing_one_is_caught(broken) -> None:
    run = broken(SKIP_FIRST)
    assert run.reason == "units-differ-from-model"
    assert named_rows(run) == [("gpt-linear-units", "blocks.0.attn.qkv"), ("gpt-linear-units", "root")]


@pytest.mark.breaks("20-auto-wrap", "tied-head-split")
def test_the_error_is_checked(broken) -> None:
    run = broken(error="index out of range in self")
    assert (run.reason, run.details["observed"]) == ("forward-did-not-fail", "'weight' must be 2-D")


@pytest.mark.breaks("20-auto-wrap", "tied-head-split")
def test_a_copied_shard_is_caught(broken) -> None:
    # The embedding's weight has the shard's shape and values but is no view of lm_head's flat parameter.
    run = broken(SHARD_COPIED)
    assert (run.reason, run.details["part"]) == ("tied-weight-not-the-shard", "storage")


# -- FSDP2 -------------------------------------------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "fsdp2-same-groups")
def test_fsdp2_walking_into_sharded_blocks_is_caught(broken) -> None:
    # The root's call takes the blocks' DTensor parameters too, and fails on them as the wrong order does.
    run = broken(THROUGH_NESTED)
    assert (run.reason, run.details["unit"]) == ("fully-shard-failed", "root")
    assert run.details["error"].startswith("TypeError: Invariant encountered")
    assert named_rows(run) == [("gpt-units", "root")]


@pytest.mark.breaks("20-auto-wrap", "fsdp2-same-groups-at-4")
def test_fsdp2_walking_into_sharded_blocks_is_caught_at_4(broken) -> None:
    run = broken(THROUGH_NESTED)
    assert run.reason == "fully-shard-failed"
    assert named_rows(run) == [("gpt-units", "root")]


@pytest.mark.breaks("20-auto-wrap", "fsdp2-same-groups-edge")
def test_fsdp2_walking_into_sharded_up_layers_is_caught(broken) -> None:
    run = broken(THROUGH_NESTED)
    assert (run.reason, run.details["unit"]) == ("fully-shard-failed", "blocks.0")
    assert named_rows(run) == [("edge-size-units", "blocks.0")]


@pytest.mark.breaks("20-auto-wrap", "fsdp2-root-first")
def test_a_call_that_skips_dtensors_is_caught(broken) -> None:
    run = broken(SKIP_DTENSORS)
    assert (run.reason, run.details["observed"]) == ("wrong-order-not-refused", ["no error", "no error"])
    assert named_rows(run) == [("root-first-errors", TYPE_ERROR)]


@pytest.mark.breaks("20-auto-wrap", "fsdp2-root-first")
def test_a_root_call_that_shards_half_is_caught(broken) -> None:
    # blocks.0 is sharded whole and its own call still fails: only the later blocks show the half.
    run = broken(FIRST_HALF)
    assert (run.reason, run.details["block"]) == ("not-already-sharded", "blocks.1")


@pytest.mark.breaks("20-auto-wrap", "fsdp2-root-first-at-4")
def test_a_call_that_skips_dtensors_is_caught_at_4(broken) -> None:
    run = broken(SKIP_DTENSORS)
    assert run.reason == "wrong-order-not-refused"
    assert named_rows(run) == [("root-first-errors", TYPE_ERROR)]


# -- granularity -------------------------------------------------------------------------------------------------------
@pytest.mark.breaks("20-auto-wrap", "granularity")
def test_a_policy_that_takes_the_mlps_too_is_caught(broken) -> None:
    # Each block's MLP (10,548) becomes a unit: the largest all-gather is no longer a block's.
    run = broken(TAKES_MLPS)
    assert (run.reason, run.details["granularity"]) == ("largest-all-gather-differs", "per-block")
    assert run.details["observed"] == 10548
    assert named_rows(run) == [("granularity", "per-block")]


@pytest.mark.breaks("20-auto-wrap", "granularity")
def test_no_backward_prefetch_lowers_the_peak(broken) -> None:
    # Without the prefetch the peak is the root and one block; one unit has nothing to prefetch.
    run = broken(NO_PREFETCH)
    assert (run.reason, run.details["granularity"]) == ("unsharded-peak-differs", "per-block")
    assert run.details["observed"] == 4 * (3528 + 16020)
    assert named_rows(run) == [("granularity", "per-block")]


@pytest.mark.breaks("20-auto-wrap", "granularity-at-4")
def test_no_backward_prefetch_lowers_the_peak_at_4(broken) -> None:
    run = broken(NO_PREFETCH)
    assert run.reason == "unsharded-peak-differs"
    assert named_rows(run) == [("granularity", "per-block")]


@pytest.mark.breaks("20-auto-wrap", "granularity-bf16")
def test_no_alignment_is_caught(broken) -> None:
    # Without alignment the one unit is its 51,588 elements: no padding.
    run = broken(UNALIGNED)
    assert (run.reason, run.details["granularity"], run.details["observed"]) == (
        "largest-all-gather-differs",
        "one-unit",
        51588,
    )
    assert named_rows(run) == [("granularity-bf16", "one-unit")]
