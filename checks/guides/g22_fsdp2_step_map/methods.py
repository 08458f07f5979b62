"""Guide 22's claims on the ``FSDPModule`` methods that change a step after ``fully_shard``: what each changes in
the step map, the collectives or the gradients. Expected values are the guide's expect blocks, the rule model's
default map (`steps.expected_rows`) and formulas of the example's shapes (`shard_numels`), never this run's."""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from checks.expected import Expected
from checks.guides.g22_fsdp2_step_map import calls, steps
from checks.models.comm_volume import fsdp2_padded
from checks.probes.call_tree import record_call_tree
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, fsdp2_gpt, tiny_shapes


def local_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter's sharded gradient, this rank's shard."""
    return {name: p.grad.to_local().clone() for name, p in model.named_parameters() if p.grad is not None}


def train_step(model: nn.Module, ctx: RankContext, step: int = 1) -> None:
    x, y = batch(ctx, step=step)
    model(x, y)[1].backward()


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def mapped_step(model: nn.Module, ctx: RankContext, step: int = 2) -> list[str]:
    """The map of one step of ``model`` (already stepped once), by the rules of `calls`."""
    with record_call_tree(calls.SYMBOLS, calls.looker(model), optional=calls.OPTIONAL) as roots:
        train_step(model, ctx, step)
    return calls.rows(roots)


def changed_rows(observed: list[str], default: list[str]) -> list[str]:
    """The rows of ``observed`` that ``default`` (the same number of rows) does not have at that place."""
    require(len(observed) == len(default), "row-count-differs", f"{len(observed)} rows, not the default map's "
            f"{len(default)}", observed=observed, default=default)  # fmt: skip
    return [row for row, usual in zip(observed, default, strict=True) if row != usual]


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], scale: float = 1.0) -> list[str]:
    """The parameters whose gradient in ``a`` is not ``scale`` times ``b``'s, bit for bit."""
    require(a.keys() == b.keys(), "gradients-missing", "the runs have gradients for different parameters",
            only_first=sorted(a.keys() - b.keys()), only_second=sorted(b.keys() - a.keys()))  # fmt: skip
    return [name for name in a if not torch.equal(a[name], b[name] * scale)]


def _error(call: Callable[[], Any]) -> str:
    try:
        call()
    except RuntimeError as exc:
        return f"RuntimeError: {str(exc).splitlines()[0]}"
    return "no error"


# -- set_unshard_in_backward ---------------------------------------------------------------------------------


