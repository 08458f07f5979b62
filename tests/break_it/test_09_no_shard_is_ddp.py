"""Guide 09: bend NO_SHARD's reduction and its choice, and watch the claims fail."""

from dataclasses import replace

import pytest

from checks.breakit.patches import replacing, skipping, wrapping
from checks.expected import Expected
from checks.guides.g09_no_shard_is_ddp.all_reduces import REDUCER
from checks.guides.g09_no_shard_is_ddp.recipes import (
    divide_for_the_shard_group_only,
    flatten_as_if_alone,
    init_core_state_naming_the_def_line,
    init_core_state_silently,
    init_core_state_with_user_warnings,
    init_core_state_without_clamp,
    map_no_shard_to,
    reduce_also_over_replicas,
    reduce_with_all_reduce_twice,
    reduce_without_all_reduce,
)
from tests.break_it.conftest import guides, named_rows

RU = "torch.distributed.fsdp._runtime_utils"
IU = "torch.distributed.fsdp._init_utils"
FP = "torch.distributed.fsdp._flat_param"
NO_DIVIDE = skipping(f"{RU}:_div_if_needed")
NO_ALL_REDUCE = wrapping(REDUCER, reduce_without_all_reduce)
ALL_REDUCE_TWICE = wrapping(REDUCER, reduce_with_all_reduce_twice)
SHARDED_HANDLE = replacing(f"{IU}:SHARDING_STRATEGY_MAP", map_no_shard_to, strategy="FULL_SHARD")
SIZES = [16020, 16020, 16020, 3528]
UNPADDED_NO_SHARD = wrapping(f"{FP}:FlatParamHandle._init_flat_param_and_metadata", flatten_as_if_alone)
GUIDE = "09-no-shard-is-ddp"


def quoted(block: str) -> Expected:
    """The guide's expect block quoting one warning (its one row's key is the warning's text)."""
    guide = guides()[GUIDE]
    return guide.expect_blocks(guide.read_on)[block].expected


def misquoted(block: str, text: str) -> Expected:
    """The block with its one row quoting ``text`` instead."""
    expected = quoted(block)
    (row,) = expected.rows
    return replace(expected, rows=(replace(row, text=text, key=text, cells=(text,)),))


# -- all-reduces-only ------------------------------------------------------------------------------------------
@pytest.mark.breaks("09-no-shard-is-ddp", "all-reduces-only")
def test_a_sharded_handle_under_no_shard_gathers_and_scatters(broken) -> None:
    run = broken(SHARDED_HANDLE)
    assert run.reason == "not-only-all-reduce"
    assert run.details["counts"]["all_gather"] > 0 and run.details["counts"]["reduce_scatter"] == 4


@pytest.mark.breaks("09-no-shard-is-ddp", "all-reduces-only")
def test_a_missing_all_reduce_is_caught(broken) -> None:
    run = broken(NO_ALL_REDUCE)
    assert run.reason == "not-only-all-reduce" and run.details["counts"] == {}


@pytest.mark.breaks("09-no-shard-is-ddp", "all-reduces-only")
def test_a_second_all_reduce_is_caught(broken) -> None:
    run = broken(ALL_REDUCE_TWICE)
    assert run.reason == "all-reduce-sizes"
    assert run.details["observed"] == [size for size in SIZES for _ in range(2)] and run.details["expected"] == SIZES


@pytest.mark.breaks("09-no-shard-is-ddp", "all-reduces-only")
def test_an_undivided_gradient_is_caught(broken) -> None:
    run = broken(NO_DIVIDE)
    assert (run.reason, run.details["observed"], run.details["expected"]) == ("wrong-predivide", [1.0], [2.0])


@pytest.mark.breaks("09-no-shard-is-ddp", "all-reduces-only-at-4")
def test_an_undivided_gradient_is_caught_on_4_ranks(broken) -> None:
    run = broken(NO_DIVIDE)
    assert (run.reason, run.details["observed"]) == ("wrong-predivide", [1.0])


@pytest.mark.breaks("09-no-shard-is-ddp", "all-reduces-only-at-4")
def test_a_sharded_handle_is_caught_on_4_ranks(broken) -> None:
    run = broken(SHARDED_HANDLE)
    assert run.reason == "not-only-all-reduce" and "reduce_scatter" in run.details["counts"]


