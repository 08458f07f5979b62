"""Checks for guide 20, how FSDP units are formed: FSDP1's ``auto_wrap_policy`` (``wrap.py``, ``_wrap_utils.py``),
FSDP2's ``fully_shard`` by hand, and what the granularity costs.

Every claim builds a real model, converts it to the plain tree the torch-free wrap model reads (`tree_of`: names,
class names, parameter sizes, ties), asks the model (`checks.models.wrap`) for the units, then wraps the model
with FSDP1 and compares: the units FSDP built (their module, what each flat parameter holds, its shared
parameters, its settings), the order they were built in (`_init_param_handle_from_module` calls, observed with
`checks.probes.calls`) and the walk that built them (`_post_order_apply` or `_recursive_wrap` calls). The numbers
the guide states come from its expect blocks; the costs of a granularity from `checks.models.wrap.cost`, which
reuses the flat-parameter, communication and prefetch models, against a run's collectives and memory peaks.
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from checks.breakit.exercises import Exercise
from checks.breakit.patches import replacing, skipping, wrapping
from checks.inspect.tree import module_paths, tree_of
from checks.models import flat_param as fp
from checks.models import wrap as wm
from checks.naming import ROOT, clean, unit_name
from checks.probes import calls
from checks.probes.comm import record_comm
from checks.probes.events import record_events
from checks.probes.memory import account_memory
from checks.probes.memory_series import record_memory_series
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal
from checks.workloads.gpt import batch
from mini_gpt import GPT, preset
from mini_gpt.model import Block

WRAP = "torch.distributed.fsdp.wrap"
WRAP_UTILS = "torch.distributed.fsdp._wrap_utils"
INIT_HANDLE = "torch.distributed.fsdp._init_utils:_init_param_handle_from_module"
LR = 1e-3


# -- workloads ------------------------------------------------------------------------------------------------------
class EdgeBlock(nn.Module):
    """A block built to hit the wrap code's edge cases: a ``MultiheadAttention`` (a forced leaf of the size
    policy), a ``BatchNorm1d`` (what mixed precision leaves alone) and two Linear layers, 288 and 264 elements,
    so that a threshold of 288 is crossed in the middle of the block."""

    def __init__(self, width: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.norm = nn.BatchNorm1d(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)  # BatchNorm1d normalises dim 1: (batch, width, time)
        return x + self.down(torch.relu(self.up(x)))


class Edge(nn.Module):
    """An embedding whose weight the head shares (a tied parameter), two `EdgeBlock` in a ``ModuleList``, the head."""

    def __init__(self, vocab: int = 16, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([EdgeBlock(width), EdgeBlock(width)])
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(workload: str, device: torch.device | str = "cpu", seed: int = 0) -> nn.Module:
    """``gpt`` (mini_gpt tiny), ``edge`` (`Edge`) or ``transformer`` (torch's ``nn.Transformer``, 2 + 2 layers of
    width 16), with weights that depend on ``seed`` alone."""
    if workload == "gpt":
        return GPT(preset("tiny"), seed=seed).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if workload == "edge":
            model: nn.Module = Edge()
        elif workload == "transformer":
            model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                   dim_feedforward=32, dropout=0.0, batch_first=True)  # fmt: skip
        else:
            raise ValueError(f"unknown workload {workload!r}")
    return model.to(device)


def step_loss(model: nn.Module, ctx: RankContext, workload: str, step: int = 0) -> torch.Tensor:
    """This rank's loss on its own inputs of ``step``."""
    generator = torch.Generator().manual_seed(97 * step + ctx.rank)
    if workload == "gpt":
        return model(*batch(ctx, step=step))[1]
    if workload == "edge":
        return model(torch.randint(0, 16, (2, 5), generator=generator).to(ctx.device)).float().sum()
    source, target = (torch.randn(2, 5, 16, generator=generator).to(ctx.device) for _ in range(2))
    return model(source, target).float().sum()


