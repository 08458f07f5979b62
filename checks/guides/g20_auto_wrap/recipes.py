"""Guide 20's break-it recipes: the wrap code bent on purpose (``tests/break_it/test_20_auto_wrap.py`` applies
them), and some of them as exercises (``fsdp-readings exercise 20-auto-wrap``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from checks.breakit.exercises import Exercise
from checks.breakit.patches import replacing, skipping, wrapping

WRAP = "torch.distributed.fsdp.wrap"
WRAP_UTILS = "torch.distributed.fsdp._wrap_utils"


def skip_first_target(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> dict[Any, Any]:
    """``_run_policy`` that leaves out the first module it picked: a policy that misses a block."""
    targets = original(self, *args, **kwargs)
    return dict(list(targets.items())[1:])


def skip_last_child(original: Callable[..., Any], root_module: nn.Module, fn: Callable[..., Any]) -> None:
    """``_post_order_apply`` whose walk never visits the last child of any module."""

    def inner(module: nn.Module, name: str, parent: nn.Module | None, seen: set[int]) -> None:
        for child_name, child in list(module.named_children())[:-1]:
            if id(child) not in seen:
                seen.add(id(child))
                inner(child, child_name, module, seen)
        replacement = fn(module)
        if replacement is not None and parent is not None:
            setattr(parent, name, replacement)

    inner(root_module, "", None, {id(root_module)})


def also_linears(original: Callable[..., Any], module: nn.Module, recurse: bool, nonwrapped_numel: int,
                 transformer_layer_cls: Any) -> bool:  # fmt: skip
    """``transformer_auto_wrap_policy`` that takes every Linear layer too: a policy that takes the wrong modules."""
    return original(module, recurse, nonwrapped_numel, transformer_layer_cls) or (
        not recurse and isinstance(module, nn.Linear)
    )


def strictly_larger(original: Callable[..., Any], module: nn.Module, recurse: bool, nonwrapped_numel: int,
                    min_num_params: int = int(1e8), **kwargs: Any) -> bool:  # fmt: skip
    """``size_based_auto_wrap_policy`` with ``>`` where torch has ``>=``."""
    return original(module, recurse, nonwrapped_numel - 1, min_num_params=min_num_params, **kwargs)


def remainder_not_subtracted(original: Callable[..., Any], module: nn.Module, auto_wrap_policy: Any,
                             **kwargs: Any) -> tuple[nn.Module, int]:  # fmt: skip
    """``_recursive_wrap`` whose wrap decision is asked with the module's whole count (the one its ``recurse=True``
    question got, before any child was wrapped), not with what its children left."""
    whole = getattr(auto_wrap_policy, "_whole_counts", None)
    if whole is None:
        whole = {}

        def policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
            if recurse:
                whole[id(module)] = nonwrapped_numel
            else:
                nonwrapped_numel = whole.get(id(module), nonwrapped_numel)
            return auto_wrap_policy(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel)

        policy._whole_counts = whole  # type: ignore[attr-defined]
    else:
        policy = auto_wrap_policy
    return original(module=module, auto_wrap_policy=policy, **kwargs)


def empty_set(original: Any) -> set[Any]:
    """A size-policy default (``FORCE_LEAF_MODULES``, ``EXCLUDE_WRAP_MODULES``) emptied."""
    return set()


def small_default(original: Callable[..., Any], module: nn.Module, recurse: bool, nonwrapped_numel: int,
                          **kwargs: Any) -> bool:  # fmt: skip
    """``size_based_auto_wrap_policy`` called bare, whose default threshold is a thousand elements instead."""
    kwargs.setdefault("min_num_params", 1000)
    return original(module, recurse, nonwrapped_numel, **kwargs)


def without_overrides(original: Callable[..., Any], module: nn.Module, wrapper_cls: Any, **kwargs: Any) -> Any:
    """``_wrap`` that ignores ``module._wrap_overrides``: a BatchNorm keeps the root's mixed precision."""
    return wrapper_cls(module, **kwargs)


def targets_unchanged(original: Callable[..., Any], *args: Any) -> Any:
    """``_run_mixed_precision_override_policy`` that adds nothing: a missing override (its last argument is the
    targets it would add to)."""
    return args[-1]


def overrides_without_hooks(original: Callable[..., Any], root: nn.Module, module_classes_to_override: Any,
                            *args: Any) -> set[type[nn.Module]]:  # fmt: skip
    """``_override_module_mixed_precision`` that marks the modules but registers no casting hooks."""
    classes = tuple(set(module_classes_to_override))
    found = set()
    for module in root.modules():
        if isinstance(module, classes):
            found.add(type(module))
            module._wrap_overrides = {"mixed_precision": None}
    return found


def all_policies(original: Callable[..., Any], module: nn.Module, recurse: bool, nonwrapped_numel: int,
                 policies: Any) -> bool:  # fmt: skip
    """``_or_policy`` with ``all`` where torch has ``any``."""
    return all(p(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel) for p in policies)


