"""FSDP2's step as guide 22 writes it: one row per hook that autograd, ``nn.Module`` or the engine called, with
the FSDP functions it called that did something, in order.

The recorder (`checks.probes.call_tree`) watches the functions below. What a row lists, per call:

- a function is listed when it did something: ``_root_pre_forward`` when no state had claimed the iteration yet,
  ``_lazy_init`` when the root was not yet chosen, ``pre_backward`` when its group was not in pre-backward
  already, ``_register_root_post_backward_final_callback`` when the callback was not queued yet (listed as
  ``queue final callback``), ``_register_post_backward_hook`` when an input needs a gradient;
- ``unshard`` when it issued an all-gather (``foreach_all_gather``), ``wait_for_unshard`` when it copied one out
  (``foreach_all_gather_copy_out``), ``reshard`` when it resharded (``_to_sharded``, or ``_to_sharded_post_forward``
  for an int), ``_backward_prefetch`` when it prefetched;
- ``_register_pre_backward_hook`` with the number of output tensors it hooked; ``foreach_reduce`` with the
  collective it issues (a reduce-scatter; an all-reduce too on an HSDP mesh, guide 23);
- a group's call names the group's unit when it is not the row's; repeats of one function in a row (``lazy_init``
  of each group) are counted, ``lazy_init ×4``.

A hook whose calls all returned at once lists ``(returns at once)``.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn
from torch.utils._pytree import tree_leaves

from checks.naming import unit_name
from checks.probes.call_tree import Call

S = "torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState"
PG = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
C = "torch.distributed.fsdp._fully_shard._fsdp_collectives"

HOOKS = {  # the entry points autograd, nn.Module and the engine call, as the rows name them
    "FSDPState._pre_forward": "pre-forward",
    "FSDPState._post_forward": "post-forward",
    "FSDPState._pre_backward": "pre-backward",
    "RegisterPostBackwardFunction.backward": "post-backward",
    "FSDPState._root_post_backward_final_callback": "final callback",
}
SYMBOLS = (
    *(f"{S}.{name}" for name in ("_pre_forward", "_post_forward", "_pre_backward", "_root_post_backward_final_callback",
                                 "_root_pre_forward", "_lazy_init", "_init_fqns", "_init_shared_state",
                                 "_validate_no_duplicate_params", "_register_pre_backward_hook",
                                 "_register_root_post_backward_final_callback")),
    *(f"{PG}:FSDPParamGroup.{name}" for name in ("lazy_init", "pre_forward", "post_forward", "unshard",
                                                  "wait_for_unshard", "reshard", "pre_backward", "post_backward",
                                                  "finalize_backward", "_prefetch_unshard", "_backward_prefetch",
                                                  "_register_post_backward_hook", "_record_post_forward",
                                                  "_to_sharded", "_to_sharded_post_forward")),
    f"{PG}:RegisterPostBackwardFunction.backward",
    f"{C}:foreach_all_gather",
    f"{C}:foreach_all_gather_copy_out",
    f"{C}:foreach_reduce",
)  # fmt: skip
# Torch 2.15 ends the last backward through these (`FSDPState._end_backward_iteration`); earlier releases have none.
OPTIONAL = (f"{S}.wait_for_gradient_reduction", f"{S}._end_backward_iteration")
HIDDEN = {  # called to find what a shown call did; never a row's entry of its own
    "foreach_all_gather",
    "foreach_all_gather_copy_out",
    "FSDPParamGroup._to_sharded",
    "FSDPParamGroup._to_sharded_post_forward",
}


def looker(model: nn.Module) -> Any:
    """What each watched call's frame says at entry: its unit, and what decides whether the call does anything."""
    names = {id(module): unit_name(path) for path, module in model.named_modules()}

    def unit_of_state(state: Any) -> str:
        return names.get(id(state._modules[0]), "?") if getattr(state, "_modules", None) else "?"

    def unit_of_group(group: Any) -> str:
        return names.get(id(group.modules[0]), "?")

    def look(name: str, frame: types.FrameType) -> dict[str, Any]:
        local = frame.f_locals
        self = local.get("self")
        if name.startswith("FSDPState."):
            seen: dict[str, Any] = {"unit": unit_of_state(self)}
            ctx = self._state_ctx
            if name == "FSDPState._root_pre_forward":
                seen["acts"] = ctx.iter_forward_root is None
            elif name == "FSDPState._lazy_init":
                seen["acts"] = self._is_root is None
            elif name == "FSDPState._register_root_post_backward_final_callback":
                seen["acts"] = not ctx.post_backward_final_callback_queued
            elif name == "FSDPState._register_pre_backward_hook":
                seen["outputs"] = _requiring_grad(local.get("output"))
            return seen
        if name == "FSDPParamGroup._prefetch_unshard":
            return {"unit": unit_of_group(local["target_fsdp_param_group"])}
        if name == "RegisterPostBackwardFunction.backward":
            return {"unit": unit_of_group(local["ctx"].param_group)}
        if name.startswith("FSDPParamGroup."):
            seen = {"unit": unit_of_group(self)}
            if name == "FSDPParamGroup.pre_backward":
                seen["acts"] = self._training_state.name != "PRE_BACKWARD"
            elif name == "FSDPParamGroup._register_post_backward_hook":
                seen["acts"] = _requiring_grad((local.get("args"), local.get("kwargs"))) > 0
            return seen
        return {}

    return look