# -- policies: one description, two readings -------------------------------------------------------------------------
def known_classes() -> dict[str, type[nn.Module]]:
    """The module classes a policy description may name."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return {
        "Block": Block,
        "EdgeBlock": EdgeBlock,
        "Linear": nn.Linear,
        "BatchNorm1d": nn.BatchNorm1d,
        "_BatchNorm": _BatchNorm,
        "LayerNorm": nn.LayerNorm,
        "MultiheadAttention": nn.MultiheadAttention,
        "ModuleList": nn.ModuleList,
        "TransformerEncoderLayer": nn.TransformerEncoderLayer,
        "TransformerDecoderLayer": nn.TransformerDecoderLayer,
    }


def _match(spec: Mapping[str, Any]) -> wm.Match:
    return wm.Match(tuple(spec.get("types", ())), tuple(spec.get("paths", ())), tuple(spec.get("except_paths", ())))


def model_policy(spec: Mapping[str, Any] | None) -> wm.Policy | None:
    """The wrap model's policy for a claim's description (``{kind = "size", min_num_params = 288}``, ...)."""
    if spec is None:
        return None
    kind = spec["kind"]
    if kind == "module":
        return wm.ModuleWrap(tuple(spec["classes"]))
    if kind == "transformer":
        return wm.Transformer(tuple(spec["classes"]))
    if kind == "lambda":
        return wm.Lambda(_match(spec))
    if kind == "size":
        return wm.SizeBased(spec.get("min_num_params", wm.DEFAULT_MIN_NUM_PARAMS))
    if kind == "custom":
        rules = tuple((_match(rule), tuple(sorted(rule["kwargs"].items())) if "kwargs" in rule else True)
                      for rule in spec["rules"])  # fmt: skip
        return wm.Custom(rules)
    if kind == "or":
        return wm.Or(tuple(model_policy(p) for p in spec["policies"]))  # type: ignore[misc]
    raise ValueError(f"unknown policy kind {kind!r}")


def torch_policy(spec: Mapping[str, Any] | None, paths: Mapping[int, str],
                 classes: Mapping[str, type[nn.Module]] | None = None) -> Any:  # fmt: skip
    """The same description as torch's policy object; ``paths`` names each module of the unwrapped model,
    ``classes`` the classes it may name (`known_classes` by default)."""
    from torch.distributed.fsdp.wrap import (
        CustomPolicy,
        ModuleWrapPolicy,
        _or_policy,
        lambda_auto_wrap_policy,
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    if spec is None:
        return None
    classes = classes or known_classes()
    kind = spec["kind"]

    def selects(rule: Mapping[str, Any], module: nn.Module) -> bool:
        path = paths.get(id(module))
        wanted = tuple(classes[name] for name in rule.get("types", ()))
        chosen = isinstance(module, wanted) or path in rule.get("paths", ())
        return chosen and path not in rule.get("except_paths", ())

    if kind == "module":
        return ModuleWrapPolicy({classes[name] for name in spec["classes"]})
    if kind == "transformer":
        layers = {classes[name] for name in spec["classes"]}
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers)
    if kind == "lambda":
        return functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda module: selects(spec, module))
    if kind == "size":
        return functools.partial(size_based_auto_wrap_policy, min_num_params=spec["min_num_params"])
    if kind == "custom":
        from torch.distributed.fsdp import ShardingStrategy

        def lambda_fn(module: nn.Module) -> bool | dict[str, Any]:
            for rule in spec["rules"]:
                if selects(rule, module):
                    kwargs = rule.get("kwargs")
                    return {k: ShardingStrategy[v] for k, v in kwargs.items()} if kwargs else True
            return False

        return CustomPolicy(lambda_fn)
    if kind == "or":
        return functools.partial(_or_policy, policies=[torch_policy(p, paths, classes) for p in spec["policies"]])
    raise ValueError(f"unknown policy kind {kind!r}")


# -- what FSDP1 built -------------------------------------------------------------------------------------------------
def fsdp1_units(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Every FSDP unit of a wrapped model by name, in module order: its module's class, what its flat parameter
    holds ((name, elements), flattening order), its shared parameters' names, its parameter dtype setting and its
    sharding strategy."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = {}
    for path, module in model.named_modules():
        if not isinstance(module, FSDP):
            continue
        flat = module._handle.flat_param if module._handle is not None else None
        shared = (
            [wm.join(info.module_name, info.param_name) for info in flat._shared_param_infos]
            if flat is not None
            else []
        )
        units[unit_name(path)] = {
            "type": type(module.module).__name__,
            "params": [list(p) for p in zip(flat._fqns, flat._numels, strict=True)] if flat is not None else [],
            "shared": shared,
            "param_dtype": _dtype(module.mixed_precision.param_dtype),
            "strategy": module.sharding_strategy.name,
        }
    return units


def _dtype(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


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


def _unit_lines(wrap: wm.Wrap) -> list[str]:
    """The guide's way of writing units: ``blocks.0: 16020 in 12 parameters``, and the tensors they share."""
    lines = []
    for unit in wrap.units:
        count = len(unit.params)
        line = f"{unit.name}: {unit.numel} in {count} parameter{'s' if count != 1 else ''}"
        if unit.shared:
            line += f", shared {' '.join(unit.shared)}"
        if unit.kwargs:
            line += ", " + " ".join(f"{k}={_setting(v)}" for k, v in unit.kwargs)
        lines.append(line)
    return lines


