"""Guide 04: bend forward prefetch and watch the claims fail."""

from dataclasses import replace
from functools import partial

import pytest

from checks.breakit.patches import returning, wrapping
from checks.guides.g04_forward_prefetch import (
    forward_target_after_next_iter,
    forward_target_by_module_order,
    layer_norm_freeing_the_prefetch,
    next_iter_forgetting_order,
    prefetch_remembered,
    prefetch_two_ahead,
    unshard_even_if_prefetched,
)
from tests.break_it.conftest import expect_block, named_rows

block = partial(expect_block, "04-forward-prefetch")

RU = "torch.distributed.fsdp._runtime_utils"
EOD = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"


@pytest.mark.breaks("04-forward-prefetch", "no-prefetch-in-iteration-1")
def test_a_policy_that_prefetches_in_iteration_1_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", forward_target_by_module_order))
    assert run.reason == "prefetched-in-iteration-1"
    assert run.details["observed"][0] == "root -> blocks.0"


@pytest.mark.breaks("04-forward-prefetch", "no-prefetch-in-iteration-1")
def test_forward_prefetch_that_never_starts_is_caught(broken) -> None:
    run = broken(returning(f"{RU}:_get_handle_to_prefetch", None))
    assert run.reason == "never-prefetched"


@pytest.mark.breaks("04-forward-prefetch", "follows-iteration-1-order")
def test_prefetching_two_ahead_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", prefetch_two_ahead))
    assert run.reason == "prefetch-order"
    assert run.details["observed"][0] == "root -> blocks.1"
    assert named_rows(run) == [("forward-prefetches", "root")]


@pytest.mark.breaks("04-forward-prefetch", "follows-iteration-1-order")
def test_a_guide_that_states_another_order_fails(broken) -> None:
    root, blocks_0, _ = block("forward-prefetches").rows
    skipping = replace(blocks_0, text="blocks.0  -> blocks.2", value="blocks.2", cells=("blocks.0", "blocks.2"))
    run = broken(expected=replace(block("forward-prefetches"), rows=(root, skipping)))
    assert run.reason == "order-differs-from-guide"
    assert run.details["expected"] == ["root -> blocks.0", "blocks.0 -> blocks.2"]
    assert named_rows(run) == [("forward-prefetches", "blocks.0")]


@pytest.mark.breaks("04-forward-prefetch", "stale-order-after-change")
def test_an_order_recorded_every_iteration_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.next_iter", next_iter_forgetting_order))
    assert run.reason == "not-the-recorded-order"
    assert (run.details["observed"], run.details["expected"]) == ([], ["root -> blocks.0"])


@pytest.mark.breaks("04-forward-prefetch", "prefetch-holds-next-unit")
def test_no_prefetch_holds_nothing_extra(broken) -> None:
    run = broken(returning(f"{RU}:_get_handle_to_prefetch", None))
    assert (run.reason, run.details["prefetch"]) == ("held-differs", "with")
    assert run.details["observed"]["blocks.0"] == ["root", "blocks.0"]
    assert run.details["expected"]["blocks.0"] == ["root", "blocks.0", "blocks.1"]
    assert named_rows(run) == [("held-with-prefetch", unit) for unit in ("root", "blocks.0", "blocks.1")]


@pytest.mark.breaks("04-forward-prefetch", "prefetch-holds-next-unit")
def test_prefetching_two_ahead_holds_the_wrong_unit(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", prefetch_two_ahead))
    assert run.reason == "held-differs"
    assert run.details["observed"]["root"] == ["root", "blocks.1"]


@pytest.mark.breaks("04-forward-prefetch", "prefetch-without-backward")
def test_a_record_that_waits_for_next_iter_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", forward_target_after_next_iter))
    assert (run.reason, run.details["forward"], run.details["observed"]) == ("prefetch-order", 2, [])
    assert named_rows(run) == [("forward-prefetches", "root")]


@pytest.mark.breaks("04-forward-prefetch", "prefetch-reorders-backward")
def test_views_made_again_at_each_units_own_pre_forward_restore_the_order(broken) -> None:
    # The cause, removed: a prefetched unit's views are created anew by its own pre-forward, after the unit
    # before it computed. Backward then runs in iteration 1's order, as without forward prefetch.
    run = broken(wrapping(f"{RU}:_pre_forward_unshard", unshard_even_if_prefetched))
    assert (run.reason, run.details["prefetch"]) == ("creation-order", "with")
    assert run.details["observed"][:3] == ["views root", "views blocks.0", "output blocks.0"]


@pytest.mark.breaks("04-forward-prefetch", "prefetch-reorders-backward")
def test_a_prefetch_two_ahead_creates_views_in_another_order(broken) -> None:
    run = broken(wrapping(f"{EOD}.get_handle_to_forward_prefetch", prefetch_two_ahead))
    assert (run.reason, run.details["prefetch"]) == ("creation-order", "with")
    assert run.details["observed"][1] == "views blocks.1"


@pytest.mark.breaks("04-forward-prefetch", "prefetch-reorders-backward")
def test_units_never_freed_in_backward_are_counted(broken) -> None:
    run = broken(returning(f"{RU}:_should_free_in_backward", False))
    assert (run.reason, run.details["prefetch"]) == ("units-alive", "with")
    assert dict(run.details["observed"])["post-backward blocks.2"] == 4
    # Every moment from blocks.2's post-backward hook on holds more than the guide's row: nothing was freed.
    freed_from = ["post-backward blocks.2", "compute blocks.0", "post-backward blocks.1", "post-backward blocks.0",
                  "post-backward root"]  # fmt: skip
    assert named_rows(run) == [("backward-alive-with-prefetch", moment) for moment in freed_from]


@pytest.mark.breaks("04-forward-prefetch", "prefetch-reorders-backward")
def test_a_guide_table_without_the_reordering_fails(broken) -> None:
    run = broken(with_prefetch=block("backward-alive-without-prefetch"))
    assert (run.reason, run.details["prefetch"]) == ("table-differs-from-model", "with")
    # The first row where the model, with forward prefetch, computes blocks.1 before blocks.2's post-backward.
    assert named_rows(run) == [("backward-alive-without-prefetch", "post-backward blocks.2")]


@pytest.mark.breaks("04-forward-prefetch", "prefetch-holds-next-unit")
def test_a_prefetch_freed_during_compute_is_caught(broken) -> None:
    # blocks.1, prefetched by blocks.0, is allocated when blocks.0's compute starts and freed by its first
    # LayerNorm: blocks.1's own pre-forward then gathers it again.
    run = broken(
        wrapping(f"{RU}:_get_handle_to_prefetch", prefetch_remembered),
        wrapping("torch.nn.functional:layer_norm", layer_norm_freeing_the_prefetch),
    )
    assert (run.reason, run.details["prefetch"]) == ("held-during-compute", "with")
    assert run.details["point"] == "blocks.0 after ln_1"
    assert (run.details["observed"], run.details["expected"]) == (
        ["root", "blocks.0"],
        ["root", "blocks.0", "blocks.1"],
    )
    assert named_rows(run) == [("held-with-prefetch", "blocks.0")]
