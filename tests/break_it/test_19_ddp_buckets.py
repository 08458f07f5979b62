"""Guide 19: bend DDP's bucketing (caps from the start, no limit ever, one bucket per parameter, buckets not
reversed, a rebuild that ignores the cap list or never happens, an extra broadcast, static_graph left unset),
its no_sync, gradient_as_bucket_view and comm hooks, and watch each claim fail for its reason."""

from dataclasses import replace
from functools import partial

import pytest

from checks.breakit.patches import skipping, wrapping
from checks.guides.g19_ddp_buckets.recipes import (
    allreduce_fut_twice,
    allreduce_fut_undivided,
    caps_from_the_start,
    compress_as,
    ddp_on_reversed_ranks,
    ddp_with_hook,
    doubled_cap,
    explicit_default_cap,
    forced_bucket_view,
    limits_ignoring_find_unused,
    no_limit_ever,
    no_sync_dropping_gradients,
    no_sync_never_restored,
    no_sync_that_syncs,
    one_bucket_per_parameter,
    pre_forward_hiding,
    pre_forward_with_extra_broadcast,
    pre_forward_without_rebuild,
    rebuild_ignores_the_list,
    reducer_not_reversed,
)
from tests.break_it.conftest import expect_block, named_rows, restated

block = partial(expect_block, "19-ddp-buckets")

PD = "torch.nn.parallel.distributed"
DDP = f"{PD}:DistributedDataParallel"
CONFIG = f"{PD}:_BucketCapacityConfig"
HOOKS = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"

CAPS_FROM_START = wrapping(f"{CONFIG}.compute_bucket_size_limits", caps_from_the_start)
NO_LIMIT_EVER = wrapping(f"{CONFIG}.compute_bucket_size_limits", no_limit_ever)
REBUILD_IGNORES_LIST = wrapping(f"{CONFIG}.compute_bucket_size_limits", rebuild_ignores_the_list)
IGNORE_FIND_UNUSED = wrapping(f"{CONFIG}.compute_bucket_size_limits", limits_ignoring_find_unused)
EXPLICIT_DEFAULT = wrapping(f"{CONFIG}.create", explicit_default_cap)
DOUBLED_CAP = wrapping(f"{CONFIG}.create", doubled_cap)
ONE_PER_PARAMETER = wrapping("torch.distributed:_compute_bucket_assignment_by_size", one_bucket_per_parameter)
NOT_REVERSED = wrapping("torch.distributed:Reducer", reducer_not_reversed)
NO_REBUILD = wrapping(f"{DDP}._pre_forward", pre_forward_without_rebuild)
EXTRA_BROADCAST = wrapping(f"{DDP}._pre_forward", pre_forward_with_extra_broadcast)
HIDE_LAST_BUCKET_CAP = wrapping(f"{DDP}._pre_forward", pre_forward_hiding, name="DDP_SET_LAST_BUCKET_CAP")
NO_STATIC_GRAPH = skipping(f"{DDP}._set_static_graph")
SYNCING_NO_SYNC = wrapping(f"{DDP}.no_sync", no_sync_that_syncs)
NEVER_RESTORED = wrapping(f"{DDP}.no_sync", no_sync_never_restored)
DROPPING_NO_SYNC = wrapping(f"{DDP}.no_sync", no_sync_dropping_gradients)
REVERSED_RANKS = wrapping(f"{DDP}.__init__", ddp_on_reversed_ranks)
NO_BUCKET_VIEW = wrapping(f"{DDP}.__init__", forced_bucket_view, value=False)
ALWAYS_BUCKET_VIEW = wrapping(f"{DDP}.__init__", forced_bucket_view, value=True)
UNDIVIDED = wrapping(f"{HOOKS}:_allreduce_fut", allreduce_fut_undivided)
TWICE = wrapping(f"{HOOKS}:_allreduce_fut", allreduce_fut_twice)
AS_BF16 = wrapping(f"{HOOKS}:_compress_hook", compress_as, to="bfloat16")
AS_FP32 = wrapping(f"{HOOKS}:_compress_hook", compress_as, to="float32")
NO_ALL_REDUCE = wrapping(f"{DDP}.__init__", ddp_with_hook, hook="local")
SKEWED = wrapping(f"{DDP}.__init__", ddp_with_hook, hook="skewed")