# -- no-shard-pads-for-world-size ------------------------------------------------------------------------------
@pytest.mark.breaks("09-no-shard-is-ddp", "no-shard-pads-for-world-size")
def test_a_no_shard_flat_parameter_left_unpadded_is_caught(broken) -> None:
    """What guide 09 used to say: under NO_SHARD nothing pads for the world size. The toy's units (31, 41 and 33
    elements once aligned) then keep their aligned lengths."""
    run = broken(UNPADDED_NO_SHARD)
    assert run.reason == "flat-param-padding"
    observed, expected = run.details["observed"], run.details["expected"]
    assert [observed[u]["numel"] for u in ("0", "1", "root")] == [31, 41, 33]
    assert [expected[u]["numel"] for u in ("0", "1", "root")] == [32, 42, 34]
    assert observed["root"]["padding"] == [False, True, False]  # alignment padding only, no tail


@pytest.mark.breaks("09-no-shard-is-ddp", "no-shard-pads-for-world-size")
def test_a_sharded_handle_under_no_shard_holds_a_shard(broken) -> None:
    # A sharded handle pads the same way, then keeps only this rank's half of the padded flat parameter.
    run = broken(SHARDED_HANDLE)
    assert run.reason == "flat-param-padding"
    assert [run.details["observed"][u]["numel"] for u in ("0", "1", "root")] == [16, 21, 17]


@pytest.mark.breaks("09-no-shard-is-ddp", "no-shard-pads-for-world-size-at-4")
def test_an_unpadded_no_shard_flat_parameter_is_caught_on_4_ranks(broken) -> None:
    run = broken(UNPADDED_NO_SHARD)
    assert run.reason == "flat-param-padding"
    assert [run.details["expected"][u]["numel"] for u in ("0", "1", "root")] == [32, 44, 36]
    assert [run.details["observed"][u]["numel"] for u in ("0", "1", "root")] == [31, 41, 33]


# -- matches-ddp-bitwise -----------------------------------------------------------------------------------------
@pytest.mark.breaks("09-no-shard-is-ddp", "matches-ddp-bitwise")
def test_a_summed_gradient_differs_from_ddp(broken) -> None:
    # Twice DDP's gradient. Step 1's loss, computed before any update, is still equal; step 1's parameters are not:
    # AdamW's first update, lr · g / (|g| + ε), changes wherever |g| is not far above ε.
    run = broken(NO_DIVIDE)
    assert (run.reason, run.details["step"]) == ("differs-from-ddp", 1)
    assert run.details["max_abs_diff"] > 0 and run.details["differing"]


@pytest.mark.breaks("09-no-shard-is-ddp", "matches-ddp-bitwise")
def test_unsynced_gradients_differ_from_ddp(broken) -> None:
    run = broken(NO_ALL_REDUCE)
    assert (run.reason, run.details["step"]) == ("differs-from-ddp", 1)


@pytest.mark.breaks("09-no-shard-is-ddp", "matches-ddp-bitwise")
def test_a_doubly_reduced_gradient_differs_from_ddp(broken) -> None:
    run = broken(ALL_REDUCE_TWICE)
    assert (run.reason, run.details["step"]) == ("differs-from-ddp", 1)


# -- within-1e-6-of-ddp-at-4 -------------------------------------------------------------------------------------
@pytest.mark.breaks("09-no-shard-is-ddp", "within-1e-6-of-ddp-at-4")
def test_an_undivided_gradient_is_no_summation_order(broken) -> None:
    run = broken(NO_DIVIDE)
    assert (run.reason, run.details["side"]) == ("not-a-summation-order", "fsdp")
    assert run.details["observed"] > 0


@pytest.mark.breaks("09-no-shard-is-ddp", "within-1e-6-of-ddp-at-4")
def test_the_bound_is_checked(broken) -> None:
    # The measured differences (6.0e-7 after step 5) against a bound below them.
    run = broken(bound=1e-8)
    assert (run.reason, run.details["step"], run.details["bound"]) == ("beyond-bound", 1, 1e-8)


# -- deprecation-warning -----------------------------------------------------------------------------------------
@pytest.mark.breaks("09-no-shard-is-ddp", "deprecation-warning")
def test_a_silent_no_shard_is_caught(broken) -> None:
    run = broken(wrapping(f"{IU}:_init_core_state", init_core_state_silently))
    assert (run.reason, run.details["observed"], run.details["expected"]) == ("deprecation-count", 0, 4)
    assert named_rows(run) == [("deprecation", quoted("deprecation").rows[0].key)]


