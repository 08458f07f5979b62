"""Weights and modules that two units share, found before anything runs: which strategies cannot take them, and
what to do instead. Torch-free: reads the wrap model's tree and units (`checks.models.wrap`).

- A *split tie*: one tensor registered in two units (an embedding and an output head tied across units,
  `wm.SplitTie`). FSDP1 flattens it in the unit built first; under a sharded strategy the other unit's module
  then reads a 1-D shard of it (``use_orig_params=True``), and its forward fails (``size mismatch``). FSDP2's
  ``fully_shard`` refuses a parameter another group manages (``_fsdp_init.py``: "is shared with a parameter
  already managed by another FSDP group"). The reference ZeRO-3 frees the holder's buffer after the holder's
  forward, and the other module reads freed storage. NO_SHARD keeps every flat parameter whole, the reference
  ZeRO-1 and 2 keep whole parameters, and DDP has no units: those take it.
- An *alias*: one module object registered under two names (T5's ``shared`` and ``encoder.embed_tokens``). FSDP1's
  ``_post_order_apply`` (``fsdp/wrap.py``) visits it once and replaces the attribute where it met it first; the
  other name still holds the unwrapped module. When that module is a unit or holds one, calls through the other
  name run on sharded or resharded parameters: every FSDP1 strategy is refused (NO_SHARD runs, with wrong
  gradients). FSDP2 changes the module object itself, so both names call the sharded module.
"""

from __future__ import annotations

from checks.inspect.reach import Refusal
from checks.models import wrap as wm
from checks.naming import ROOT

SHARDS_TIED = ("full-shard", "shard-grad-op", "fsdp2", "fsdp2-default", "fsdp2-no-reshard", "zero3")
FSDP1 = ("full-shard", "shard-grad-op", "no-shard")
WHY_TIES_BREAK = {
    "fsdp1": "FSDP1 flattens it in the first unit built, and under a sharded strategy the other unit's module "
    "reads a 1-D shard of it",
    "zero3": "the reference ZeRO-3 frees the holder's buffer after its forward, and the other module reads it later",
    **dict.fromkeys(("fsdp2", "fsdp2-default", "fsdp2-no-reshard"), "fully_shard refuses a parameter another "
                    "call already sharded (it takes fully_shard([a, b]), one group for both)"),
}  # fmt: skip


def refusal(tree: wm.Module, wrap: wm.Wrap, strategy: str) -> Refusal | None:
    """Why ``strategy`` cannot take the weights and modules ``wrap``'s units share, with what to do; or None."""
    if strategy in FSDP1 and (alias := _wrapped_alias(tree, wrap)):
        path, first, unit = alias
        where = "at" if unit == first else "inside"
        return Refusal("module-under-two-names", f"{path} is the module {first} registered a second time, and "
                       f"{unit or ROOT} is an FSDP1 unit {where} {first}: FSDP1 replaces the attribute where it "
                       f"meets the module first ({first}), so calls through {path} run the unwrapped module on "
                       "flattened parameters. Call it under one name, wrap a module that holds both names, or "
                       "use fsdp2, which changes the module object itself")  # fmt: skip
    # A tie through an alias is one module object: its hooks are the first registration's, so only FSDP1's
    # attribute replacement (above) cares.
    aliased = {path for path, module in wm.walk(tree) if module.alias_of is not None}
    ties = [t for t in wrap.split_ties if any(fqn.rpartition(".")[0] not in aliased for fqn in t.outside)]
    if strategy in SHARDS_TIED and ties:
        tie = ties[0]
        outside = ", ".join(tie.outside)
        why = WHY_TIES_BREAK.get(strategy, WHY_TIES_BREAK["fsdp1"])
        return Refusal("tied-across-units", f"{tie.tensor} is one tensor in two units: flattened by "
                       f"{tie.holder or ROOT} and also registered as {outside} in another unit; {why}. Keep both "
                       "in one unit: drop the class of one of them from --wrap so that they stay in a unit that "
                       "holds both (the root), or use no-shard, zero1, zero2, ddp or torch-zero")  # fmt: skip
    return None


def _wrapped_alias(tree: wm.Module, wrap: wm.Wrap) -> tuple[str, str, str] | None:
    """(alias path, first path, unit) for the first alias whose module is a unit or holds one."""
    units = [u.path for u in wrap.units if u.path]
    aliased = {path for path, module in wm.walk(tree) if module.alias_of is not None}
    for path, module in wm.walk(tree):
        if module.alias_of is None or path.rpartition(".")[0] in aliased:
            continue  # report the top of an aliased subtree only
        first = module.alias_of
        for unit in units:
            if wm.within(unit, first):
                return path, first, unit
    return None
