"""Guide 07: bend the pre-backward hook and watch its claims fail: hooks on the wrong outputs, a guard that lets
calls through, the final callback queued twice, never, or queued and never run."""

from dataclasses import replace

import pytest

from checks.breakit.patches import skipping, wrapping
from checks.guides.g07_pre_backward.recipes import (
    any_unit_queues,
    hook_every_float_output,
    hook_first_output_only,
    hook_twice,
    mark_every_unit_for_unshard,
    queue_twice,
    remember_root,
    root_forgets_it_queued,
    without_guard,
    without_guard_or_state_check,
)
from tests.break_it.conftest import guides, named_rows

RU = "torch.distributed.fsdp._runtime_utils"
PREPARE = "torch.distributed.fsdp._flat_param:FlatParamHandle.prepare_gradient_for_backward"
STATE_CHECK = "expected to be in states [<TrainingState.IDLE: 1>] but current state is TrainingState.FORWARD_BACKWARD"


@pytest.mark.breaks("07-pre-backward", "once-per-handle-per-backward")
def test_two_hooks_per_output_are_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_register_pre_backward_hooks", hook_twice))
    assert run.reason == "pre-backward-calls"
    assert run.details["observed"] == {"root": 4, "mixed": 2, "pair": 4, "frozen": 0}
    assert named_rows(run) == [("pre-backward-calls", unit) for unit in ("root", "mixed", "pair")]


@pytest.mark.breaks("07-pre-backward", "once-per-handle-per-backward")
def test_a_guard_that_lets_every_call_through_is_caught(broken) -> None:
    # The guard dropped and the unit put back to IDLE before each call, so the state check lets it through too.
    run = broken(wrapping(f"{RU}:_pre_backward_hook", without_guard_or_state_check))
    assert run.reason == "pre-backward-work"
    assert run.details["observed"]["pair"] == [True, True] and run.details["expected"]["pair"] == [True, False]
    assert named_rows(run) == [("pre-backward-calls", "root"), ("pre-backward-calls", "pair")]  # two calls each


@pytest.mark.breaks("07-pre-backward", "once-per-handle-per-backward")
def test_the_order_of_the_calls_is_the_blocks_row_order(broken) -> None:
    # The expect block's rows are in call order: the same counts listed with `pair` before `mixed` (as if autograd
    # reached `pair` first) fail on the order alone, however the run went.
    block = guides()["07-pre-backward"].expect_blocks()["pre-backward-calls"].expected
    root, mixed, pair, frozen = block.rows
    run = broken(expected=replace(block, rows=(root, pair, mixed, frozen)))
    assert run.reason == "pre-backward-order"
    assert run.details["observed"] == ["root", "root", "mixed", "pair", "pair"]
    assert run.details["expected"] == ["root", "root", "pair", "pair", "mixed"]
    assert named_rows(run) == [("pre-backward-calls", "pair")]  # the third call was not `pair`'s


@pytest.mark.breaks("07-pre-backward", "once-per-handle-per-backward")
def test_a_dropped_guard_is_refused_by_the_state_check(broken) -> None:
    # The guard alone dropped: the second call of a unit reaches `_assert_in_training_states` and torch raises.
    run = broken(wrapping(f"{RU}:_pre_backward_hook", without_guard))
    assert run.reason is None and run.error_types == {"builtins.ValueError"}
    assert all(STATE_CHECK in r.message for r in run.failed)


@pytest.mark.breaks("07-pre-backward", "once-per-handle-per-backward")
def test_a_hook_that_skips_the_gradient_preparation_is_caught(broken) -> None:
    run = broken(skipping(PREPARE))
    assert run.reason == "per-handle-work"
    assert run.details["observed"]["pair"] == [False, False] and run.details["expected"]["pair"] == [True, False]


