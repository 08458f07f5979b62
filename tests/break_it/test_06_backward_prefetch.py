"""Guide 06: bend backward prefetch and watch its claims fail: a prefetch issued too late, from the wrong
hook, before the free, to the wrong unit, missing or extra; a record that grows otherwise; collectives issued in
another order."""

import pytest

from checks.breakit.patches import returning, wrapping
from checks.guides.g06_backward_prefetch.recipes import (
    candidate_always_needed,
    hold_pre_backward_prefetch,
    issue_held_prefetch,
    keep_then_prefetch,
    next_iter_keeping_order,
    post_prefetch_after_reduce,
    pre_even_with_none,
    prefetch_before_free,
    prefetch_two_back,
    record_first_use_only,
    record_with_is_not_none,
    reshard_without_prefetch,
    wrap_around_needed,
    wrap_around_to_last,
)
from tests.break_it.conftest import named_rows

RU = "torch.distributed.fsdp._runtime_utils"
EOU = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"
TARGET = f"{EOU}.get_handle_to_backward_prefetch"
TWO_BACK = wrapping(TARGET, prefetch_two_back)
NO_CANDIDATE = returning(TARGET, None)
# The units-alive table's rows.
MOMENTS = [
    "compute root", "compute blocks.2", "post-backward blocks.2", "compute blocks.1", "post-backward blocks.1",
    "compute blocks.0", "post-backward blocks.0", "post-backward root",
]  # fmt: skip
HELD_UNTIL_AFTER_COMPUTE = (
    wrapping(f"{RU}:_prefetch_handle", hold_pre_backward_prefetch),
    wrapping(f"{RU}:_post_backward_hook", issue_held_prefetch),
)


@pytest.mark.breaks("06-backward-prefetch", "pre-prefetches-reverse-post-forward")
def test_a_pre_backward_prefetch_issued_after_the_compute_is_caught(broken) -> None:
    run = broken(*HELD_UNTIL_AFTER_COMPUTE)
    assert run.reason == "prefetch-after-compute"
    assert (run.details["issuer"], run.details["target"]) == ("blocks.2", "blocks.1")
    assert run.details["compute"] < run.details["prefetch"] < run.details["post_backward"]


@pytest.mark.breaks("06-backward-prefetch", "pre-prefetches-reverse-post-forward")
def test_prefetching_two_units_back_is_caught(broken) -> None:
    run = broken(TWO_BACK)
    assert run.reason == "prefetch-order"
    assert run.details["observed"] == ["root→blocks.1", "blocks.2→blocks.0"]
    assert named_rows(run) == [("pre-prefetches", "root")]


@pytest.mark.breaks("06-backward-prefetch", "pre-prefetches-reverse-post-forward")
def test_a_missing_prefetch_is_caught(broken) -> None:
    run = broken(NO_CANDIDATE)
    assert (run.reason, run.details["observed"]) == ("prefetch-order", [])


@pytest.mark.breaks("06-backward-prefetch", "post-prefetches-after-free")
def test_a_post_backward_prefetch_before_the_free_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_backward_reshard", prefetch_before_free))
    assert run.reason == "prefetch-before-free"
    assert run.details["issuer"] == "blocks.2" and run.details["prefetch"] < run.details["free"]


@pytest.mark.breaks("06-backward-prefetch", "post-prefetches-after-free")
def test_a_post_backward_that_never_frees_is_caught(broken) -> None:
    """The old check read a missing free as tick 0, so "free before prefetch" held with no free at all: this
    patch, which keeps every unit's unsharded parameters and prefetches all the same, passed it."""
    run = broken(wrapping(f"{RU}:_post_backward_reshard", keep_then_prefetch))
    assert (run.reason, run.details["kind"], run.details["unit"]) == ("missing-event", "free", "blocks.2")


@pytest.mark.breaks("06-backward-prefetch", "post-prefetches-after-free")
def test_an_extra_prefetch_is_caught(broken) -> None:
    run = broken(wrapping(TARGET, wrap_around_needed))
    assert run.reason == "prefetch-order"
    assert run.details["observed"] == ["blocks.2→blocks.1", "blocks.1→blocks.0", "blocks.0→root"]
    assert named_rows(run) == [("post-prefetches", "blocks.1")]  # the last row: the extra one comes after it