LINEAR_READY = ["5.bias", "5.weight", "4.bias", "4.weight", "3.bias", "3.weight",
                "2.bias", "2.weight", "1.bias", "1.weight", "0.bias", "0.weight"]  # fmt: skip
LINEAR_READY_INDICES = list(range(11, -1, -1))  # the same order, as parameter indices


def where(run) -> tuple:
    return run.reason, run.details.get("iteration")


# -- default-buckets --------------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "default-buckets")
def test_caps_in_iteration_1_are_caught(broken) -> None:
    # The caps applied at construction: registration order closed at 1 MiB, two buckets from the first backward.
    run = broken(CAPS_FROM_START)
    assert where(run) == ("buckets-differ-from-model", 1)
    assert run.details["observed"] == [[7, 8, 9, 10, 11], [0, 1, 2, 3, 4, 5, 6]]


@pytest.mark.breaks("19-ddp-buckets", "default-buckets")
def test_one_bucket_per_parameter_is_caught(broken) -> None:
    run = broken(ONE_PER_PARAMETER)
    assert where(run) == ("buckets-differ-from-model", 1) and len(run.details["observed"]) == 12


@pytest.mark.breaks("19-ddp-buckets", "default-buckets")
def test_no_first_bucket_default_is_caught(broken) -> None:
    # bucket_cap_mb=25 passed explicitly: no 1 MiB first bucket, so the rebuild leaves one bucket.
    run = broken(EXPLICIT_DEFAULT)
    assert where(run) == ("buckets-differ-from-model", 2) and len(run.details["observed"]) == 1


@pytest.mark.breaks("19-ddp-buckets", "default-buckets")
def test_a_missing_rebuild_is_caught(broken) -> None:
    run = broken(NO_REBUILD)
    assert where(run) == ("buckets-differ-from-model", 2) and run.details["observed"] == [list(range(12))]


@pytest.mark.breaks("19-ddp-buckets", "default-buckets")
def test_an_extra_broadcast_is_caught(broken) -> None:
    run = broken(EXTRA_BROADCAST)
    assert where(run) == ("broadcasts-differ-from-model", 1)


@pytest.mark.breaks("19-ddp-buckets", "default-buckets")
def test_the_guides_numbers_are_checked(broken) -> None:
    # A guide that forgets the rebuild: one bucket in every iteration.
    run = broken(
        expected=restated("19-ddp-buckets", "default-buckets", {"iteration 2": "394752", "iteration 3": "394752"})
    )
    assert run.reason == "numbers-differ-from-guide"
    assert run.details["observed"][1] == "iteration 2: 263168 131584"
    assert named_rows(run) == [("default-buckets", "iteration 2")]


@pytest.mark.breaks("19-ddp-buckets", "default-buckets-at-4")
def test_caps_in_iteration_1_are_caught_at_4(broken) -> None:
    assert where(broken(CAPS_FROM_START)) == ("buckets-differ-from-model", 1)


@pytest.mark.breaks("19-ddp-buckets", "default-buckets-at-4")
def test_an_explicit_cap_makes_the_guides_rows_false_at_4(broken) -> None:
    # bucket_cap_mb=25 passed: torch and the model agree on no 1 MiB first bucket, one bucket after the rebuild.
    run = broken(options={"bucket_cap_mb": 25})
    assert run.reason == "numbers-differ-from-guide"
    assert named_rows(run) == [("default-buckets", "iteration 2")]


# -- small-cap-buckets ------------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "small-cap-buckets")
def test_a_doubled_cap_is_caught(broken) -> None:
    # 0.6 MiB: two buckets of three layers each instead of three of two.
    run = broken(DOUBLED_CAP)
    assert where(run) == ("buckets-differ-from-model", 2) and len(run.details["observed"]) == 2


