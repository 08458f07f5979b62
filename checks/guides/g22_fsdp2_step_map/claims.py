"""Guide 22's claims: FSDP2's step map, its first step, the hooks it puts on tensors, and one schedule on every
rank. Each expected value is the guide's expect block and the rule model's rows (`steps.expected_rows`); the
observed rows are the call recorder's (`calls.rows`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks.expected import Expected
from checks.guides.g22_fsdp2_step_map import calls, steps
from checks.naming import unit_name
from checks.probes.call_tree import record_call_tree
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, fsdp2_gpt


def one_step(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """The second step (the first is lazy initialisation's, `first_step`) is the guide's rows and the model's.
    Returns the rows and what they count."""
    trees = steps.recorded_steps(ctx, drawn=2)
    observed = calls.rows(trees[1])
    expected.require_rows(observed, reason="step-differs", what=f"rank {ctx.rank}'s step map")
    require_equal(observed, steps.expected_rows(), reason="model-differs", what="the step map against the rule model")
    callback = [call for call in trees[1] if call.name == "FSDPState._root_post_backward_final_callback"]
    in_callback = [
        c.seen.get("unit") for root in callback for c in root.walk() if c.name == "FSDPParamGroup.post_backward"
    ]
    return {
        "rows": observed,
        **steps.counts(observed),
        "root_pre_backwards": sum(1 for row in observed if row.split()[:3] == ["backward", "root", "pre-backward:"]),
        "post_backward_in_final_callback": ", ".join(in_callback) or "none",
    }


def first_step(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """The first step is the second but for the root's pre-forward, whose ``_lazy_init`` does its work there and
    only there; every unit's pre-forward still calls ``_lazy_init`` on every step."""
    first, second = steps.recorded_steps(ctx)
    rows = [calls.rows(first), calls.rows(second)]
    differing = [n for n, (a, b) in enumerate(zip(*rows, strict=False)) if a != b]
    require(
        len(rows[0]) == len(rows[1]) and differing == [0], "first-step-differs",
        f"the first step differs from the second at rows {differing} (only the root's pre-forward may)",
        differing=differing, first=rows[0], second=rows[1],
    )  # fmt: skip
    expected.require_rows(rows[0][:1], reason="lazy-init-differs", what="the first step's root pre-forward")
    require_equal(rows[0][0], steps.expected_rows(first=True)[0], reason="model-differs", what="the first pre-forward")
    ran = [calls.by_name(tree) for tree in (first, second)]
    lazy = [r.get("FSDPState._lazy_init", 0) for r in ran]
    init = [r.get("FSDPState._init_shared_state", 0) for r in ran]
    units = 1 + len(steps.BLOCKS)
    require(lazy == [units, units], "lazy-init-calls", f"_lazy_init ran {lazy} times in steps 1 and 2, not once per "
            f"unit's pre-forward ({units}) in each", calls=lazy)  # fmt: skip
    require(init == [1, 0], "init-not-once", f"_init_shared_state ran {init} times in steps 1 and 2", calls=init)
    return {"first_pre_forward": rows[0][0], "lazy_init_calls_step_2": lazy[1], "init_shared_state_calls": init}


def hooks_on_tensors(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """After forward, each output that needs a gradient carries its unit's ``_pre_backward`` as a tensor hook, and
    the graph holds one post-backward Function per unit whose inputs need a gradient, and no pre-backward
    Function."""
    model = fsdp2_gpt(ctx, None)
    names = {id(m): unit_name(path) for path, m in model.named_modules()}
    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            outputs[f"{name} output"] = output

        return hook

    handles = [block.register_forward_hook(keep(f"blocks.{n}")) for n, block in enumerate(model.blocks)]
    x, y = batch(ctx)
    logits, loss = model(x, y)
    for handle in handles:
        handle.remove()
    observed = {"logits": _hook_owners(logits, names), "loss": _hook_owners(loss, names)}
    observed |= {name: _hook_owners(tensor, names) for name, tensor in outputs.items()}
    observed["post-backward Function"] = ", ".join(_function_units(loss, "RegisterPostBackwardFunction", names))
    observed["pre-backward Function"] = ", ".join(_function_units(loss, "RegisterPreBackwardFunction", names)) or "none"
    loss.backward()
    expected.require_values(observed, reason="hooks-differ", what="the hooks on the step's tensors")
    return observed


def _hook_owners(tensor: torch.Tensor, names: dict[int, str]) -> str:
    """Whose ``FSDPState._pre_backward`` the tensor's hooks are ("none" when it has no such hook)."""
    owners = []
    for hook in (tensor._backward_hooks or {}).values():
        owner = getattr(hook, "__self__", None)
        if getattr(hook, "__name__", "") == "_pre_backward" and owner is not None:
            owners.append(names.get(id(owner._modules[0]), "?"))
    return ", ".join(owners) or "none"


def _function_units(loss: torch.Tensor, function: str, names: dict[int, str]) -> list[str]:
    """The units whose ``function`` (an autograd Function of FSDP2's) has a node in ``loss``'s graph, in module
    order."""
    found, seen, stack = set(), set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == f"{function}Backward":
            group = getattr(node, "param_group", None) or getattr(node, "state", None)
            modules = getattr(group, "modules", None) or getattr(group, "_modules", None) or ()
            found.add(names.get(id(modules[0]), "?") if modules else "?")
        stack += [next_node for next_node, _ in node.next_functions]
    order = list(names.values())
    return sorted(found, key=lambda unit: order.index(unit) if unit in order else len(order))


def same_on_every_rank(ctx: RankContext) -> int:
    """Every rank's step map is one map, though each rank's batch rows differ."""
    trees = steps.recorded_steps(ctx)
    observed = calls.rows(trees[1])
    require(len(observed) > 0, "nothing-recorded", "no hook was recorded")
    ctx.assert_same_on_all_ranks(observed, "the step map")
    rows = ctx.gather(hash(tuple(batch(ctx, step=2)[0].flatten().tolist())))
    repeats = [rank for rank, seen in enumerate(rows) if seen in rows[:rank]]
    require(not repeats, "same-data-on-ranks", f"ranks {repeats} stepped on a lower rank's rows", repeats=repeats)
    return len(observed)


def forward_method(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """A method other than ``forward`` runs FSDP's hooks only if it calls ``forward`` (``generate`` does) or is
    registered with ``register_fsdp_forward_method``; unregistered, one that reads the root's parameters itself
    meets them sharded after a training step, and fails."""
    import types

    from torch.distributed.fsdp import register_fsdp_forward_method

    model = fsdp2_gpt(ctx, None)
    x, y = batch(ctx)
    model(x, y)[1].backward()  # a training step: backward leaves every group resharded

    def head(self: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))

    model.head = types.MethodType(head, model)
    hidden = torch.zeros(1, 2, model.config.n_embd)
    observed: dict[str, str] = {"the head's weight after a step": type(model.lm_head.weight).__name__}
    look = calls.looker(model)
    observed["head, not registered"] = _ran(lambda: model.head(hidden), look)
    register_fsdp_forward_method(model, "head")
    observed["head, registered"] = _ran(lambda: model.head(hidden), look)
    observed["the head's weight after it"] = type(model.lm_head.weight).__name__
    observed["generate, not registered"] = _ran(lambda: model.generate(x[:1, :4], 1), look)
    expected.require_values(observed, reason="forward-method-differs", what="methods other than forward")
    return observed


def _ran(call: Any, look: Any) -> str:
    """What ``call`` did under ``torch.no_grad()``: the hooks that ran and the all-gathers they issued
    (``root pre-forward, root post-forward; 1 all-gather``), or the error it raised."""
    try:
        with torch.no_grad(), record_call_tree(calls.SYMBOLS, look, optional=calls.OPTIONAL) as ran:
            call()
    except RuntimeError as exc:
        return "RuntimeError, mixed Tensor and DTensor" if "mixed torch.Tensor and DTensor" in str(exc) else (
            f"RuntimeError: {str(exc)[:200]}")  # fmt: skip
    rows = calls.rows(ran)
    gathers = sum(row.count("(all-gather)") for row in rows)
    hooks = ", ".join(" ".join(row.split()[1:3]).rstrip(":") for row in rows) or "none"
    return f"{hooks}; {gathers} all-gather{'s' if gathers != 1 else ''}"


def explicit_unshard(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``unshard(async_op=True)`` all-gathers at once and returns a handle; the copy-out waits for ``wait()`` or,
    without one, for the unit's next pre-forward; ``reshard()`` reshards the module's own groups, not its
    children's."""
    from torch.distributed.fsdp import UnshardHandle

    model = fsdp2_gpt(ctx, None)
    x, y = batch(ctx)
    model(x, y)[1].backward()  # a training step: every group resharded
    look, block = calls.looker(model), model.blocks[0]
    observed: dict[str, str] = {}
    with record_call_tree(calls.SYMBOLS, look, optional=calls.OPTIONAL) as ran:
        handle = block.unshard(async_op=True)
    observed["unshard(async_op=True) returns"] = "UnshardHandle" if isinstance(handle, UnshardHandle) else (
        type(handle).__name__)  # fmt: skip
    observed["all-gathers it issues"] = str(sum(c.name == "foreach_all_gather" for r in ran for c in r.walk()))
    observed["blocks.0 weight before wait"] = _weight_type(block)
    handle.wait()
    observed["blocks.0 weight after wait"] = _weight_type(block)
    observed["blocks.0 pre-forward after a wait"] = _pre_forward_of(model, x, y, look, "blocks.0")
    block.unshard(async_op=True)  # and no wait: the pre-forward waits
    observed["blocks.0 pre-forward without a wait"] = _pre_forward_of(model, x, y, look, "blocks.0")
    block.unshard()
    model.unshard()
    model.reshard()
    units = {"root": model, **{f"blocks.{n}": b for n, b in enumerate(model.blocks)}}
    kept = [name for name, unit in units.items() if _weight_type(unit) != "DTensor"]
    observed["unsharded after model.reshard()"] = ", ".join(kept) or "none"
    expected.require_values(observed, reason="explicit-unshard-differs", what="unshard and reshard called directly")
    return observed


def _weight_type(unit: nn.Module) -> str:
    """The type of the unit's first own parameter (a block's first, the root's token embedding)."""
    own = unit.tok_emb.weight if hasattr(unit, "tok_emb") else next(unit.parameters())
    return type(own).__name__


def _pre_forward_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, look: Any, unit: str) -> str:
    """What ``unit``'s pre-forward did in one forward and backward, as the map writes it, and the forward's
    all-gathers."""
    with record_call_tree(calls.SYMBOLS, look, optional=calls.OPTIONAL) as ran:
        _, loss = model(x, y)
    loss.backward()
    rows = calls.rows(ran)
    mine = next(row for row in rows if row.split()[1:3] == [unit, "pre-forward:"])
    gathers = sum(row.count("(all-gather)") for row in rows)
    return f"{mine.split('pre-forward: ', 1)[1]}; {gathers} all-gathers in the forward"


def kept_after_forward(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``set_reshard_after_forward(False)`` called after ``fully_shard`` changes the step map exactly where the
    model's ``keep_after_forward`` does: the guide's rows, every other row the default map's."""
    return _kept(ctx, expected, "set_reshard_after_forward", "keep_after_forward")


def kept_after_backward(ctx: RankContext, expected: Expected) -> dict[str, Any]:
    """``set_reshard_after_backward(False)`` called after ``fully_shard`` changes the second step's map exactly
    where the model's ``keep_after_backward`` does: the guide's rows, every other row the default map's."""
    return _kept(ctx, expected, "set_reshard_after_backward", "keep_after_backward")


def _kept(ctx: RankContext, expected: Expected, setter: str, rule: str) -> dict[str, Any]:
    """The example with ``setter(False)`` called on the model (every unit), its second step mapped: the rows that
    differ from the default map are the guide's, and the map is the model's with ``rule``."""
    model = fsdp2_gpt(ctx, None)
    getattr(model, setter)(False)  # recurse=True: every unit
    observed = calls.rows(steps.recorded_steps(ctx, model=model)[1])
    default = steps.expected_rows()
    require(len(observed) == len(default), "row-count-differs", f"{len(observed)} rows, not the default map's "
            f"{len(default)}", observed=observed)  # fmt: skip
    changed = [row for row, usual in zip(observed, default, strict=True) if row != usual]
    expected.require_rows(changed, reason="kept-rows-differ", what=f"the rows {setter}(False) changes")
    require_equal(observed, steps.expected_rows(**{rule: True}), reason="model-differs",
                  what=f"the map after {setter}(False), against the rule model")  # fmt: skip
    return {"changed": changed, **steps.counts(observed)}
