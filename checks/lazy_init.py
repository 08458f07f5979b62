"""Checks for guide 02, root and lazy init: what FSDP decides at the first forward, not at construction."""

from __future__ import annotations

import torch

from checks.context import RankContext
from checks.gpt_fsdp import ROOT, batch, fsdp1_gpt, units

SHARED_WITH_ROOT = (  # what `_share_state_and_init_handle_attrs` hands every non-root, per the guide
    "_exec_order_data",
    "_unshard_stream",
    "_post_backward_stream",
    "_pre_unshard_stream",
    "_all_reduce_stream",
    "_default_stream",
    "_free_event_queue",
)


def _expected_roots(names: list[str]) -> dict[str, bool]:
    """The guide's rule from the module tree alone: a unit is root iff no other unit contains it."""
    return {name: name == ROOT for name in names}


def only_outermost_is_root(ctx: RankContext) -> dict[str, bool | None]:
    model = fsdp1_gpt(ctx)
    by_name = units(model)
    before = {name: unit._is_root for name, unit in by_name.items()}
    assert set(before.values()) == {None}, f"root status decided before the first forward: {before}"
    x, _ = batch(ctx)
    model(x)
    after = {name: unit._is_root for name, unit in by_name.items()}
    expected = _expected_roots(list(by_name))
    assert after == expected, f"after the first forward _is_root is {after}, expected {expected}"
    return after


def non_roots_share_root_state(ctx: RankContext) -> list[str]:
    model = fsdp1_gpt(ctx)
    by_name = units(model)
    root = by_name[ROOT]
    non_roots = [name for name in by_name if name != ROOT]

    def shared(name: str, attr: str) -> bool:
        return getattr(by_name[name], attr) is getattr(root, attr)

    # Each instance builds its own execution-order record at construction; sharing it is lazy init's work.
    assert not any(shared(name, "_exec_order_data") for name in non_roots), "shared before the first forward"
    x, _ = batch(ctx)
    model(x)
    unshared = [f"{name}.{attr}" for name in non_roots for attr in SHARED_WITH_ROOT if not shared(name, attr)]
    assert not unshared, f"non-root state that is not the root's own object after lazy init: {unshared}"
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
        assert f"Expects one homogeneous value for {attr}" in str(err), f"raised, but not about {attr}: {err}"
        return str(err)
    raise AssertionError(f"units with different {setting} ran their first forward without an error")


def padded_unsharded_size_after_first_forward(ctx: RankContext, stated: dict[str, int]) -> dict[str, int]:
    """``stated``: the sizes the guide's prose gives, checked alongside the formula."""
    model = fsdp1_gpt(ctx)
    flat_params = {name: unit._handle.flat_param for name, unit in units(model).items()}
    early = [name for name, fp in flat_params.items() if hasattr(fp, "_padded_unsharded_size")]
    assert not early, f"_padded_unsharded_size exists before the first forward on {early}"
    x, _ = batch(ctx)
    model(x)
    sizes = {}
    for name, fp in flat_params.items():
        assert hasattr(fp, "_padded_unsharded_size"), f"{name}: no _padded_unsharded_size after the first forward"
        # The all-gather destination holds one equal shard per rank.
        expected = torch.Size([ctx.world_size * fp._local_shard.numel()])
        assert fp._padded_unsharded_size == expected, f"{name}: {fp._padded_unsharded_size} != {expected}"
        sizes[name] = expected.numel()
    assert sizes == stated, f"the guide states padded unsharded sizes {stated}; this torch gives {sizes}"
    return sizes