@pytest.mark.breaks("19-ddp-buckets", "small-cap-buckets")
def test_no_limit_at_the_rebuild_is_caught(broken) -> None:
    run = broken(NO_LIMIT_EVER)
    assert where(run) == ("buckets-differ-from-model", 2) and len(run.details["observed"]) == 1


@pytest.mark.breaks("19-ddp-buckets", "small-cap-buckets")
def test_another_cap_makes_the_guides_rows_false(broken) -> None:
    # 0.6 MiB asked for: torch and the model agree on two buckets of three layers, not the guide's three of two.
    run = broken(options={"bucket_cap_mb": 0.6})
    assert run.reason == "numbers-differ-from-guide"
    assert run.details["observed"][1] == "iteration 2: 197376 197376"
    assert named_rows(run) == [("small-cap-buckets", "iteration 2")]


# -- last-bucket-cap ----------------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "last-bucket-cap")
def test_a_rebuild_that_does_not_see_the_variable_is_caught(broken) -> None:
    # The variable unset while _pre_forward runs the rebuild: the default rebuild, small bucket first, against the
    # model's rule for the variable (set in the ranks all along).
    run = broken(HIDE_LAST_BUCKET_CAP)
    assert where(run) == ("buckets-differ-from-model", 2)
    assert run.details["observed"] == [LINEAR_READY_INDICES[:8], LINEAR_READY_INDICES[8:]]
    assert run.details["expected"] == [[7, 8, 9, 10, 11], [0, 1, 2, 3, 4, 5, 6]]


@pytest.mark.breaks("19-ddp-buckets", "last-bucket-cap")
def test_the_guides_last_bucket_cap_numbers_are_checked(broken) -> None:
    # Without the variable torch and the model agree on the default rebuild: the guide's block is what fails.
    run = broken(env={})
    assert run.reason == "numbers-differ-from-guide"
    assert run.details["observed"][1] == "iteration 2: 263168 131584"
    assert named_rows(run) == [("last-bucket-cap-buckets", "iteration 2")]


# -- find-unused-caps-from-start --------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "find-unused-caps-from-start")
def test_one_bucket_despite_find_unused_is_caught(broken) -> None:
    run = broken(IGNORE_FIND_UNUSED)
    assert where(run) == ("buckets-differ-from-model", 1) and run.details["observed"] == [list(range(12))]


@pytest.mark.breaks("19-ddp-buckets", "find-unused-caps-from-start")
def test_buckets_not_reversed_are_caught(broken) -> None:
    # The reducer given registration order: its bucket 0 would be the one whose gradients are ready last.
    run = broken(NOT_REVERSED)
    assert where(run) == ("buckets-differ-from-model", 1)
    assert run.details["observed"] == [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11]]


@pytest.mark.breaks("19-ddp-buckets", "find-unused-caps-from-start")
def test_without_find_unused_the_guides_rows_are_false(broken) -> None:
    # The default: one bucket in iteration 1, which the guide's first row does not state.
    run = broken(options={"find_unused_parameters": False})
    assert run.reason == "numbers-differ-from-guide"
    assert named_rows(run) == [("find-unused-buckets", "iteration 1")]


# -- cap-list-from-start ----------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "cap-list-from-start")
def test_a_rebuild_ignoring_the_list_is_caught(broken) -> None:
    # The reducer's own limits instead: 1 MiB, then 1 MiB (the list's largest entry).
    run = broken(REBUILD_IGNORES_LIST)
    assert where(run) == ("buckets-differ-from-model", 2) and len(run.details["observed"]) == 2


@pytest.mark.breaks("19-ddp-buckets", "cap-list-from-start")
def test_a_list_ignored_from_the_start_is_caught(broken) -> None:
    run = broken(NO_LIMIT_EVER)
    assert where(run) == ("buckets-differ-from-model", 1) and len(run.details["observed"]) == 1


