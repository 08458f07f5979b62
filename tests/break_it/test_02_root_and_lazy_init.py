"""Guide 02: break lazy init and watch its claims fail."""

import pytest

from checks.breakit.patches import set_to, wrapping
from checks.guides.g02_root_and_lazy_init import (
    crown_after_forward,
    shard_then_size_eagerly,
    share_but_forget_roles,
    share_copies_not_objects,
)

RU = "torch.distributed.fsdp._runtime_utils"
SHARE = f"{RU}:_share_state_and_init_handle_attrs"


@pytest.mark.breaks("02-root-and-lazy-init", "only-outermost-is-root")
def test_undecided_non_roots_make_themselves_root(broken) -> None:
    # Nobody tells the blocks they are not root, so each one's own _lazy_init claims the role.
    run = broken(wrapping(SHARE, share_but_forget_roles))
    assert run.reason == "wrong-root"
    assert run.details["observed"] == {"root": True, "blocks.0": True, "blocks.1": True, "blocks.2": True}


@pytest.mark.breaks("02-root-and-lazy-init", "only-outermost-is-root")
def test_a_non_root_told_it_is_root_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_post_forward", crown_after_forward))
    assert run.reason == "wrong-root"
    assert run.details["observed"]["blocks.1"] is True and run.details["expected"]["blocks.1"] is False


@pytest.mark.breaks("02-root-and-lazy-init", "non-roots-share-root-state")
def test_equal_copies_are_not_sharing(broken) -> None:
    run = broken(wrapping(SHARE, share_copies_not_objects))
    assert run.reason == "not-shared"
    # Only the copies are named: the streams were still shared.
    expected = [f"blocks.{i}.{attr}" for i in range(3) for attr in ("_exec_order_data", "_free_event_queue")]
    assert run.details["observed"] == expected


@pytest.mark.breaks("02-root-and-lazy-init", "mismatched-limit-all-gathers-raises")
def test_without_homogeneity_check_limit_all_gathers_mismatch_runs(broken) -> None:
    run = broken(set_to(f"{RU}:HOMOGENEOUS_ATTR_NAMES", ()))
    assert run.reason == "no-error"


@pytest.mark.breaks("02-root-and-lazy-init", "mismatched-use-orig-params-raises")
def test_without_orig_params_in_the_list_the_mismatch_goes_unnoticed(broken) -> None:
    # Drop only _use_orig_params from the list: a forward with mixed settings then runs, and the check says so.
    run = broken(set_to(f"{RU}:HOMOGENEOUS_ATTR_NAMES", ("limit_all_gathers", "_use_full_prec_in_eval")))
    assert run.reason == "no-error"


@pytest.mark.breaks("02-root-and-lazy-init", "padded-size-after-first-forward")
def test_eager_padded_size_is_caught_before_the_first_forward(broken) -> None:
    run = broken(wrapping("torch.distributed.fsdp._flat_param:FlatParamHandle.shard", shard_then_size_eagerly))
    assert run.reason == "sized-early"
    assert run.details["observed"] == ["root", "blocks.0", "blocks.1", "blocks.2"]


@pytest.mark.breaks("02-root-and-lazy-init", "padded-size-after-first-forward")
def test_prose_numbers_are_checked(broken) -> None:
    # The guide's stated sizes are part of the claim: a wrong number in the prose fails it.
    wrong = {"root": 3528, "blocks.0": 16020, "blocks.1": 16020, "blocks.2": 16021}
    run = broken(stated=wrong)
    assert run.reason == "differs-from-guide"
    assert run.details["expected"] == wrong and run.details["observed"]["blocks.2"] == 16020


@pytest.mark.breaks("02-root-and-lazy-init", "padded-size-after-first-forward-at-4")
def test_eager_padded_size_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping("torch.distributed.fsdp._flat_param:FlatParamHandle.shard", shard_then_size_eagerly))
    assert run.reason == "sized-early"