def _setting(value: Any) -> str:
    return "None" if value is None else str(value)


def _walk_counts(wrap: wm.Wrap) -> dict[str, int]:
    """How often each walk is entered, by the model: ``_post_order_apply`` once for a _Policy (its recursion is an
    inner function), ``_recursive_wrap`` once per module it enters for a callable."""
    return {"_post_order_apply": int(wrap.walk == "post-order apply"), "_recursive_wrap": wrap.visits}


def _mp(param_dtype: str | None) -> Any:
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(param_dtype=getattr(torch, param_dtype)) if param_dtype else None


# -- claims: the units a policy forms ---------------------------------------------------------------------------------
def units_match_model(ctx: RankContext, workload: str, policies: list[dict[str, Any]], expected: list[str], *,
                      param_dtype: str | None = None, run_step: bool = True) -> dict[str, Any]:  # fmt: skip
    """For each policy (all must form the same units): the wrap model's units from the unwrapped model's tree are
    the units FSDP1 builds (module, flat-parameter contents in order, shared parameters, settings), built in the
    model's order by the model's walk; one step then runs. The units, written out, are the guide's."""
    lines: list[str] = []
    observed: dict[str, Any] = {}
    ignore = wm.MODULE_CLASSES_TO_IGNORE if param_dtype else None
    for spec in policies:
        model = build(workload, ctx.device)
        paths = module_paths(model)
        predicted = wm.wrap(tree_of(model), model_policy(spec), mixed_precision_ignore=ignore)
        wrapped, watched, _ = wrap_fsdp1(model, ctx, torch_policy(spec, paths), paths, mixed_precision=_mp(param_dtype))
        kind = spec["kind"]
        require_equal(fsdp1_units(wrapped), expected_units(predicted, param_dtype), reason="units-differ-from-model",
                      what=f"{kind} policy: the units FSDP built", policy=kind)  # fmt: skip
        require_equal(watched.built, predicted.names, reason="build-order-differs",
                      what=f"{kind} policy: the order the units' handles were built", policy=kind)  # fmt: skip
        require_equal(watched.counts, _walk_counts(predicted), reason="walk-differs",
                      what=f"{kind} policy: calls of each walk", policy=kind)  # fmt: skip
        if run_step:
            _require_step_runs(wrapped, ctx, workload, kind)
        lines = _unit_lines(predicted)
        observed[kind] = {"units": predicted.names, "walk": watched.counts}
    require_equal(lines, expected, reason="units-differ-from-guide", what="the units, written out")
    return {"units": lines, "unit_count": len(lines), "by_policy": observed}


def _require_step_runs(model: nn.Module, ctx: RankContext, workload: str, policy: str) -> None:
    try:
        step_loss(model, ctx, workload).backward()
    except RuntimeError as error:
        raise Violation("step-failed", f"{policy} policy: the step raised {error}", policy=policy,
                        error=str(error)) from error  # fmt: skip