@pytest.mark.breaks("19-ddp-buckets", "cap-list-from-start")
def test_a_list_in_the_other_order_makes_the_guides_rows_false(broken) -> None:
    # [1.0, 0.1]: torch and the model agree on other buckets from iteration 1.
    run = broken(options={"bucket_cap_mb_list": [1.0, 0.1]})
    assert run.reason == "numbers-differ-from-guide"
    assert named_rows(run) == [("cap-list-buckets", "iteration 1")]


# -- static-graph-rebuilds-later --------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "static-graph-rebuilds-later")
def test_static_graph_never_set_is_caught(broken) -> None:
    # The reducer never told: no used-parameter map in iteration 1 (and the rebuild would come a forward early).
    run = broken(NO_STATIC_GRAPH)
    assert where(run) == ("all-reduces-differ-from-model", 1)
    assert run.details["observed"] == [(394752, "float32")]


@pytest.mark.breaks("19-ddp-buckets", "static-graph-rebuilds-later")
def test_a_missing_rebuild_under_static_graph_is_caught(broken) -> None:
    assert where(broken(NO_REBUILD)) == ("buckets-differ-from-model", 3)


@pytest.mark.breaks("19-ddp-buckets", "static-graph-rebuilds-later")
def test_without_static_graph_the_guides_rows_are_false(broken) -> None:
    # No static_graph: the rebuild comes in the second forward, a row earlier than the guide's.
    run = broken(options={})
    assert run.reason == "numbers-differ-from-guide"
    assert named_rows(run) == [("static-graph-buckets", "iteration 2")]


# -- grammar-buckets, tiny-small-cap-buckets --------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "grammar-buckets")
def test_grammar_without_the_first_bucket_default_is_caught(broken) -> None:
    run = broken(EXPLICIT_DEFAULT)
    assert where(run) == ("buckets-differ-from-model", 2) and len(run.details["observed"]) == 1


@pytest.mark.breaks("19-ddp-buckets", "grammar-buckets")
def test_grammar_caps_in_iteration_1_are_caught(broken) -> None:
    assert where(broken(CAPS_FROM_START)) == ("buckets-differ-from-model", 1)


@pytest.mark.breaks("19-ddp-buckets", "grammar-buckets")
def test_grammar_with_an_explicit_cap_makes_the_guides_rows_false(broken) -> None:
    run = broken(options={"bucket_cap_mb": 25})
    assert run.reason == "numbers-differ-from-guide"
    assert named_rows(run) == [("grammar-buckets", "iteration 2")]


@pytest.mark.breaks("19-ddp-buckets", "tiny-small-cap-buckets")
def test_tiny_one_bucket_per_parameter_is_caught(broken) -> None:
    run = broken(ONE_PER_PARAMETER)
    assert where(run) == ("buckets-differ-from-model", 1) and len(run.details["observed"]) == 40


@pytest.mark.breaks("19-ddp-buckets", "tiny-small-cap-buckets")
def test_tiny_without_a_rebuild_is_caught(broken) -> None:
    assert where(broken(NO_REBUILD)) == ("buckets-differ-from-model", 2)


@pytest.mark.breaks("19-ddp-buckets", "tiny-small-cap-buckets")
def test_tiny_with_another_cap_makes_the_guides_rows_false(broken) -> None:
    run = broken(options={"bucket_cap_mb": 0.1})
    assert run.reason == "numbers-differ-from-guide"
    assert named_rows(run) == [("tiny-buckets", "iteration 2")]


# -- rebuild-reorders -------------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "rebuild-reorders")
def test_a_rebuild_that_never_happens_is_caught(broken) -> None:
    run = broken(NO_REBUILD)
    assert (run.reason, run.details["observed"]) == ("rebuild-flag", [False, False, False])


@pytest.mark.breaks("19-ddp-buckets", "rebuild-reorders")
def test_buckets_assigned_at_construction_are_caught(broken) -> None:
    # With the caps applied at construction, the buckets before the second forward are no longer one in
    # registration order: the reducer's order starts with the last five parameters.
    run = broken(CAPS_FROM_START)
    assert run.reason == "not-registration-order" and run.details["observed"][:5] == [7, 8, 9, 10, 11]


