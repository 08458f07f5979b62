"""Guide 02: break lazy init and watch its claims fail."""

import pytest

from checks.breakers import wrapping
from checks.protocol import Patch

RU = "torch.distributed.fsdp._runtime_utils"
SHARE = f"{RU}:_share_state_and_init_handle_attrs"


@pytest.mark.breaks("02-root-and-lazy-init", "only-outermost-is-root")
def test_undecided_non_roots_make_themselves_root(broken) -> None:
    # Nobody tells the blocks they are not root, so each one's own _lazy_init claims the role.
    run = broken(wrapping(SHARE, "share_but_forget_roles"))
    assert "after the first forward _is_root is" in run.failure
    assert "'blocks.0': True" in run.failure


@pytest.mark.breaks("02-root-and-lazy-init", "non-roots-share-root-state")
def test_equal_copies_are_not_sharing(broken) -> None:
    run = broken(wrapping(SHARE, "share_copies_not_objects"))
    assert "non-root state that is not the root's own object" in run.failure
    assert "blocks.2._exec_order_data" in run.failure and "blocks.2._free_event_queue" in run.failure
    assert "blocks.2._unshard_stream" not in run.failure  # the streams were still shared: only copies are named


@pytest.mark.breaks("02-root-and-lazy-init", "mismatched-limit-all-gathers-raises")
def test_without_homogeneity_check_limit_all_gathers_mismatch_runs(broken) -> None:
    run = broken(Patch(f"{RU}:HOMOGENEOUS_ATTR_NAMES", "checks.sabotage:value", {"value": ()}))
    assert "units with different limit_all_gathers ran their first forward without an error" in run.failure


@pytest.mark.breaks("02-root-and-lazy-init", "mismatched-use-orig-params-raises")
def test_without_orig_params_in_the_list_the_mismatch_goes_unnoticed(broken) -> None:
    # Drop only _use_orig_params from the list: a forward with mixed settings then runs, and the check says so.
    names = ("limit_all_gathers", "_use_full_prec_in_eval")
    run = broken(Patch(f"{RU}:HOMOGENEOUS_ATTR_NAMES", "checks.sabotage:value", {"value": names}))
    assert "units with different use_orig_params ran their first forward without an error" in run.failure


@pytest.mark.breaks("02-root-and-lazy-init", "padded-size-after-first-forward")
def test_eager_padded_size_is_caught_before_the_first_forward(broken) -> None:
    run = broken(wrapping("torch.distributed.fsdp._flat_param:FlatParamHandle.shard", "shard_then_size_eagerly"))
    assert "_padded_unsharded_size exists before the first forward" in run.failure


@pytest.mark.breaks("02-root-and-lazy-init", "padded-size-after-first-forward")
def test_prose_numbers_are_checked(broken) -> None:
    # The guide's stated sizes are part of the claim: a wrong number in the prose fails it.
    run = broken(stated={"root": 3528, "blocks.0": 16020, "blocks.1": 16020, "blocks.2": 16021})
    assert "the guide states padded unsharded sizes" in run.failure