@pytest.mark.breaks("07-pre-backward", "hooked-where-grad-is-required")
def test_hooks_on_outputs_that_require_no_grad_are_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_register_pre_backward_hooks", hook_every_float_output))
    assert run.reason == "hooked-outputs"
    observed = run.details["observed"]
    # Only the integer argmax escapes: torch cannot make it require grad.
    assert observed["mixed"] == ["hooked", "hooked", "none", "hooked"] and observed["frozen"] == ["hooked"]
    assert named_rows(run) == [("hooked-outputs", "mixed"), ("hooked-outputs", "frozen")]


@pytest.mark.breaks("07-pre-backward", "hooked-where-grad-is-required")
def test_a_hook_on_the_first_output_only_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_register_pre_backward_hooks", hook_first_output_only))
    assert run.reason == "hooked-outputs"
    assert run.details["observed"]["pair"] == ["hooked", "none"] and run.details["observed"]["root"][1] == "none"
    assert named_rows(run) == [("hooked-outputs", "root"), ("hooked-outputs", "pair")]


@pytest.mark.breaks("07-pre-backward", "hooked-where-grad-is-required")
def test_a_unit_marked_for_unshard_without_hooked_outputs_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_register_pre_backward_hooks", mark_every_unit_for_unshard))
    assert run.reason == "needs-unshard-flag"
    assert run.details["observed"]["frozen"] is True and run.details["expected"]["frozen"] is False
    assert named_rows(run) == [("hooked-outputs", "frozen")]


@pytest.mark.breaks("07-pre-backward", "root-queues-once")
def test_a_callback_queued_twice_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_register_post_backward_final_callback", queue_twice))
    assert run.reason == "queue-callback-calls"
    assert (run.details["observed"], run.details["final_callback_runs"]) == (2, 2)


@pytest.mark.breaks("07-pre-backward", "root-queues-once")
def test_a_callback_never_queued_is_caught(broken) -> None:
    run = broken(skipping(f"{RU}:_register_post_backward_final_callback"))
    assert run.reason == "queue-callback-calls"
    # Nothing queued, so the final callback never runs: the flags it resets stay set.
    assert (run.details["observed"], run.details["final_callback_runs"]) == (0, 0)


@pytest.mark.breaks("07-pre-backward", "root-queues-once")
def test_a_queued_callback_that_never_runs_is_caught(broken) -> None:
    run = broken(skipping(f"{RU}:_post_backward_final_callback"))
    assert run.reason == "final-callback-runs"
    assert (run.details["observed"], run.details["queue_callback"]) == (0, 1)


@pytest.mark.breaks("07-pre-backward", "root-queues-once")
def test_a_root_that_forgets_it_queued_is_caught(broken) -> None:
    # With parameters, the guard stops the root's second call before it can queue again, but the flag it cleared
    # stays cleared: the final callback starts with it False.
    run = broken(wrapping(f"{RU}:_pre_backward_hook", root_forgets_it_queued))
    assert (run.reason, run.details["variant"]) == ("queued-flag", "with parameters")
    assert run.details["observed"]["in callback"] == [False]


@pytest.mark.breaks("07-pre-backward", "root-queues-once")
def test_a_root_without_a_handle_that_forgets_it_queued_is_refused_by_torch(broken) -> None:
    # Without a handle there is no guard: the second call tries to queue again, and the IDLE check in the
    # registration raises.
    run = broken(wrapping(f"{RU}:_pre_backward_hook", root_forgets_it_queued, without_handle_only=True))
    assert run.reason is None and run.error_types == {"builtins.ValueError"}
    assert all(STATE_CHECK in r.message for r in run.failed)
    assert all("_register_post_backward_final_callback" in (r.error or "") for r in run.failed)


@pytest.mark.breaks("07-pre-backward", "no-callback-without-root-output")
def test_a_callback_queued_from_a_child_unit_is_caught(broken) -> None:
    # If any unit's hook queued the root's callback, a loss that skips the root's outputs would still get one.
    run = broken(
        wrapping(f"{RU}:_register_pre_backward_hooks", remember_root),
        wrapping(f"{RU}:_pre_backward_hook", any_unit_queues),
    )
    assert run.reason == "queue-callback-calls"
    assert (run.details["observed"], run.details["final_callback_runs"]) == (1, 1)