def _requiring_grad(value: Any) -> int:
    import torch

    if not torch.is_grad_enabled():
        return 0
    return sum(1 for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor) and leaf.requires_grad)


def phase(call: Call) -> str:
    return "forward" if call.name in ("FSDPState._pre_forward", "FSDPState._post_forward") else "backward"


def shown(call: Call, row_unit: str) -> list[str]:
    """What ``call`` (a call under a hook) did, as the row lists it, then what the calls under it did."""
    if call.name in HIDDEN:
        return []
    short = call.name.split(".")[-1]
    unit = call.seen.get("unit")
    about = f" {unit}" if unit not in (None, row_unit) else ""
    inner = [part for child in call.calls for part in shown(child, row_unit)]
    if call.seen.get("acts") is False:
        return inner
    if short == "unshard":
        return [f"unshard{about} (all-gather)"] if call.made("foreach_all_gather") else inner
    if short == "wait_for_unshard":
        return [f"wait_for_unshard{about}"] if call.made("foreach_all_gather_copy_out") else inner
    if short == "reshard":
        resharded = call.made("FSDPParamGroup._to_sharded") or call.made("FSDPParamGroup._to_sharded_post_forward")
        return [f"reshard{about}", *inner] if resharded else inner
    if short == "_backward_prefetch":
        return [f"_backward_prefetch{about}", *inner] if call.made("FSDPParamGroup._prefetch_unshard") else inner
    if short == "_register_root_post_backward_final_callback":
        return ["queue final callback"]
    if short == "_register_pre_backward_hook":
        count = call.seen.get("outputs", 0)
        return [f"_register_pre_backward_hook ({count} output{'s' if count != 1 else ''})"] if count else []
    if short == "foreach_reduce":
        return ["foreach_reduce (reduce-scatter)"]
    return [f"{short}{about}", *inner]


def counted(parts: Iterable[str]) -> list[str]:
    """Consecutive repeats of one function, whichever unit, as one part with a count: ``lazy_init ×4``."""
    out: list[tuple[str, int]] = []
    for part in parts:
        name = part.split(" ")[0]
        if out and out[-1][0].split(" ")[0] == name and name in COUNTED:
            out[-1] = (name, out[-1][1] + 1)
        else:
            out.append((part, 1))
    return [f"{part} ×{n}" if n > 1 else part for part, n in out]


COUNTED = {"lazy_init", "finalize_backward"}  # once per group: named once, with the count


def rows(roots: Iterable[Call]) -> list[str]:
    """One row per hook call: ``<phase> <unit> <hook>: <what it did>``."""
    out = []
    for call in roots:
        hook = HOOKS.get(call.name)
        if hook is None:
            out.append(f"?         ?         {call.name} called from outside a hook")
            continue
        unit = call.seen.get("unit", "?")
        did = counted(part for child in call.calls for part in shown(child, unit))
        out.append(f"{phase(call):<9} {unit:<9} {hook}: {', '.join(did) or '(returns at once)'}")
    return out


def by_name(roots: Iterable[Call]) -> Mapping[str, int]:
    """How many times each watched function ran, over the whole tree."""
    found: dict[str, int] = {}
    for root in roots:
        for call in root.walk():
            found[call.name] = found.get(call.name, 0) + 1
    return found