@pytest.mark.breaks("06-backward-prefetch", "post-prefetches-after-free")
def test_taking_the_roots_candidate_at_the_end_is_refused_by_torch(broken) -> None:
    # What pytorch#108190 lists as torch's order: the root's post-backward unshards blocks.2 after all. blocks.2's
    # gradient is reduced by then, and torch itself fails in `_use_unsharded_views` before the check can compare.
    run = broken(wrapping(TARGET, candidate_always_needed))
    assert run.reason is None and run.error_types == {"builtins.AttributeError"}
    assert all("'NoneType' object has no attribute 'data'" in r.message for r in run.failed)


@pytest.mark.breaks("06-backward-prefetch", "post-prefetches-after-free")
def test_a_different_candidate_is_caught_even_when_no_prefetch_changes(broken) -> None:
    run = broken(wrapping(TARGET, wrap_around_to_last))
    assert run.reason == "candidates-differ"
    assert run.details["observed"][2] == ["blocks.0", "root", "unsharded already"]
    assert named_rows(run) == [("post-candidates", "blocks.0")]


@pytest.mark.breaks("06-backward-prefetch", "post-prefetches-after-free")
def test_no_post_backward_prefetch_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_backward_reshard", reshard_without_prefetch))
    assert (run.reason, run.details["observed"]) == ("prefetch-order", [])


@pytest.mark.breaks("06-backward-prefetch", "none-prefetches-nothing")
def test_none_that_prefetches_is_caught(broken) -> None:
    run = broken(
        wrapping("torch.distributed.fsdp.fully_sharded_data_parallel:_init_prefetching_state", pre_even_with_none)
    )
    assert run.reason == "prefetched-with-none"
    assert run.details["observed"] == ["root→blocks.2", "blocks.2→blocks.1", "blocks.1→blocks.0"]


@pytest.mark.breaks("06-backward-prefetch", "none-prefetches-nothing")
def test_a_setting_that_never_prefetches_is_not_taken_for_none(broken) -> None:
    # The control run: if nothing prefetches under BACKWARD_PRE either, None's silence proves nothing.
    run = broken(NO_CANDIDATE)
    assert run.reason == "never-prefetched"


@pytest.mark.breaks("06-backward-prefetch", "model-predicts-gpt")
def test_the_model_catches_prefetching_two_back(broken) -> None:
    run = broken(TWO_BACK)
    assert (run.reason, run.details["mode"]) == ("sequence-differs", "BACKWARD_PRE")
    assert run.details["observed"][1] == "prefetch root→blocks.1"


@pytest.mark.breaks("06-backward-prefetch", "model-predicts-gpt")
def test_the_model_catches_a_late_pre_backward_prefetch(broken) -> None:
    run = broken(*HELD_UNTIL_AFTER_COMPUTE)
    assert (run.reason, run.details["mode"]) == ("sequence-differs", "BACKWARD_PRE")
    assert run.details["first"] == 1  # root's prefetch is gone from right after its pre_backward