def pos_emb_unit_gpt(ctx: RankContext) -> nn.Module:
    """The example with ``pos_emb``, an embedding whose backward never reads its weight, as a unit of its own."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from mini_gpt import GPT, preset

    model = GPT(preset("tiny"), seed=0).to(ctx.device)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for module in (model.pos_emb, *model.blocks):
        fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def unshard_in_backward(ctx: RankContext, rows: Expected, expected: Expected) -> dict[str, Any]:
    """``set_unshard_in_backward(False)`` on a unit whose backward needs no parameter (an embedding) removes its
    backward all-gather and changes no gradient; on a unit whose backward needs its weights, backward fails."""
    runs = {}
    for unshard in (True, False):
        model = pos_emb_unit_gpt(ctx)
        model.pos_emb.set_unshard_in_backward(unshard)
        train_step(model, ctx, 1)
        _clear_grads(model)
        runs[unshard] = (mapped_step(model, ctx), local_grads(model))
    (default, grads), (kept, kept_grads) = runs[True], runs[False]
    changed = changed_rows(kept, default)
    rows.require_rows(changed, reason="unshard-rows-differ", what="the rows set_unshard_in_backward(False) changes")
    gathers = [steps.counts(r)["all_gathers"] for r in (default, kept)]
    wrong = bitwise_equal(kept_grads, grads)
    observed = {
        "all-gathers in the step": f"{gathers[0]}, then {gathers[1]}",
        "gradients": "bitwise the default's" if not wrong else f"differ: {', '.join(wrong)}",
    }
    model = fsdp2_gpt(ctx, None)
    model.blocks[0].set_unshard_in_backward(False)
    observed["blocks.0 set to False, backward"] = _error(lambda: train_step(model, ctx, 1))
    expected.require_values(observed, reason="unshard-in-backward-differs", what="set_unshard_in_backward(False)")
    return {"rows": changed, **observed}


def _clear_grads(model: nn.Module) -> None:
    for param in model.parameters():
        param.grad = None


# -- custom collectives and the all-reduce hook -------------------------------------------------------------


def shard_numels(world_size: int) -> dict[str, int]:
    """Each unit's reduce-scatter output: its parameters, each padded to a multiple of ``world_size`` rows, over
    ``world_size`` (`checks.models.comm_volume.fsdp2_padded`, from the shapes on the meta device)."""
    return {unit: padded // world_size for unit, padded in fsdp2_padded(tiny_shapes(), world_size).items()}


def comm_hooks(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """A custom all-gather and reduce-scatter (``DefaultAllGather``/``DefaultReduceScatter`` subclasses that
    count) on every unit replace every collective of the step; the all-reduce hook sees each unit's reduce-scatter
    output once, and what it does to it in place is the gradient."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    seen: dict[str, Any] = {"all_gather": 0, "reduce_scatter": 0, "allocate": 0, "ops": set(), "hooked": []}

    class CountingAllGather(DefaultAllGather):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            seen["all_gather"] += 1
            return super().__call__(*args, **kwargs)

    class CountingReduceScatter(DefaultReduceScatter):
        def allocate(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            seen["allocate"] += 1
            return super().allocate(*args, **kwargs)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            seen["reduce_scatter"] += 1
            seen["ops"].add(str(kwargs.get("op")).rsplit(".", 1)[-1])
            return super().__call__(*args, **kwargs)

    def doubling(output: torch.Tensor) -> None:
        seen["hooked"].append(output.numel())
        output.mul_(2)

    reference = fsdp2_gpt(ctx, None)
    model = fsdp2_gpt(ctx, None)
    for unit in fsdp_units(model):
        unit.set_custom_all_gather(CountingAllGather())
        unit.set_custom_reduce_scatter(CountingReduceScatter())
        unit.set_all_reduce_hook(doubling)
    for run in (reference, model):
        train_step(run, ctx, 1)
        _clear_grads(run)
    seen.update(all_gather=0, reduce_scatter=0, allocate=0, hooked=[])
    default = steps.counts(mapped_step(reference, ctx))
    train_step(model, ctx, 2)
    require_equal(
        [seen["all_gather"], seen["reduce_scatter"]],
        [default["all_gathers"], default["reduce_scatters"]],
        reason="model-differs",
        what="the custom collectives' calls against the default map's collectives",
    )
    numels = shard_numels(ctx.world_size)
    in_backward_order = [numels[unit] for unit in (*reversed(steps.BLOCKS), "root")]
    require_equal(seen["hooked"], in_backward_order, reason="hook-sizes-differ",
                  what="the hook's output sizes against each unit's shard numel, in backward order")  # fmt: skip
    wrong = bitwise_equal(local_grads(model), local_grads(reference), scale=2.0)
    observed = {
        "custom all-gather calls": str(seen["all_gather"]),
        "custom reduce-scatter calls": str(seen["reduce_scatter"]),
        "its allocate calls": str(seen["allocate"]),
        "reduce op it is given": ", ".join(sorted(seen["ops"])),
        "all-reduce hook calls": f"{len(seen['hooked'])}, {', '.join(map(str, seen['hooked']))} elements",
        "gradients after a hook doubling its input": "2x the default, bitwise"
        if not wrong
        else (f"not 2x: {', '.join(wrong)}"),
    }
    expected.require_values(observed, reason="comm-hooks-differ", what="the custom collectives and the hook")
    return observed


# -- divide factors ------------------------------------------------------------------------------------------


def divide_factor(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``set_gradient_divide_factor`` sets the module's own groups only; a factor other than the world size is a
    ``PREMUL_SUM``, which gloo refuses, unless sums are forced, and the old name warns and does the same."""
    reference = fsdp2_gpt(ctx, None)
    train_step(reference, ctx)
    default = local_grads(reference)
    observed: dict[str, str] = {}

    model = fsdp2_gpt(ctx, None)
    model.set_gradient_divide_factor(4.0)
    observed["factor 4 on the root, backward"] = _error(lambda: train_step(model, ctx))

    model = fsdp2_gpt(ctx, None)
    model.set_gradient_divide_factor(4.0)
    model.set_force_sum_reduction_for_comms(True)
    forced = "with set_force_sum_reduction_for_comms(True)"
    error = _error(lambda: train_step(model, ctx))
    if error != "no error":  # a group still on PREMUL_SUM: gloo refused it
        observed[f"{forced}, root"] = observed[f"{forced}, blocks"] = error
    else:
        grads = local_grads(model)
        root = [name for name in grads if not name.startswith("blocks.")]
        halved = bitwise_equal({n: grads[n] for n in root}, {n: default[n] for n in root}, scale=0.5)
        same = bitwise_equal({n: g for n, g in grads.items() if n not in root},
                             {n: g for n, g in default.items() if n not in root})  # fmt: skip
        observed[f"{forced}, root"] = "0.5x the default, bitwise" if not halved else (
            f"not 0.5x: {', '.join(halved)}")  # fmt: skip
        observed[f"{forced}, blocks"] = "the default, bitwise" if not same else f"differ: {', '.join(same)}"

    model = fsdp2_gpt(ctx, None)
    for unit in fsdp_units(model):
        unit.set_gradient_divide_factor(float(ctx.world_size))
    train_step(model, ctx)
    wrong = bitwise_equal(local_grads(model), default)
    observed["factor = world size on every unit"] = "the default, bitwise" if not wrong else (
        f"differ: {', '.join(wrong)}")  # fmt: skip

    model = fsdp2_gpt(ctx, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.set_reduce_scatter_divide_factor(4.0)
    observed["set_reduce_scatter_divide_factor(4.0)"] = ", ".join(
        f"{w.category.__name__}: {w.message}" for w in caught) or "no warning"  # fmt: skip
    groups = model._get_fsdp_state()._fsdp_param_groups
    observed["then the root's factor"] = ", ".join(str(g.gradient_divide_factor) for g in groups)
    expected.require_values(observed, reason="divide-factor-differs", what="the gradient divide factor")
    return observed


# -- reduce-scatter process group and retained buffers ------------------------------------------------------


def separate_reduce_scatter_group(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``set_separate_reduce_scatter_group()`` on the root (recursive) makes one new group for every unit's
    reduce-scatter, of the same ranks, and changes no gradient."""
    import torch.distributed as dist

    reference = fsdp2_gpt(ctx, None)
    train_step(reference, ctx)
    model = fsdp2_gpt(ctx, None)
    model.set_separate_reduce_scatter_group()
    with record_call_tree((f"{calls.C}:foreach_reduce",), _reduce_scatter_group) as reduces:
        train_step(model, ctx)
    groups = [call.seen["group"] for call in reduces]
    gathers = {id(g._all_gather_process_group) for unit in fsdp_units(model)
               for g in unit._get_fsdp_state()._fsdp_param_groups}  # fmt: skip
    distinct = {id(group) for group in groups}
    wrong = bitwise_equal(local_grads(model), local_grads(reference))
    observed = {
        "reduce-scatters": str(len(groups)),
        "their process groups": f"{len(distinct)}, not the all-gather's"
        if not distinct & gathers
        else ("the all-gather's"),
        "its ranks": ", ".join(str(r) for r in dist.get_process_group_ranks(groups[0])) if groups else "none",
        "gradients": "bitwise the default's" if not wrong else f"differ: {', '.join(wrong)}",
    }
    expected.require_values(observed, reason="reduce-scatter-group-differs",
                            what="set_separate_reduce_scatter_group()")  # fmt: skip
    return observed


def _reduce_scatter_group(name: str, frame: types.FrameType) -> dict[str, Any]:
    """What the recorder keeps of a ``foreach_reduce`` call: the process group it reduce-scatters on."""
    return {"group": frame.f_locals["reduce_scatter_group"]}


def retained_after_each_reduce(model: nn.Module, ctx: RankContext, step: int) -> list[int]:
    """How many reduce-scatter input buffers the shared comm context retains after each post-backward that
    reduced, in backward order."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    retained: list[int] = []
    original = FSDPParamGroup.post_backward

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        retained.append(len(self.comm_ctx.reduce_scatter_states))
        return out

    FSDPParamGroup.post_backward = recording
    try:
        train_step(model, ctx, step)
    finally:
        FSDPParamGroup.post_backward = original
    return retained


def reduce_scatter_buffers(ctx: RankContext, expected: Expected, cap: int = 3) -> dict[str, Any]:
    """``set_reduce_scatter_max_input_buffers(cap)`` before the first forward caps the retained reduce-scatter
    inputs at ``cap`` (the i-th reduce retains min(i, cap)); set after it, the cap in force does not change."""
    observed: dict[str, str] = {}
    for label, setting in (("default", None), (f"set to {cap}", cap)):
        model = fsdp2_gpt(ctx, None)
        if setting is not None:
            model.set_reduce_scatter_max_input_buffers(setting)
        retained = retained_after_each_reduce(model, ctx, 1)
        limit = setting or 1
        require_equal(retained, [min(i, limit) for i in range(1, len(retained) + 1)], reason="cap-differs",
                      what=f"the retained buffers with the cap {label}, against min(i, cap)")  # fmt: skip
        observed[f"retained after each reduce, {label}"] = ", ".join(map(str, retained))
        if setting is not None:
            model.set_reduce_scatter_max_input_buffers(cap + 1)
            _clear_grads(model)
            later = retained_after_each_reduce(model, ctx, 2)
            observed[f"set to {cap + 1} after the first step"] = ", ".join(map(str, later))
    expected.require_values(observed, reason="buffers-differ", what="set_reduce_scatter_max_input_buffers")
    return observed


# -- reset_iter_state ----------------------------------------------------------------------------------------


def _raising_in(phase: str) -> Callable[..., None]:
    """A forward hook for ``blocks.1`` that raises in forward, or makes its output's gradient raise in backward."""

    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if phase == "forward":
            raise _Aborted(phase)
        output.register_hook(_abort_backward)

    return hook


def _abort_backward(grad: torch.Tensor) -> None:
    raise _Aborted("backward")


class _Aborted(Exception):
    """The exception the check raises mid-step."""


def reset_iter_state(ctx: RankContext, rows: Expected, expected: Expected) -> dict[str, Any]:
    """After an exception mid-forward or mid-backward the next step runs a different map, silently, unless
    ``reset_iter_state()`` is called on the root: then it is the default map. ``rows``: the rows that differ
    after a forward that raised."""
    observed: dict[str, str] = {}
    changed: list[str] = []
    for phase in ("forward", "backward"):
        for reset in (False, True):
            model = fsdp2_gpt(ctx, None)
            train_step(model, ctx, 0)
            _clear_grads(model)
            handle = model.blocks[1].register_forward_hook(_raising_in(phase))
            raised = False
            try:
                train_step(model, ctx, 1)
            except _Aborted:
                raised = True
            handle.remove()
            require(raised, "did-not-raise", f"the step did not raise in {phase}")
            if reset:
                model.reset_iter_state()
            _clear_grads(model)
            mapped = mapped_step(model, ctx)
            key = f"after a {phase} that raised, {'reset' if reset else 'no reset'}"
            observed[key] = _summary(mapped)
            observed[f"{key}, reduced"] = ", ".join(_reduced(mapped)) or "nothing"
            if phase == "forward" and not reset:
                changed = changed_rows(mapped, steps.expected_rows())
    rows.require_rows(changed, reason="reset-rows-differ", what="the rows that differ after a forward that raised")
    expected.require_values(observed, reason="reset-differs", what="the step after an exception")
    return {"rows": changed, **observed}


def _summary(rows: list[str]) -> str:
    """The default map, or the map's size and collectives and whether the final callback ran."""
    if rows == steps.expected_rows():
        return "the default map"
    counted = steps.counts(rows)
    callback = any(" final callback: " in row for row in rows)
    scatters = counted["reduce_scatters"]
    return (f"{counted['hooks']} rows, {counted['all_gathers']} all-gathers, {scatters} "
            f"reduce-scatter{'s' if scatters != 1 else ''}{'' if callback else ', no final callback'}")  # fmt: skip


def _reduced(rows: list[str]) -> list[str]:
    """The units whose gradients a row reduce-scattered, in the map's order."""
    return [row.split()[1] for row in rows if "(reduce-scatter)" in row]


# -- share_comm_ctx ------------------------------------------------------------------------------------------


def share_comm_ctx(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``share_comm_ctx([a, b])`` before the first forward: after a step of each, every state and group of both
    roots' trees holds ``a``'s comm context; without it each root keeps its own."""
    from torch.distributed.fsdp import share_comm_ctx as share

    observed: dict[str, str] = {}
    for shared in (False, True):
        roots = [fsdp2_gpt(ctx, None), fsdp2_gpt(ctx, None, seed=1)]
        if shared:
            share(roots)
        for root in roots:
            train_step(root, ctx)
        held = [
            id(holder)
            for root in roots
            for unit in fsdp_units(root)
            for holder in (unit._get_fsdp_state()._comm_ctx,
                           *(g.comm_ctx for g in unit._get_fsdp_state()._fsdp_param_groups))
        ]  # fmt: skip
        first = id(roots[0]._get_fsdp_state()._comm_ctx)
        label = "share_comm_ctx([a, b])" if shared else "two roots, no sharing"
        observed[label] = f"{len(set(held))} comm context{'s' if len(set(held)) != 1 else ''}" + (
            ", a's" if set(held) == {first} else "")  # fmt: skip
    expected.require_values(observed, reason="comm-ctx-differs", what="share_comm_ctx")
    return observed