@pytest.mark.breaks("09-no-shard-is-ddp", "deprecation-warning")
def test_a_deprecation_as_user_warning_is_caught(broken) -> None:
    run = broken(wrapping(f"{IU}:_init_core_state", init_core_state_with_user_warnings))
    assert (run.reason, run.details["observed"]) == ("wrong-category", ["UserWarning"])


@pytest.mark.breaks("09-no-shard-is-ddp", "deprecation-warning")
def test_the_quoted_text_is_checked(broken) -> None:
    # The guide's expect block is the expected text: a misquote fails the claim.
    misquote = "The `NO_SHARD` sharding strategy is deprecated."
    run = broken(expected=misquoted("deprecation", misquote))
    assert (run.reason, run.details["observed"]) == ("deprecation-count", 0)
    assert len(run.details["warnings"]) == 4
    assert named_rows(run) == [("deprecation", misquote)]


@pytest.mark.breaks("09-no-shard-is-ddp", "deprecation-warning")
def test_a_deprecation_naming_the_wrong_line_is_caught(broken) -> None:
    """Each warning names `fsdp1_gpt`'s `def` line instead of the line that built the unit: the right file, which
    is all the old check compared, so it passed."""
    run = broken(wrapping(f"{IU}:_init_core_state", init_core_state_naming_the_def_line))
    assert run.reason == "warning-location"
    observed, expected = run.details["observed"], run.details["expected"]
    assert len(set(observed)) == 1 and len(set(expected)) == 2 and len(expected) == 4
    assert {site.split(":")[0] for site in observed + expected} == {"gpt.py"}


# -- one-rank-group-clamps ---------------------------------------------------------------------------------------
@pytest.mark.breaks("09-no-shard-is-ddp", "one-rank-group-clamps")
def test_no_clamp_is_caught(broken) -> None:
    run = broken(wrapping(f"{IU}:_init_core_state", init_core_state_without_clamp))
    assert (run.reason, run.details["observed"], run.details["warnings"]) == ("no-clamp-warning", 0, [])
    assert named_rows(run) == [("clamp", quoted("clamp").rows[0].key)]


@pytest.mark.breaks("09-no-shard-is-ddp", "one-rank-group-clamps")
def test_a_silent_clamp_is_caught(broken) -> None:
    run = broken(wrapping(f"{IU}:_init_core_state", init_core_state_silently))
    assert (run.reason, run.details["observed"]) == ("no-clamp-warning", 0)


@pytest.mark.breaks("09-no-shard-is-ddp", "one-rank-group-clamps")
def test_a_clamp_warning_naming_the_wrong_line_is_caught(broken) -> None:
    """The clamp warning names `FullyShardedDataParallel.__init__`'s `def` line, not the line that calls
    `_init_core_state`: still torch's own file, so the old check, which compared file names, passed."""
    run = broken(wrapping(f"{IU}:_init_core_state", init_core_state_naming_the_def_line))
    assert run.reason == "warning-location"
    observed, expected = run.details["observed"], run.details["expected"]
    assert len(observed) == len(expected) == 4 and observed != expected
    assert {site.split(":")[0] for site in observed + expected} == {"fully_sharded_data_parallel.py"}


# -- hybrid-shard-of-one-never-syncs -----------------------------------------------------------------------------
@pytest.mark.breaks("09-no-shard-is-ddp", "hybrid-shard-of-one-never-syncs")
def test_a_replica_all_reduce_syncs_the_gradients(broken) -> None:
    # What a fix for pytorch#154888 would do: the gradient becomes the mean of both ranks' local gradients.
    run = broken(wrapping(REDUCER, reduce_also_over_replicas))
    assert run.reason == "not-own-gradient-divided" and len(run.details["observed"]) > 1


@pytest.mark.breaks("09-no-shard-is-ddp", "hybrid-shard-of-one-never-syncs")
def test_divide_factors_for_the_shard_group_alone_are_caught(broken) -> None:
    # Dividing by the shard group's size (1) instead of every data-parallel rank's (2) leaves the gradient whole.
    run = broken(wrapping(f"{IU}:_init_process_group_state", divide_for_the_shard_group_only))
    assert (run.reason, run.details["observed"], run.details["expected"]) == ("not-own-gradient-divided", [1.0], [0.5])
