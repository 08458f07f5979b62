"""What the claims of guide 20 share: FSDP1 built under a policy while watching which wrap code runs, the wrap
model's units in the two forms they are compared in (`checks.probes.built_units.fsdp1_units`'s and the guide's
unit rows), a step that must run, and an error as the one line the guide quotes."""

from __future__ import annotations

import types
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from checks.expected import Expected
from checks.models import wrap as wm
from checks.naming import unit_name
from checks.probes import calls
from checks.ranks.context import RankContext
from checks.violation import Violation
from checks.workloads.edge import step_loss

WRAP = "torch.distributed.fsdp.wrap"
INIT_HANDLE = "torch.distributed.fsdp._init_utils:_init_param_handle_from_module"


class WrapCalls:
    """Which wrap code ran while FSDP1 was built: the units in the order their handles were built, and how many
    times each walk was entered."""

    def __init__(self, paths: Mapping[int, str]) -> None:
        self.paths = paths
        self.built: list[str] = []
        self.counts: dict[str, int] = {"_post_order_apply": 0, "_recursive_wrap": 0}

    def hooks(self) -> dict[types.CodeType, calls.CallHook]:
        def handle_built(frame: types.FrameType) -> None:
            self.built.append(unit_name(self.paths.get(id(frame.f_locals["fully_sharded_module"]), "?")))

        def counting(name: str) -> calls.CallHook:
            def on_call(frame: types.FrameType) -> None:
                self.counts[name] += 1

            return on_call

        return {
            calls.function_code(INIT_HANDLE): handle_built,
            calls.function_code(f"{WRAP}:_post_order_apply"): counting("_post_order_apply"),
            calls.function_code(f"{WRAP}:_recursive_wrap"): counting("_recursive_wrap"),
        }


def wrap_fsdp1(model: nn.Module, ctx: RankContext, policy: Any, paths: Mapping[int, str], *,
               mixed_precision: Any = None) -> tuple[nn.Module, WrapCalls, list[str]]:  # fmt: skip
    """``FullyShardedDataParallel(model, auto_wrap_policy=policy)`` (``use_orig_params=True``), watching which
    wrap code runs; also the warnings it gave."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    watched = WrapCalls(paths)
    with warnings.catch_warnings(record=True) as caught, calls.subscribed(watched.hooks()) as subscription:
        warnings.simplefilter("always")
        wrapped = FSDP(model, auto_wrap_policy=policy, device_id=ctx.device, use_orig_params=True,
                       mixed_precision=mixed_precision)  # fmt: skip
    if subscription.errors:
        raise subscription.errors[0]
    return wrapped, watched, [str(w.message) for w in caught]


def mixed_precision_of(param_dtype: str | None) -> Any:
    """``MixedPrecision(param_dtype=...)`` for a dtype's name, None for none."""
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(param_dtype=getattr(torch, param_dtype)) if param_dtype else None


def expected_units(wrap: wm.Wrap, param_dtype: str | None, strategy: str = "FULL_SHARD") -> dict[str, dict[str, Any]]:
    """The model's units in `fsdp1_units`'s form, with the root's settings wherever a unit's kwargs do not
    override them."""
    out = {}
    for unit in wrap.units:
        kwargs = dict(unit.kwargs)
        out[unit.name] = {
            "type": unit.type,
            "params": [list(p) for p in unit.params],
            "shared": list(unit.shared),
            "param_dtype": None if "mixed_precision" in kwargs else param_dtype,
            "strategy": kwargs.get("sharding_strategy", strategy),
        }
    return out


def walk_counts(wrap: wm.Wrap) -> dict[str, int]:
    """How often each walk is entered, by the model: ``_post_order_apply`` once for a _Policy (its recursion is an
    inner function), ``_recursive_wrap`` once per module it enters for a callable."""
    return {"_post_order_apply": int(wrap.walk == "post-order apply"), "_recursive_wrap": wrap.visits}


def unit_row(unit: wm.Unit) -> str:
    """A unit as the guide's unit rows state it after its name: ``16020 in 12 parameters``, then the tensors it
    shares and the settings that differ from the root's."""
    count = len(unit.params)
    value = f"{unit.numel} in {count} parameter{'s' if count != 1 else ''}"
    if unit.shared:
        value += f", shared {' '.join(unit.shared)}"
    if unit.kwargs:
        value += ", " + " ".join(f"{k}={'None' if v is None else v}" for k, v in unit.kwargs)
    return value


def require_units_stated(expected: Expected, wrap: wm.Wrap) -> list[str]:
    """The model's units are the guide's rows: each unit's row says what `unit_row` writes, and the rows come in
    the order the units are built. Returns the units written out (``blocks.0: 16020 in 12 parameters``)."""
    observed = {unit.name: unit_row(unit) for unit in wrap.units}
    expected.require_values(observed, reason="units-differ-from-guide", what="the units, written out")
    expected.require_rows(list(observed), reason="units-differ-from-guide", what="the units' build order",
                          text=lambda row: row.key)  # fmt: skip
    return [f"{name}: {value}" for name, value in observed.items()]


def require_units_built(expected: Expected, observed: Mapping[str, Any], predicted: Mapping[str, Any], *,
                        what: str, **details: Any) -> None:  # fmt: skip
    """The units FSDP1 built (`fsdp1_units`) are the model's (`expected_units`), unit by unit. The guide's rows
    are the model's units (`require_units_stated` first), so a unit that differs makes its row false."""
    expected.require_values(observed, reason="units-differ-from-model", what=what,
                            value=lambda row: predicted[row.key], **details)  # fmt: skip


def require_built_in_order(expected: Expected, built: list[str], *, what: str, **details: Any) -> None:
    """FSDP1 built the units' handles in the rows' order, the model's; the first row built out of turn is false."""
    expected.require_rows(built, reason="build-order-differs", what=what, text=lambda row: row.key, **details)


def require_step_runs(model: nn.Module, ctx: RankContext, workload: str, policy: str) -> None:
    try:
        step_loss(model, ctx, workload).backward()
    except RuntimeError as error:
        raise Violation("step-failed", f"{policy} policy: the step raised {error}", policy=policy,
                        error=str(error)) from error  # fmt: skip


def error_line(error: BaseException) -> str:
    """An error's type and first line, without the meshes a message may print (they name the world size)."""
    return f"{type(error).__name__}: {str(error).splitlines()[0].split(': [DeviceMesh')[0]}"