def size_defaults(ctx: RankContext) -> dict[str, Any]:
    """``size_based_auto_wrap_policy``'s defaults are the model's: ``min_num_params`` is ``int(1e8)``, and None
    for ``force_leaf_modules`` / ``exclude_wrap_modules`` reads the function's attributes,
    ``{nn.MultiheadAttention}`` and ``{nn.ModuleList, nn.ModuleDict}``; with the defaults mini_gpt tiny is one
    unit, the root, since no module reaches 1e8 elements."""
    import inspect

    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    default = inspect.signature(size_based_auto_wrap_policy).parameters["min_num_params"].default
    attributes = {
        "min_num_params": default,
        "FORCE_LEAF_MODULES": sorted(c.__name__ for c in size_based_auto_wrap_policy.FORCE_LEAF_MODULES),
        "EXCLUDE_WRAP_MODULES": sorted(c.__name__ for c in size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES),
    }
    require_equal(attributes, {"min_num_params": wm.DEFAULT_MIN_NUM_PARAMS,
                               "FORCE_LEAF_MODULES": sorted(wm.FORCE_LEAF_MODULES),
                               "EXCLUDE_WRAP_MODULES": sorted(wm.EXCLUDE_WRAP_MODULES)},
                  reason="defaults-differ", what="size_based_auto_wrap_policy's defaults")  # fmt: skip
    model = build("gpt", ctx.device)
    paths = module_paths(model)
    wrapped, watched, _ = wrap_fsdp1(model, ctx, size_based_auto_wrap_policy, paths)
    predicted = wm.wrap(tree_of(build("gpt")), wm.SizeBased())
    require_equal(sorted(fsdp1_units(wrapped)), predicted.names, reason="units-differ-from-model",
                  what="units with every default")  # fmt: skip
    require_equal(watched.counts, _walk_counts(predicted), reason="walk-differs", what="calls of each walk")
    return {**attributes, "units": predicted.names}