@pytest.mark.breaks("19-ddp-buckets", "rebuild-reorders")
def test_an_extra_broadcast_in_every_forward_is_caught(broken) -> None:
    run = broken(EXTRA_BROADCAST)
    assert run.reason == "rebuild-broadcasts"
    assert run.details["observed"] == ["broadcast 1 int32", "broadcast 13 int32", "broadcast 2 int32"]
    assert named_rows(run) == [("rebuild-broadcasts", "broadcast 13 int32")]


@pytest.mark.breaks("19-ddp-buckets", "rebuild-reorders")
def test_the_guides_ready_order_is_checked(broken) -> None:
    # Weight before bias, as one might guess: not the order autograd makes them ready.
    stated = block("ready-order")
    pairs = zip(stated.rows[::2], stated.rows[1::2], strict=True)
    guess = tuple(row for bias, weight in pairs for row in (weight, bias))
    run = broken(ready=replace(stated, rows=guess))
    assert (run.reason, run.details["observed"]) == ("ready-order-differs-from-guide", LINEAR_READY)
    assert named_rows(run) == [("ready-order", "5.weight")]


@pytest.mark.breaks("19-ddp-buckets", "rebuild-reorders")
def test_a_rebuild_broadcast_from_another_rank_is_caught(broken) -> None:
    # DDP on a group whose rank 0 is the last global rank: the rebuild's broadcasts come from there, and on the
    # two branches every rank takes rank 1's gradient-ready order instead of rank 0's.
    run = broken(REVERSED_RANKS)
    orders = run.details["orders"]
    assert run.reason == "not-rank-0s-layout" and orders[1] != orders[0]
    assert run.details["observed"] == [orders[1], orders[1]]


@pytest.mark.breaks("19-ddp-buckets", "rebuild-reorders-at-4")
def test_a_rebuild_that_never_happens_is_caught_at_4(broken) -> None:
    assert broken(NO_REBUILD).reason == "rebuild-flag"


@pytest.mark.breaks("19-ddp-buckets", "rebuild-reorders-at-4")
def test_an_extra_broadcast_in_every_forward_is_caught_at_4(broken) -> None:
    run = broken(EXTRA_BROADCAST)
    assert run.reason == "rebuild-broadcasts"
    assert named_rows(run) == [("rebuild-broadcasts", "broadcast 13 int32")]


@pytest.mark.breaks("19-ddp-buckets", "rebuild-reorders-at-4")
def test_a_rebuild_broadcast_from_another_rank_is_caught_at_4(broken) -> None:
    run = broken(REVERSED_RANKS)
    assert run.reason == "not-rank-0s-layout" and run.details["observed"] == [run.details["orders"][3]] * 4


# -- overlap-from-iteration-2 -----------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "overlap-from-iteration-2")
def test_one_bucket_after_the_rebuild_does_not_overlap(broken) -> None:
    run = broken(NO_LIMIT_EVER)
    assert (run.reason, run.details["iterations"]) == ("no-overlap", [2, 3])


@pytest.mark.breaks("19-ddp-buckets", "overlap-from-iteration-2")
def test_no_rebuild_no_overlap(broken) -> None:
    run = broken(NO_REBUILD)
    assert (run.reason, run.details["to_come"]) == ("no-overlap", [0, 0, 0])


@pytest.mark.breaks("19-ddp-buckets", "overlap-from-iteration-2")
def test_buckets_in_iteration_1_overlap_and_are_caught(broken) -> None:
    run = broken(CAPS_FROM_START)
    assert run.reason == "overlap-in-iteration-1" and run.details["observed"] > 0


@pytest.mark.breaks("19-ddp-buckets", "overlap-from-iteration-2")
def test_the_guides_issue_order_is_checked(broken) -> None:
    # A guide that states no overlap after the rebuild either.
    no_overlap = "1 all-reduce, after all 52 gradients"
    run = broken(
        expected=restated(
            "19-ddp-buckets", "grammar-issue-order", {"iteration 2": no_overlap, "iteration 3": no_overlap}
        )
    )
    assert run.reason == "issue-order-differs-from-guide"
    assert named_rows(run) == [("grammar-issue-order", "iteration 2")]


