"""Guide 01: bend the step and watch the step map's claims fail."""

import pytest

from checks.breakit.patches import returning, wrapping
from checks.guides.g01_step_map import (
    finalize_keeping_hook_state,
    finalize_without_removing_hook,
    forward_on_rank_0s_rows,
    forward_registering_hooks,
    register_post_backward_hook_every_forward,
    reshard_twice_on_rank_1,
)
from checks.guides.g03_unshard_reshard import reshard_everything
from tests.break_it.conftest import named_rows

RU = "torch.distributed.fsdp._runtime_utils"
FSDP_FORWARD = "torch.distributed.fsdp.fully_sharded_data_parallel:FullyShardedDataParallel.forward"


@pytest.mark.breaks("01-step-map", "one-step-timeline")
def test_no_backward_prefetch_changes_the_timeline(broken) -> None:
    run = broken(returning(f"{RU}:_get_handle_to_prefetch", None))
    assert run.reason == "timeline-differs"
    expected, observed = run.details["expected"], run.details["observed"]
    assert "backward root prefetch blocks.2 (all-gather)" in expected and not any("prefetch" in o for o in observed)
    # The first row the step without prefetch makes false: the root's pre-backward hook prefetches nothing.
    assert named_rows(run) == [("step", "backward  root      prefetch blocks.2 (all-gather)")]


@pytest.mark.breaks("01-step-map", "one-step-timeline")
def test_freeing_the_root_after_forward_changes_the_timeline(broken) -> None:
    # Free every unit after forward, the root included: the root's backward unshard must all-gather again.
    run = broken(wrapping(f"{RU}:_post_forward_reshard", reshard_everything))
    assert run.reason == "timeline-differs"
    assert "forward root reshard, free" in run.details["observed"]
    assert "forward root reshard, free" not in run.details["expected"]
    assert named_rows(run) == [("step", "forward   root      reshard, keep")]


@pytest.mark.breaks("01-step-map", "same-on-every-rank")
def test_rank_dependent_resharding_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_forward_reshard", reshard_twice_on_rank_1))
    assert run.reason == "differs-between-ranks"
    assert run.details == {"what": "the FSDP event sequence", "differing": [1]}


@pytest.mark.breaks("01-step-map", "forward-is-called-not-hooked")
def test_a_forward_that_registers_hooks_is_caught(broken) -> None:
    run = broken(wrapping(FSDP_FORWARD, forward_registering_hooks))
    assert (run.reason, run.details) == ("registration-ran", {"ran": ["_register_pre_forward_hook"]})


@pytest.mark.breaks("01-step-map", "forward-is-called-not-hooked")
def test_a_caller_in_the_torch_tree_is_caught(broken, tmp_path) -> None:
    # The static half of the claim: a fake torch tree whose module calls a registration helper.
    fake = tmp_path / "torch" / "distributed" / "fsdp"
    fake.mkdir(parents=True)
    (fake / "_composable_again.py").write_text(
        "def attach(state, module):\n    _register_pre_forward_hook(state, module)\n"
    )
    run = broken(torch_root=str(tmp_path / "torch"))
    assert run.reason == "registration-has-callers"
    [caller] = run.details["callers"]
    assert caller.startswith("torch/distributed/fsdp/_composable_again.py:2:")


@pytest.mark.breaks("01-step-map", "post-backward-hook-per-iteration")
def test_hook_state_left_behind_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_finalize_params", finalize_keeping_hook_state))
    assert run.reason == "hook-lifetime"
    assert run.details == {"moment": "after backward 1", "observed": [True, True, True, True]}


@pytest.mark.breaks("01-step-map", "same-on-every-rank-at-4")
def test_rank_dependent_resharding_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_forward_reshard", reshard_twice_on_rank_1))
    assert run.reason == "differs-between-ranks"
    assert run.details["differing"] == [1]


@pytest.mark.breaks("01-step-map", "post-backward-hook-per-iteration")
def test_a_hook_left_registered_is_caught(broken) -> None:
    # The attribute goes, the hook stays on the AccumulateGrad node: iteration 2 runs two post-backward hooks.
    run = broken(wrapping(f"{RU}:_finalize_params", finalize_without_removing_hook))
    assert run.reason == "hook-not-removed"
    assert run.details["moment"] == "after backward 1" and run.details["observed"] == [1, 1, 1, 1]


@pytest.mark.breaks("01-step-map", "post-backward-hook-per-iteration")
def test_a_hook_registered_at_every_forward_is_caught(broken) -> None:
    # Two forwards before one backward: the second registers a hook of its own instead of keeping the first's.
    run = broken(wrapping(f"{RU}:_register_post_backward_hook", register_post_backward_hook_every_forward))
    assert run.reason == "hook-not-from-first-forward"
    assert run.details["moment"] == "after forward 2 of iteration 2" and run.details["observed"] == [2, 2, 2, 2]


@pytest.mark.breaks("01-step-map", "same-on-every-rank")
def test_ranks_on_the_same_rows_are_caught(broken) -> None:
    run = broken(wrapping(FSDP_FORWARD, forward_on_rank_0s_rows))
    assert (run.reason, run.details) == ("same-data-on-ranks", {"repeats": [1]})