@pytest.mark.breaks("06-backward-prefetch", "model-predicts-toy")
def test_the_model_catches_a_missing_post_backward_prefetch_on_the_toy(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_backward_reshard", reshard_without_prefetch))
    assert (run.reason, run.details["mode"]) == ("sequence-differs", "BACKWARD_POST")
    assert "prefetch 1→0" in run.details["expected"] and "prefetch 1→0" not in run.details["observed"]


@pytest.mark.breaks("06-backward-prefetch", "model-predicts-toy")
def test_the_model_catches_an_extra_prefetch_on_the_toy(broken) -> None:
    run = broken(wrapping(TARGET, candidate_always_needed))
    assert (run.reason, run.details["mode"]) == ("sequence-differs", "BACKWARD_POST")
    assert run.details["observed"][-1] == "prefetch root→1"


@pytest.mark.breaks("06-backward-prefetch", "model-predicts-nested")
def test_the_model_catches_prefetching_two_back_in_nested_units(broken) -> None:
    run = broken(TWO_BACK)
    assert (run.reason, run.details["mode"]) == ("sequence-differs", "BACKWARD_PRE")
    assert run.details["observed"][1] == "prefetch root→outers.1.inner.1"


@pytest.mark.breaks("06-backward-prefetch", "model-predicts-nested")
def test_the_model_catches_a_missing_post_backward_prefetch_in_nested_units(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_backward_reshard", reshard_without_prefetch))
    assert (run.reason, run.details["mode"]) == ("sequence-differs", "BACKWARD_POST")
    assert "prefetch outers.1.inner.0→outers.0" in run.details["expected"]
    assert "prefetch outers.1.inner.0→outers.0" not in run.details["observed"]


@pytest.mark.breaks("06-backward-prefetch", "units-alive")
def test_units_never_freed_in_backward_are_caught(broken) -> None:
    run = broken(returning(f"{RU}:_should_free_in_backward", False))
    assert (run.reason, run.details["mode"]) == ("units-alive", "BACKWARD_PRE")
    assert run.details["observed"]["post-backward blocks.2"] == 3
    # Every row from blocks.2's post-backward hook on: nothing is freed, so each later moment holds more.
    rows = named_rows(run)
    assert rows == [("units-alive", moment) for moment in MOMENTS[MOMENTS.index("post-backward blocks.2") :]]


@pytest.mark.breaks("06-backward-prefetch", "units-alive")
def test_a_prefetch_two_back_holds_four_units(broken) -> None:
    run = broken(TWO_BACK)
    assert (run.reason, run.details["mode"]) == ("units-alive", "BACKWARD_PRE")
    assert run.details["observed"]["compute blocks.2"] == 4
    # blocks.0, prefetched two back by the root, is held while blocks.2 computes and until its post-backward hook.
    assert named_rows(run) == [("units-alive", "compute blocks.2"), ("units-alive", "post-backward blocks.2")]


@pytest.mark.breaks("06-backward-prefetch", "collective-order")
def test_a_post_backward_prefetch_after_the_reduce_scatter_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_backward_hook", post_prefetch_after_reduce))
    assert (run.reason, run.details["mode"]) == ("collective-order", "BACKWARD_POST")
    assert run.details["observed"] == "AG RS AG RS AG RS RS"
    assert named_rows(run) == [("collective-order", "BACKWARD_POST")]


@pytest.mark.breaks("06-backward-prefetch", "collective-order")
def test_no_prefetch_reorders_the_collectives(broken) -> None:
    run = broken(NO_CANDIDATE)
    assert (run.reason, run.details["mode"]) == ("collective-order", "BACKWARD_PRE")
    assert run.details["observed"] == "AG RS AG RS AG RS RS"


@pytest.mark.breaks("06-backward-prefetch", "first-unit-reused")
def test_an_is_not_none_record_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOU}.record_post_forward", record_with_is_not_none))
    assert (run.reason, run.details["scenario"]) == ("record-differs", "first unit reused")
    assert run.details["observed"]["index"]["blocks.0"] == 0 and run.details["expected"]["index"]["blocks.0"] == 2


@pytest.mark.breaks("06-backward-prefetch", "first-unit-reused")
def test_a_record_of_first_uses_only_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOU}.record_post_forward", record_first_use_only))
    assert run.reason == "record-differs"
    assert run.details["observed"]["record"] == ["blocks.0", "blocks.1", "blocks.2", "root"]


@pytest.mark.breaks("06-backward-prefetch", "eval-record-grows")
def test_a_record_that_does_not_grow_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOU}.record_post_forward", record_first_use_only))
    assert run.reason == "record-length"
    assert (run.details["observed"], run.details["expected"]) == (4, 8)
    assert named_rows(run) == [("eval-record-lengths", "2")]


@pytest.mark.breaks("06-backward-prefetch", "eval-record-grows")
def test_a_record_a_training_step_does_not_clear_is_caught(broken) -> None:
    run = broken(wrapping(f"{EOU}.next_iter", next_iter_keeping_order))
    assert (run.reason, run.details["observed"]) == ("not-cleared", 24)