@pytest.mark.breaks("19-ddp-buckets", "overlap-from-iteration-2")
def test_the_guides_first_and_last_gradients_are_checked(broken) -> None:
    # A guess that forgets the tie: the head's weight ready first.
    run = broken(ends=restated("19-ddp-buckets", "grammar-ready-ends", {"first ready": "lm_head.weight"}))
    assert run.reason == "ready-ends-differ-from-guide"
    assert run.details["observed"] == ["first ready: ln_f.weight", "last ready: tok_emb.weight"]
    assert named_rows(run) == [("grammar-ready-ends", "first ready")]


@pytest.mark.breaks("19-ddp-buckets", "overlap-from-iteration-2-at-4")
def test_one_bucket_after_the_rebuild_does_not_overlap_at_4(broken) -> None:
    assert broken(NO_LIMIT_EVER).reason == "no-overlap"


@pytest.mark.breaks("19-ddp-buckets", "overlap-from-iteration-2-at-4")
def test_the_guides_issue_order_is_checked_at_4(broken) -> None:
    # One gradient fewer still to come in iteration 3 than the guide's row: the count is the run's, not a guess.
    off_by_one = "2 all-reduces, bucket 0's with 21 of 52 gradients to come"
    run = broken(expected=restated("19-ddp-buckets", "grammar-issue-order", {"iteration 3": off_by_one}))
    assert run.reason == "issue-order-differs-from-guide"
    assert named_rows(run) == [("grammar-issue-order", "iteration 3")]


# -- no-sync-accumulates ----------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "no-sync-accumulates")
def test_a_no_sync_that_syncs_is_caught(broken) -> None:
    # Micro-step 1 all-reduces the one bucket; that backward records the ready order, so micro-step 2 already
    # runs on the four rebuilt buckets.
    run = broken(SYNCING_NO_SYNC)
    assert (run.reason, run.details["round"]) == ("all-reduce-inside-no-sync", 1)
    assert run.details["observed"] == [("all_reduce", n) for n in (51588, 16020, 16020, 16020, 3528)]


@pytest.mark.breaks("19-ddp-buckets", "no-sync-accumulates")
def test_a_no_sync_never_restored_is_caught(broken) -> None:
    run = broken(NEVER_RESTORED)
    assert (run.reason, run.details["observed"], run.details["expected"]) == ("synced-step-all-reduces", [], [51588])


@pytest.mark.breaks("19-ddp-buckets", "no-sync-accumulates")
def test_accumulated_gradients_dropped_are_caught(broken) -> None:
    run = broken(DROPPING_NO_SYNC)
    assert (run.reason, run.details["round"]) == ("not-the-whole-batch-gradient", 1)
    assert run.details["observed"] > 0


@pytest.mark.breaks("19-ddp-buckets", "no-sync-accumulates")
def test_a_broadcast_in_every_micro_step_is_caught(broken) -> None:
    run = broken(EXTRA_BROADCAST)
    assert (run.reason, run.details["round"], run.details["observed"]) == ("rebuild-broadcasts", 1, [[1], [1], [1]])


@pytest.mark.breaks("19-ddp-buckets", "no-sync-accumulates-at-4")
def test_accumulated_gradients_dropped_are_caught_at_4(broken) -> None:
    assert broken(DROPPING_NO_SYNC).reason == "not-the-whole-batch-gradient"


# -- gradient-as-bucket-view ------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "gradient-as-bucket-view")
def test_gradients_that_are_not_views_are_caught(broken) -> None:
    run = broken(NO_BUCKET_VIEW)
    assert (run.reason, run.details["bucket"]) == ("gradient-not-a-bucket-view", 0)


@pytest.mark.breaks("19-ddp-buckets", "gradient-as-bucket-view")
def test_gradients_that_are_always_views_are_caught(broken) -> None:
    run = broken(ALWAYS_BUCKET_VIEW)
    assert run.reason == "gradient-is-a-bucket-view" and len(run.details["observed"]) == 2