def kwargs_dropped(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> dict[Any, Any]:
    """``CustomPolicy._run_policy`` that gives every target the root's kwargs, ignoring the ones it returned."""
    targets = original(self, *args, **kwargs)
    root_kwargs = args[2] if len(args) > 2 else kwargs["root_kwargs"]
    return {module: dict(root_kwargs) for module in targets}


def lambda_inverted(original: Callable[..., Any], module: nn.Module, recurse: bool, nonwrapped_numel: int,
                    lambda_fn: Callable[..., bool]) -> bool:  # fmt: skip
    """``lambda_auto_wrap_policy`` that wraps where the function says False."""
    return recurse or not lambda_fn(module)


def fsdp2_through_nested(original: Callable[..., Any], root_modules: Any, ignored_params: Any = None,
                         *args: Any) -> list[nn.Module]:  # fmt: skip
    """FSDP2's ``_get_managed_modules`` that does not stop at modules an earlier call sharded."""
    out: list[nn.Module] = []
    for root in root_modules:
        out.extend(m for m in root.modules() if m not in out)
    return out


def fsdp2_skip_dtensors(original: Callable[..., Any], modules: Any, ignored_params: Any = None) -> Any:
    """FSDP2's ``_get_managed_states`` that leaves out parameters already sharded (DTensors)."""
    from torch.distributed.tensor import DTensor

    params, buffers = original(modules, ignored_params)
    return [p for p in params if not isinstance(p, DTensor)], buffers


def exact_classes(original: Callable[..., Any], self: Any, root_module: nn.Module, *args: Any,
                  **kwargs: Any) -> dict[Any, Any]:  # fmt: skip
    """``ModuleWrapPolicy._run_policy`` that tests ``type(module) in classes`` instead of ``isinstance``: an
    instance of a subclass is no longer a target."""
    targets = original(self, root_module, *args, **kwargs)
    return {module: kw for module, kw in targets.items() if type(module) in self._module_classes}


def fsdp2_first_half(original: Callable[..., Any], modules: Any, ignored_params: Any = None) -> Any:
    """FSDP2's ``_get_managed_states`` that manages only the first half of the parameters it finds: on mini_gpt
    the root's call shards ``blocks.0`` whole and leaves the later blocks partly plain tensors."""
    params, buffers = original(modules, ignored_params)
    return params[: len(params) // 2], buffers


def shard_view_copied(original: Callable[..., Any], self: Any) -> Any:
    """``FlatParamHandle._use_sharded_views`` that gives each original parameter a copy of its slice of the
    shard: the right shape and values, but no longer a view of the flat parameter."""
    original(self)
    for param in self.flat_param._params or ():
        param.data = param.data.clone()


def no_backward_prefetch(original: Callable[..., Any], state: Any, current_handle: Any) -> Any:
    """``_get_handle_to_prefetch`` that never finds one: backward unshards one unit at a time."""
    return None


def policy_takes_mlps(original: Callable[..., Any], self: Any, root_module: nn.Module, *args: Any,
                      **kwargs: Any) -> dict[Any, Any]:  # fmt: skip
    """``ModuleWrapPolicy._run_policy`` that also takes every block's MLP: a policy that takes the wrong module."""
    from mini_gpt.model import MLP

    targets = original(self, root_module, *args, **kwargs)
    root_kwargs = args[1] if len(args) > 1 else kwargs["root_kwargs"]
    for module in root_module.modules():
        if isinstance(module, MLP):
            targets[module] = dict(root_kwargs)
    return targets


def unaligned(original: Callable[..., Any], unsharded_dtype: torch.dtype) -> int:
    """``_get_aligned_numel`` of one element whatever the dtype: no padding between parameters."""
    return 1


# -- exercises: some of these recipes as puzzles (``fsdp-readings exercise 20-auto-wrap``) ----------------------------
_SIZE = f"{WRAP}:size_based_auto_wrap_policy"
_OVERRIDE = "torch.distributed.fsdp._common_utils:_override_module_mixed_precision"

EXERCISES = (
    Exercise(
        "strictly-larger",
        claim="size-crossed-mid-block",
        patches=(wrapping(_SIZE, strictly_larger),),
        puzzle="`size_based_auto_wrap_policy` tests `nonwrapped_numel > min_num_params` instead of `>=`.",
        reason="units-differ-from-model",
    ),
    Exercise(
        "no-force-leaf",
        claim="size-crossed-mid-block",
        patches=(replacing(f"{_SIZE}.FORCE_LEAF_MODULES", empty_set),),
        puzzle="`size_based_auto_wrap_policy.FORCE_LEAF_MODULES` is an empty set.",
        reason="units-differ-from-model",
    ),
    Exercise(
        "hooks-missing",
        claim="batchnorm-own-unit-policy",
        patches=(wrapping(_OVERRIDE, overrides_without_hooks),),
        puzzle="`_override_module_mixed_precision` marks each BatchNorm but registers none of its casting hooks.",
        reason="dtypes-differ",
    ),
    Exercise(
        "nesting-unchecked",
        claim="nested-wrapping-refused",
        patches=(skipping(f"{WRAP_UTILS}:_check_nested_wrapping"),),
        puzzle="`_auto_wrap` no longer calls `_check_nested_wrapping`.",
        reason="nesting-not-refused",
    ),
)