# -- claims: what _auto_wrap checks ------------------------------------------------------------------------------------
def nested_wrapping_refused(ctx: RankContext, policies: list[dict[str, Any]], message: str) -> dict[str, Any]:
    """With ``blocks.0`` already an FSDP module, ``FSDP(model, auto_wrap_policy=...)`` raises ValueError from
    ``_check_nested_wrapping`` naming it, for a _Policy and a callable alike; without a policy the same nesting
    is plain manual wrapping and builds."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    seen = {}
    for spec in [*policies, None]:
        model = build("gpt", ctx.device)
        paths = module_paths(model)
        model.blocks[0] = FSDP(model.blocks[0], device_id=ctx.device, use_orig_params=True)
        kind = spec["kind"] if spec else "none"
        try:
            wrap_fsdp1(model, ctx, torch_policy(spec, paths), paths)
        except Exception as error:
            seen[kind] = _error_line(error)
        else:
            seen[kind] = "built"
    expected = {spec["kind"]: f"ValueError: {message}" for spec in policies} | {"none": "built"}
    require_equal(seen, expected, reason="nesting-not-refused", what="what each wrap of an already-wrapped child did")
    return {"outcomes": seen}


# -- claims: mixed precision's override --------------------------------------------------------------------------------
def mixed_precision_override(ctx: RankContext, policy: dict[str, Any], expected: list[str],
                             dtypes: list[str]) -> dict[str, Any]:  # fmt: skip
    """With ``MixedPrecision(param_dtype=bf16)`` every BatchNorm is a unit of its own with mixed precision off
    (the model's units, `units_match_model`), FSDP warns once naming the class, and one forward computes as the
    guide's ``dtypes`` block says: each unit's parameters, what the BatchNorm receives (its pre-hook runs after
    FSDP's cast), what the layer after it receives, and the output."""
    model = build("edge", ctx.device)
    paths = module_paths(model)
    block = {name: getattr(model.blocks[0], name) for name in ("attn", "norm", "up", "down")}  # before wrapping
    predicted = wm.wrap(tree_of(model), model_policy(policy), mixed_precision_ignore=wm.MODULE_CLASSES_TO_IGNORE)
    wrapped, watched, warned = wrap_fsdp1(
        model, ctx, torch_policy(policy, paths), paths, mixed_precision=_mp("bfloat16")
    )
    kind = policy["kind"]
    require_equal(fsdp1_units(wrapped), expected_units(predicted, "bfloat16"), reason="units-differ-from-model",
                  what=f"{kind} policy: the units FSDP built", policy=kind)  # fmt: skip
    require_equal(watched.built, predicted.names, reason="build-order-differs", what="the order units were built")
    overridden = [w for w in warned if "Both mixed precision and an auto_wrap_policy" in w]
    require(len(overridden) == 1 and "BatchNorm1d" in overridden[0], "no-override-warning",
            f"expected one warning naming BatchNorm1d, got {overridden}", observed=overridden)  # fmt: skip
    seen = _forward_dtypes(wrapped, block, ctx)
    require_equal(seen, dtypes, reason="dtypes-differ", what="dtypes in one forward")
    require_equal(_unit_lines(predicted), expected, reason="units-differ-from-guide", what="the units, written out")
    lines = _unit_lines(predicted)
    return {"units": lines, "unit_count": len(lines), "dtypes": seen}


def _forward_dtypes(wrapped: nn.Module, block: Mapping[str, nn.Module], ctx: RankContext) -> list[str]:
    """One forward of the wrapped edge model: the dtype of the parameters of block 0's modules (``block``: the
    original modules, inside whatever wrapper they now sit in) while each computes, of the BatchNorm's input and
    of the next layer's input, and of the output."""
    seen: dict[str, str] = {}

    def params_of(name: str, module: nn.Module) -> Callable[..., None]:
        def hook(_: nn.Module, args: tuple[Any, ...]) -> None:
            seen.setdefault(f"{name} parameters", _dtype(next(module.parameters()).dtype) or "")

        return hook

    def input_of(name: str) -> Callable[..., None]:
        def hook(_: nn.Module, args: tuple[Any, ...]) -> None:
            seen.setdefault(f"{name} input", _dtype(args[0].dtype) or "")

        return hook

    handles = [block["norm"].register_forward_pre_hook(input_of("blocks.0.norm")),
               block["up"].register_forward_pre_hook(input_of("blocks.0.up"))]  # fmt: skip
    for name, module in block.items():
        handles.append(module.register_forward_pre_hook(params_of(f"blocks.0.{name}", module)))
    try:
        generator = torch.Generator().manual_seed(ctx.rank)
        out = wrapped(torch.randint(0, 16, (2, 5), generator=generator).to(ctx.device))
    finally:
        for handle in handles:
            handle.remove()
    seen["output"] = _dtype(out.dtype) or ""
    order = ["blocks.0.attn parameters", "blocks.0.norm parameters", "blocks.0.norm input", "blocks.0.up parameters",
             "blocks.0.up input", "blocks.0.down parameters", "output"]  # fmt: skip
    return [f"{key}: {seen.get(key)}" for key in order]


# -- claims: a tie split across units ----------------------------------------------------------------------------------
def split_tie_breaks(ctx: RankContext, policy: dict[str, Any], expected: list[str], error: str) -> dict[str, Any]:
    """``ModuleWrapPolicy({nn.Linear})`` on mini_gpt: the model's units, and the tie it splits (the head's unit
    flattens the weight the root's embedding also registers); FSDP builds exactly that, the embedding's weight is
    then the head's 1-D shard (the head's own parameter, a view of its unit's flat parameter where the
    flat-parameter model puts this rank's slice, holding the original weight's elements there), and the first
    forward raises ``error`` on every rank."""
    model = build("gpt", ctx.device)
    paths = module_paths(model)
    tree = tree_of(model)
    predicted = wm.wrap(tree, model_policy(policy))
    original = model.tok_emb.weight.detach().flatten().clone()
    wrapped, _, _ = wrap_fsdp1(model, ctx, torch_policy(policy, paths), paths)
    require_equal(fsdp1_units(wrapped), expected_units(predicted, None), reason="units-differ-from-model",
                  what="the units FSDP built")  # fmt: skip
    ties = [f"{t.tensor} in {t.holder or ROOT}, also at {' '.join(t.outside)}" for t in predicted.split_ties]
    require(len(predicted.split_ties) == 1, "no-split-tie", f"the model splits {ties}", observed=ties)
    tie = predicted.split_ties[0]
    holder = predicted.unit(tie.holder)
    # Where the flat-parameter model puts the tied tensor in this rank's shard of the holder's flat parameter.
    names = [name for name, _ in holder.params]
    (index,) = [names.index(wm.relative(r.fqn, tie.holder)) for r in wm.registrations(tree)
                if r.tensor == tie.tensor and wm.within(r.module, tie.holder)]  # fmt: skip
    spec = fp.flat_param([fp.Param(name, (n,)) for name, n in holder.params], ctx.world_size, use_orig_params=True)
    info = spec.shard_param_infos(ctx.rank)[index]
    weight = model.tok_emb.weight
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    fsdp_units = {unit_name(path): m for path, m in wrapped.named_modules() if isinstance(m, FSDP)}
    flat = fsdp_units[holder.name]._handle.flat_param
    require(
        weight is flat._params[index],
        "tied-weight-not-the-shard",
        f"tok_emb.weight is not the Parameter {tie.holder}'s unit flattened",
        part="identity",
    )
    require_equal(tuple(weight.shape), (info.numel_in_shard,), reason="tied-weight-not-the-shard",
                  what="tok_emb.weight's shape", part="shape")  # fmt: skip
    storage = (weight.untyped_storage().data_ptr(), weight.storage_offset())
    in_flat = (flat.untyped_storage().data_ptr(), flat.storage_offset() + info.offset_in_shard)
    require(storage == in_flat, "tied-weight-not-the-shard",
            f"tok_emb.weight is no view of {tie.holder}'s flat parameter at element {info.offset_in_shard}",
            part="storage", observed=storage, expected=in_flat)  # fmt: skip
    start = info.intra_param_start_idx
    require(
        torch.equal(weight.detach(), original[start : start + info.numel_in_shard]),
        "tied-weight-not-the-shard",
        f"tok_emb.weight does not hold elements {start}.. of the original weight",
        part="values",
    )
    try:
        step_loss(wrapped, ctx, "gpt")
    except RuntimeError as raised:
        seen = str(raised).splitlines()[0]
    else:
        seen = "no error"
    require_equal(seen, error, reason="forward-did-not-fail", what="the first forward")
    lines = _unit_lines(predicted)
    require_equal(lines, expected, reason="units-differ-from-guide", what="the units, written out")
    return {"units": lines, "split_ties": ties, "embedding_shape": list(weight.shape), "error": seen}


# -- claims: FSDP2 by hand ---------------------------------------------------------------------------------------------
def _mesh(ctx: RankContext, names: tuple[str, ...] | None = None) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=names)


def fsdp2_group(module: nn.Module) -> list[str]:
    """The parameters of the group ``fully_shard`` gave ``module``, by name relative to it, in group order."""
    from torch.distributed.fsdp import fully_shard

    group = fully_shard.state(module)._fsdp_param_group
    if group is None:
        return []
    prefix = {id(m): clean(path) for path, m in module.named_modules()}
    return [wm.join(prefix[id(p._module_info.module)], p._module_info.param_name) for p in group.fsdp_params]


def fsdp2_matches_fsdp1(ctx: RankContext, workload: str, policy: dict[str, Any], expected: list[str]) -> dict[str, Any]:
    """``fully_shard`` on each module the FSDP1 policy would make a unit, in the model's build order (children
    first, the root last): each call's group holds exactly what FSDP1's unit holds (the same parameters; the
    order is FSDP2's post-order, as the model says); a step runs."""
    from torch.distributed.fsdp import fully_shard

    tree = tree_of(build(workload))
    predicted = wm.wrap(tree, model_policy(policy))
    groups = wm.fsdp2_groups(tree, [u.path for u in predicted.units])
    model = build(workload, ctx.device)
    mesh = _mesh(ctx)
    modules = dict(model.named_modules())
    observed = {}
    for unit in predicted.units:
        try:
            fully_shard(modules[unit.path], mesh=mesh)
        except Exception as error:
            raise Violation("fully-shard-failed", f"fully_shard({unit.name}) raised {type(error).__name__}: {error}",
                            unit=unit.name, error=f"{type(error).__name__}: {error}") from error  # fmt: skip
    for unit, group in zip(predicted.units, groups, strict=True):
        observed[unit.name] = fsdp2_group(modules[unit.path])
        require_equal(observed[unit.name], [name for name, _ in group.params], reason="group-differs-from-model",
                      what=f"{unit.name}: the FSDP2 group's parameters, in order", unit=unit.name)  # fmt: skip
        require_equal(sorted(observed[unit.name]), sorted(name for name, _ in unit.params),
                      reason="group-differs-from-fsdp1", what=f"{unit.name}: FSDP2's group against FSDP1's unit",
                      unit=unit.name)  # fmt: skip
    _require_step_runs(model, ctx, workload, "fully_shard")
    require_equal(_unit_lines(predicted), expected, reason="units-differ-from-guide", what="the units, written out")
    return {"groups": observed, "units": predicted.names}


def _error_line(error: BaseException) -> str:
    """An error's type and first line, without the meshes a message may print (they name the world size)."""
    return f"{type(error).__name__}: {str(error).splitlines()[0].split(': [DeviceMesh')[0]}"


def fsdp2_root_first(ctx: RankContext, errors: list[str]) -> dict[str, Any]:
    """``fully_shard(model)`` and then ``fully_shard(model.blocks[0])``: the model says the root's call shards
    every parameter and a later call on any block finds every one of the block's parameters already sharded; they
    are all DTensors by then (checked block by block, then the whole model), and the call on ``blocks.0`` takes
    them for tensor-parallel ones and raises, on a mesh without dimension names and on one with, the guide's
    ``errors``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    unwrapped = build("gpt")
    blocks = [path for path, module in unwrapped.named_modules() if isinstance(module, Block)]
    root, *later = wm.fsdp2_groups(tree_of(unwrapped), ["", *blocks])
    seen = []
    for names in (None, ("dp",)):
        model = build("gpt", ctx.device)
        fully_shard(model, mesh=_mesh(ctx, names))
        modules = dict(model.named_modules())
        for group in later:
            as_dtensors = [name for name, p in modules[group.path].named_parameters() if isinstance(p, DTensor)]
            require_equal(as_dtensors, list(group.already_sharded), reason="not-already-sharded",
                          what=f"{group.path}: its parameters that are DTensors before its own call",
                          block=group.path)  # fmt: skip
        everywhere = sorted(name for name, p in model.named_parameters() if isinstance(p, DTensor))
        require_equal(everywhere, sorted(name for name, _ in root.params), reason="not-every-parameter-sharded",
                      what="the model's parameters that are DTensors after the root's call")  # fmt: skip
        try:
            fully_shard(model.blocks[0], mesh=_mesh(ctx, names))
        except Exception as error:
            seen.append(_error_line(error))
        else:
            seen.append("no error")
    require_equal(seen, errors, reason="wrong-order-not-refused", what="the child's call after the root's")
    return {"errors": seen, "already_sharded": {group.path: len(group.already_sharded) for group in later}}


# -- claims: what a granularity costs ----------------------------------------------------------------------------------
GRANULARITIES: dict[str, dict[str, Any] | None] = {
    "one-unit": None,
    "per-block": {"kind": "module", "classes": ["Block"]},
    "per-linear": {"kind": "lambda", "types": ["Linear"], "except_paths": ["lm_head"]},
}


def _cost_line(label: str, cost: wm.Cost, units: int) -> str:
    """The guide's way of writing a granularity's cost: ``per-block: 4 units, all-gathers <= 16020, peak 142272 B,
    7 AG + 4 RS, pad 0`` (elements, bytes, collectives per step, padding elements)."""
    return (f"{label}: {units} unit{'s' if units != 1 else ''}, all-gathers <= {cost.largest_all_gather}, peak "
            f"{cost.unsharded_peak} B, {cost.collectives['all_gather']} AG + {cost.collectives['reduce_scatter']} RS, "
            f"pad {cost.padding}")  # fmt: skip


def granularity_costs(ctx: RankContext, expected: list[str], param_dtype: str | None = None) -> dict[str, Any]:
    """mini_gpt tiny as one unit, one per block, one per Linear layer (the tied head left to the root): for each,
    a steady step's largest all-gather (elements), its collectives by op, and the flat parameters' padding are
    the model's (`checks.models.wrap.cost`); the unsharded peak of the step after (torch's memory tracker) is the
    model's bytes; the lines are the guide's."""
    element_bytes = 2 if param_dtype else 4
    lines, series, observed = [], {}, {}
    for label, spec in GRANULARITIES.items():
        model = build("gpt", ctx.device)
        paths = module_paths(model)
        predicted = wm.wrap(tree_of(model), model_policy(spec))
        cost = wm.cost(predicted, ctx.world_size, element_bytes)
        wrapped, _, _ = wrap_fsdp1(model, ctx, torch_policy(spec, paths), paths, mixed_precision=_mp(param_dtype))
        run = _measure_steps(wrapped, ctx, label)
        series[label] = run.pop("series")
        seen = {"largest_all_gather": run["largest_all_gather"], "collectives": run["collectives"],
                "padding": _padding(wrapped), "unsharded_peak": run["unsharded_peak"]}  # fmt: skip
        want = {"largest_all_gather": cost.largest_all_gather, "collectives": cost.collectives,
                "padding": cost.padding, "unsharded_peak": cost.unsharded_peak}  # fmt: skip
        for key, value in want.items():
            require_equal(seen[key], value, reason=f"{key.replace('_', '-')}-differs", what=f"{label}: {key}",
                          granularity=label)  # fmt: skip
        observed[label] = seen
        lines.append(_cost_line(label, cost, len(predicted.units)))
    require_equal(lines, expected, reason="costs-differ-from-guide", what="the costs, written out")
    return {
        "costs": lines,
        "observed": observed,
        "collectives_per_step": {label: sum(seen["collectives"].values()) for label, seen in observed.items()},
        "unsharded_peak": {label: seen["unsharded_peak"] for label, seen in observed.items()},
        "series": series,
    }


def _measure_steps(model: nn.Module, ctx: RankContext, label: str) -> dict[str, Any]:
    """Step 1 (lazy initialisation), step 2 recorded (collectives, FSDP events, a memory series), step 3 under
    torch's memory tracker (peaks by category)."""
    optim = torch.optim.AdamW(model.parameters(), lr=LR)

    def one(step: int) -> None:
        step_loss(model, ctx, "gpt", step).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    one(0)
    # The events are not compared here; recording them is what `fsdp-readings timeline` draws.
    with record_comm() as comm, record_events(model, label=label), record_memory_series(model, optim) as recorder:
        recorder.mark("start")
        one(1)
        recorder.mark("after step")
    with account_memory(model, optim, peaks=True) as memory:
        one(2)
    require(memory.peak is not None, "no-peaks", f"no peak report: {memory.peak_unavailable}")
    gathers = comm.select("all_gather")
    return {
        "largest_all_gather": max(c.numel for c in gathers),
        "collectives": {op: comm.count(op) for op in ("all_gather", "reduce_scatter")},
        "unsharded_peak": memory.peak.peak.get("unsharded", 0),
        "series": recorder.series.points,
    }


def _padding(model: nn.Module) -> int:
    """Elements the flat parameters add, over every unit: padded unsharded size less the parameters'."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    total = 0
    for module in model.modules():
        if isinstance(module, FSDP) and module._handle:
            flat = module._handle.flat_param
            total += flat._padded_unsharded_size.numel() - sum(flat._numels)
    return total


# -- break-it recipes: the wrap code bent on purpose (tests/break_it/test_20_auto_wrap.py applies them) ----------------
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
