"""Checks for guide 02, root and lazy init: what FSDP decides at the first forward, not at construction."""

from __future__ import annotations

from typing import Any

import torch

from checks.naming import ROOT
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt, units

SHARED_WITH_ROOT = (  # what `_share_state_and_init_handle_attrs` hands every non-root, per the guide
    "_exec_order_data",
    "_unshard_stream",
    "_post_backward_stream",
    "_pre_unshard_stream",
    "_all_reduce_stream",
    "_default_stream",
    "_free_event_queue",
)


def _expected_roots(model: torch.nn.Module) -> dict[str, bool]:
    """The guide's rule from the module tree alone: a unit is root iff no other FSDP unit contains it."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    by_name = units(model)
    inside = {
        id(sub) for unit in by_name.values() for sub in unit.modules() if sub is not unit and isinstance(sub, FSDP)
    }
    return {name: id(unit) not in inside for name, unit in by_name.items()}


def only_outermost_is_root(ctx: RankContext) -> dict[str, dict[str, bool | None]]:
    model = fsdp1_gpt(ctx)
    by_name = units(model)
    before = {name: unit._is_root for name, unit in by_name.items()}
    require(set(before.values()) == {None}, "decided-early", f"root status decided before the first forward: {before}",
            observed=before)  # fmt: skip
    x, _ = batch(ctx)
    model(x)
    after = {name: unit._is_root for name, unit in by_name.items()}
    expected = _expected_roots(model)
    require_equal(after, expected, reason="wrong-root", what="_is_root after the first forward")
    return {"before": before, "after": after}


def non_roots_share_root_state(ctx: RankContext) -> list[str]:
    model = fsdp1_gpt(ctx)
    by_name = units(model)
    root = by_name[ROOT]
    non_roots = [name for name in by_name if name != ROOT]

    def shared(name: str, attr: str) -> bool:
        return getattr(by_name[name], attr) is getattr(root, attr)

    # Each instance builds its own execution-order record at construction; sharing it is lazy init's work.
    early = [name for name in non_roots if shared(name, "_exec_order_data")]
    require(not early, "shared-early", f"shared before the first forward: {early}", observed=early)
    x, _ = batch(ctx)
    model(x)
    unshared = [f"{name}.{attr}" for name in non_roots for attr in SHARED_WITH_ROOT if not shared(name, attr)]
    message = f"non-root state that is not the root's own object after lazy init: {unshared}"
    require(not unshared, "not-shared", message, observed=unshared)
    return non_roots


def mismatched_setting_raises_at_first_forward(ctx: RankContext, setting: str = "limit_all_gathers") -> str:
    """Build block 1 with ``setting`` flipped; construction must succeed and the first forward must raise."""
    default = {"limit_all_gathers": True, "use_orig_params": True}[setting]
    model = fsdp1_gpt(ctx, limit_all_gathers=True, block_kwargs=[{}, {setting: not default}, {}])
    x, _ = batch(ctx)
    try:
        model(x)
    except ValueError as err:
        attr = "_use_orig_params" if setting == "use_orig_params" else setting
        message = f"raised, but not about {attr}: {err}"
        require(f"Expects one homogeneous value for {attr}" in str(err), "raised-about-else", message, error=str(err))
        return str(err)
    raise Violation("no-error", f"units with different {setting} ran their first forward without an error")


def padded_unsharded_size_after_first_forward(ctx: RankContext, stated: dict[str, int]) -> dict[str, int]:
    """``stated``: the sizes the guide's prose gives, checked alongside the formula."""
    model = fsdp1_gpt(ctx)
    flat_params = {name: unit._handle.flat_param for name, unit in units(model).items()}
    early = [name for name, fp in flat_params.items() if hasattr(fp, "_padded_unsharded_size")]
    require(not early, "sized-early", f"_padded_unsharded_size exists before the first forward on {early}",
            observed=early)  # fmt: skip
    x, _ = batch(ctx)
    model(x)
    sizes = {}
    for name, fp in flat_params.items():
        message = f"{name}: no _padded_unsharded_size after the first forward"
        require(hasattr(fp, "_padded_unsharded_size"), "not-sized", message, unit=name)
        # The all-gather destination holds one equal shard per rank.
        expected = torch.Size([ctx.world_size * fp._local_shard.numel()])
        require_equal(list(fp._padded_unsharded_size), list(expected), reason="not-shards-times-ranks", what=name)
        sizes[name] = expected.numel()
    require_equal(sizes, stated, reason="differs-from-guide", what="padded unsharded sizes (the guide states them)")
    return sizes


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------


def shard_then_size_eagerly(original: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
    """``FlatParamHandle.shard`` that also sets ``_padded_unsharded_size`` at construction, as an eager
    implementation would."""
    result = original(handle, *args, **kwargs)
    flat_param = handle.flat_param
    flat_param._padded_unsharded_size = torch.Size([flat_param.numel() * handle.world_size])
    return result


def share_but_forget_roles(original: Any, root_state: Any, root_module: Any) -> None:
    """Share state as usual, then leave the non-roots' ``_is_root`` undecided, so each decides for itself."""
    original(root_state, root_module)
    for state in root_state._all_fsdp_states:
        if state is not root_state:
            state._is_root = None


def share_copies_not_objects(original: Any, root_state: Any, root_module: Any) -> None:
    """Share state as usual, then give each non-root an equal copy of the root's execution-order record and
    free-event queue instead of the object itself."""
    import copy

    original(root_state, root_module)
    for state in root_state._all_fsdp_states:
        if state is not root_state:
            state._exec_order_data = copy.copy(root_state._exec_order_data)
            state._free_event_queue = copy.copy(root_state._free_event_queue)


def crown_after_forward(original: Any, state: Any, *args: Any, victim: str = "blocks.1") -> Any:
    """``_post_forward`` that, once the root's forward is done, tells one non-root it is root (the lazy init
    itself ran normally, so the forward succeeds and only the roles are wrong)."""
    output = original(state, *args)
    if state._is_root:
        units(state)[victim]._is_root = True
    return output