@pytest.mark.breaks("19-ddp-buckets", "gradient-as-bucket-view")
def test_the_guides_bytes_are_checked(broken) -> None:
    # A guide that claims no saving: without the option, the same bytes as with it.
    run = broken(
        expected=restated("19-ddp-buckets", "bucket-view-bytes", {"without gradient_as_bucket_view": "1579008 bytes"})
    )
    assert run.reason == "bytes-differ-from-guide"
    assert run.details["observed"][1] == "without gradient_as_bucket_view: 3158016 bytes"
    assert named_rows(run) == [("bucket-view-bytes", "without gradient_as_bucket_view")]


# -- allreduce-hook-is-builtin ----------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "allreduce-hook-is-builtin")
def test_a_hook_that_does_not_divide_is_caught(broken) -> None:
    run = broken(UNDIVIDED)
    assert (run.reason, run.details["step"]) == ("hook-gradients-differ", 1) and run.details["observed"] > 0


@pytest.mark.breaks("19-ddp-buckets", "allreduce-hook-is-builtin")
def test_a_hook_that_all_reduces_twice_is_caught(broken) -> None:
    run = broken(TWICE)
    assert (run.reason, run.details["step"]) == ("hook-collectives-differ", 1)
    assert len(run.details["observed"]) == 2 * len(run.details["expected"])


@pytest.mark.breaks("19-ddp-buckets", "allreduce-hook-is-builtin-at-4")
def test_a_hook_that_does_not_divide_is_caught_at_4(broken) -> None:
    assert broken(UNDIVIDED).reason == "hook-gradients-differ"


# -- fp16-hook-error-bound --------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "fp16-hook-error-bound")
def test_bf16_compression_exceeds_the_fp16_bound(broken) -> None:
    # bf16 keeps 8 significant bits: its rounding is 8 times fp16's, far past the bound.
    run = broken(AS_BF16)
    assert (run.reason, run.details["step"]) == ("beyond-fp16-bound", 1) and run.details["ratio"] > 2


@pytest.mark.breaks("19-ddp-buckets", "fp16-hook-error-bound")
def test_no_compression_is_caught(broken) -> None:
    run = broken(AS_FP32)
    assert run.reason == "not-fp16" and run.details["observed"] == {("torch.float32", False)}


@pytest.mark.breaks("19-ddp-buckets", "fp16-hook-error-bound")
def test_a_loose_bound_is_caught(broken) -> None:
    # Four times the bound: the worst element no longer reaches half of it, so the claim's bound is not tight.
    run = broken(slack=4.04)
    assert run.reason == "bound-not-tight" and run.details["observed"] < 0.5


@pytest.mark.breaks("19-ddp-buckets", "fp16-hook-error-bound-at-4")
def test_bf16_compression_exceeds_the_fp16_bound_at_4(broken) -> None:
    assert broken(AS_BF16).reason == "beyond-fp16-bound"


# -- replicas-stay-identical ------------------------------------------------------------------------------------
@pytest.mark.breaks("19-ddp-buckets", "replicas-stay-identical")
def test_a_missing_all_reduce_lets_replicas_drift(broken) -> None:
    run = broken(NO_ALL_REDUCE)
    assert (run.reason, run.details["step"]) == ("replicas-differ", 1) and run.details["differing"][1] > 0


@pytest.mark.breaks("19-ddp-buckets", "replicas-stay-identical")
def test_a_rank_dependent_gradient_is_caught(broken) -> None:
    # AdamW's first update is lr · g / (|g| + ε): nudging by 1e-6 a gradient far above ε changes its update by less
    # than fp32 can show; from the second step the moments carry the difference into the parameters.
    run = broken(SKEWED)
    assert (run.reason, run.details["step"]) == ("replicas-differ", 2)


@pytest.mark.breaks("19-ddp-buckets", "replicas-stay-identical-at-4")
def test_a_missing_all_reduce_lets_replicas_drift_at_4(broken) -> None:
    run = broken(NO_ALL_REDUCE)
    assert run.reason == "replicas-differ" and set(run.details["differing"]) == {1, 2, 3}
