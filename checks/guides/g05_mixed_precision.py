"""Checks for guide 05, mixed precision and buffers."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision

from checks.naming import ROOT, clean
from checks.probes.comm import record_comm
from checks.probes.expect import assert_sequence
from checks.ranks.context import RankContext
from checks.violation import require, require_equal
from checks.workloads.gpt import batch, fsdp1_gpt, padded_sizes, units

BF16 = MixedPrecision(param_dtype=torch.bfloat16)
BF16_EPS = 2.0**-7  # spacing of bfloat16 numbers in [1, 2): 8 significant bits
FULL_PREC_IN_EVAL = "FSDP_USE_FULL_PREC_IN_EVAL"


def _linear_stack(ctx: RankContext, mixed_precision: MixedPrecision | None) -> FSDP:
    """Three Linear layers on float inputs, each its own unit, the stack the root."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        stack = nn.Sequential(nn.Linear(3, 8), nn.Linear(8, 8), nn.Linear(8, 2)).to(ctx.device)
    for i, layer in enumerate(stack):
        stack[i] = FSDP(layer, device_id=ctx.device, mixed_precision=mixed_precision)
    return FSDP(stack, device_id=ctx.device, mixed_precision=mixed_precision)


def _require_input_dtypes(model: nn.Module, expected: dict[str, torch.dtype]) -> dict[str, str]:
    """Pre-hooks on each unit's wrapped module (they run after FSDP's own pre-forward, i.e. on what the module's
    compute receives) that fail at the first input of the wrong dtype, before the compute can crash on it."""
    seen: dict[str, str] = {}
    for name, unit in units(model).items():

        def check(module: nn.Module, args: tuple, name: str = name) -> None:
            dtype = args[0].dtype
            seen[name] = str(dtype)
            message = f"unit {name} received {dtype}, expected {expected[name]}"
            require(dtype == expected[name], "input-dtype", message, unit=name, observed=str(dtype))

        unit._fsdp_wrapped_module.register_forward_pre_hook(check)
    return seen


def inputs_reach_units_in_bf16(ctx: RankContext) -> dict[str, dict[str, str]]:
    """Float inputs are cast by the root, so every unit of a Linear stack computes on bf16; mini_gpt's integer
    token ids reach its root unchanged and its blocks receive bf16 activations."""
    stack = _linear_stack(ctx, BF16)
    seen_stack = _require_input_dtypes(stack, {name: torch.bfloat16 for name in units(stack)})
    stack(torch.randn(4, 3, device=ctx.device))
    gpt = fsdp1_gpt(ctx, mixed_precision=BF16)
    expected = {name: torch.bfloat16 for name in units(gpt)} | {ROOT: torch.int64}
    seen_gpt = _require_input_dtypes(gpt, expected)
    x, _ = batch(ctx)
    gpt(x)
    ran = set(seen_stack) == set(units(stack)) and set(seen_gpt) == set(units(gpt))
    require(ran, "unit-never-ran", "a unit never ran")
    return {"linear stack": seen_stack, "mini_gpt": seen_gpt}


LOW_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def bf16_changes_flat_layout(ctx: RankContext, stated: dict[str, int], low: str = "bf16") -> dict[str, list[int]]:
    """With use_orig_params, alignment is 16 bytes of the compute dtype: a 2-byte ``param_dtype`` (bf16 or fp16)
    aligns parameters to 8 elements instead of fp32's 4, so the flat parameters (and every all-gather) get
    longer."""
    sizes = {}
    low_policy = MixedPrecision(param_dtype=LOW_DTYPES[low])
    for label, mixed_precision, element_bytes in (("fp32", None, 4), (low, low_policy, 2)):
        model = fsdp1_gpt(ctx, mixed_precision=mixed_precision)
        x, _ = batch(ctx)
        with record_comm() as comm:
            model(x)
        sizes[label] = [c.numel for c in comm.select("all_gather")]
        assert_sequence(
            sizes[label],
            list(padded_sizes(ctx.world_size, element_bytes).values()),
            what=f"{label} all-gather sizes",
            reason="all-gather-sizes",
        )
    got = {"root fp32": sizes["fp32"][0], "block fp32": sizes["fp32"][1],
           f"root {low}": sizes[low][0], f"block {low}": sizes[low][1]}  # fmt: skip
    require_equal(got, stated, reason="differs-from-guide", what="flat-parameter sizes (the guide states them)")
    return sizes


def collectives_move_bf16(ctx: RankContext) -> dict[str, int]:
    """With param_dtype=bf16 (and no reduce_dtype) every all-gather and every reduce-scatter moves bf16, each of
    the bf16-aligned flat parameter's size, at 2 bytes per element."""
    model = fsdp1_gpt(ctx, mixed_precision=BF16)
    x, y = batch(ctx)
    with record_comm() as comm:
        model(x, y)[1].backward()
    kinds = ("all_gather", "reduce_scatter")
    wrong = [c.describe() for c in comm if c.op in kinds and c.dtype != "torch.bfloat16"]
    require(not wrong, "not-bf16", "collectives not in bf16:\n" + "\n".join(wrong), observed=wrong)
    spec = list(padded_sizes(ctx.world_size, element_bytes=2).values())
    sizes = set(spec)
    for record in comm.select("all_gather") + comm.select("reduce_scatter"):
        message = f"{record.describe()}: not a bf16-aligned flat parameter size {sorted(sizes)}"
        require(record.numel in sizes, "not-a-bf16-size", message, observed=record.numel)
        require(record.nbytes == 2 * record.numel, "bytes-per-element", f"{record.describe()}: {record.nbytes} bytes")
    counts = {kind: comm.count(kind) for kind in kinds}
    expected_counts = {"all_gather": 7, "reduce_scatter": len(spec)}
    require_equal(counts, expected_counts, reason="collective-counts", what="collective counts")
    return {kind: comm.nbytes(kind) for kind in kinds}


def reduce_scatters_in_reduce_dtype(ctx: RankContext) -> dict[str, int]:
    """With param_dtype=bf16 and reduce_dtype=fp32, all-gathers move bf16 and reduce-scatters fp32 (the gradient is
    cast up before the reduce-scatter), all of the bf16-aligned lengths: alignment follows param_dtype only."""
    model = fsdp1_gpt(ctx, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    x, y = batch(ctx)
    with record_comm() as comm:
        model(x, y)[1].backward()
    expected = {"all_gather": ("torch.bfloat16", 2), "reduce_scatter": ("torch.float32", 4)}
    wrong = [c.describe() for c in comm if c.op in expected and (c.dtype, c.nbytes // c.numel) != expected[c.op]]
    require(not wrong, "reduce-dtype", "collectives in the wrong dtype:\n" + "\n".join(wrong), observed=wrong)
    sizes = set(padded_sizes(ctx.world_size, element_bytes=2).values())
    off = [c.describe() for c in comm if c.op in expected and c.numel not in sizes]
    require(not off, "not-a-bf16-size", f"not a bf16-aligned flat-parameter length {sorted(sizes)}: {off}")
    counts = {op: comm.count(op) for op in expected}
    require(all(counts.values()), "no-collectives", f"nothing to check: {counts}", observed=counts)
    return {op: comm.nbytes(op) for op in expected}


def params_and_grads_stay_fp32(ctx: RankContext) -> dict[str, str]:
    """After forward, backward and an optimizer step under param_dtype=bf16, every parameter, gradient and flat
    parameter is fp32 again: bf16 exists only while a unit is unsharded."""
    model = fsdp1_gpt(ctx, mixed_precision=BF16)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = batch(ctx)
    model(x, y)[1].backward()
    dtypes = {}
    for name, param in model.named_parameters():
        dtypes[clean(name)] = str(param.dtype)
        if param.grad is not None:
            dtypes[f"{clean(name)}.grad"] = str(param.grad.dtype)
    optim.step()
    for name, unit in units(model).items():
        dtypes[f"{name} flat parameter"] = str(unit._handle.flat_param.dtype)
    dtypes |= {f"{clean(n)} after step": str(p.dtype) for n, p in model.named_parameters()}
    require(any(k.endswith(".grad") for k in dtypes), "no-gradient", "no parameter has a gradient on this rank")
    wrong = {k: v for k, v in dtypes.items() if v != "torch.float32"}
    require(not wrong, "not-fp32", f"not fp32 after the step: {wrong}", observed=wrong)
    return dtypes


def bf16_logits_close_to_fp32(ctx: RankContext, seeds: list[int], eps_multiple: float) -> list[float]:
    """Same weights, same batch: logits with param_dtype=bf16 are within ``eps_multiple`` bf16 epsilons of the
    largest fp32 logit, and differ from fp32 at all (the comparison really compares two precisions)."""
    ratios = []
    for seed in seeds:
        reference = fsdp1_gpt(ctx, seed=seed)
        model = fsdp1_gpt(ctx, seed=seed, mixed_precision=BF16)
        x, _ = batch(ctx, step=seed)
        with torch.no_grad():
            exact, low = reference(x)[0], model(x)[0]
        message = f"seed {seed}: mixed-precision logits are {low.dtype}"
        require(low.dtype == torch.bfloat16, "logits-not-bf16", message, observed=str(low.dtype))
        error = (exact - low.float()).abs().max().item()
        scale = exact.abs().max().item()
        ratio = error / (BF16_EPS * scale)
        message = (
            f"seed {seed}: max |fp32 - bf16| = {error:.3g} is {ratio:.2f} bf16 epsilons of the largest logit "
            f"{scale:.3g}; the guide allows (0, {eps_multiple}]"
        )
        require(0 < ratio <= eps_multiple, "logits-out-of-bound", message, seed=seed, ratio=ratio)
        ratios.append(round(ratio, 3))
    return ratios


class _Scaled(nn.Module):
    """A Linear with a float buffer it multiplies by and an integer counter buffer it increments."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.register_buffer("scale", torch.full((width,), 0.5))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x) * self.scale


def buffers_take_owner_dtype_at_lazy_init(ctx: RankContext) -> dict[str, dict[str, str]]:
    """Buffers are cast once, at lazy init: each float buffer to its *owning* unit's buffer_dtype (the child's
    setting wins over the root's), integer buffers never."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(_Scaled(4), _Scaled(4)).to(ctx.device)
    model[1] = FSDP(model[1], device_id=ctx.device, mixed_precision=MixedPrecision(buffer_dtype=torch.float16))
    root = FSDP(model, device_id=ctx.device, mixed_precision=MixedPrecision(buffer_dtype=torch.bfloat16))

    def buffer_dtypes() -> dict[str, str]:
        return {clean(name): str(b.dtype) for name, b in root.named_buffers()}

    before = buffer_dtypes()
    root(torch.randn(2, 4, device=ctx.device))
    after = buffer_dtypes()
    expected_before = {"0.scale": "torch.float32", "0.calls": "torch.int64", "1.scale": "torch.float32",
                       "1.calls": "torch.int64"}  # fmt: skip
    expected_after = {"0.scale": "torch.bfloat16", "0.calls": "torch.int64", "1.scale": "torch.float16",
                      "1.calls": "torch.int64"}  # fmt: skip
    require_equal(before, expected_before, reason="cast-early", what="buffer dtypes before the first forward")
    require_equal(after, expected_after, reason="buffer-dtypes", what="buffer dtypes after the first forward")
    # A cast at a later forward would be invisible on buffers already in their computation dtype (`.to` returns
    # the tensor itself). Put the float buffers back in fp32: a cast to the owners' dtypes shows.
    for buffer in root.buffers():
        if buffer.is_floating_point():
            buffer.data = buffer.data.float()
    moved = {name: "torch.float32" if name.endswith("scale") else dtype for name, dtype in expected_after.items()}
    root(torch.randn(2, 4, device=ctx.device))
    later = buffer_dtypes()
    require_equal(later, moved, reason="cast-again", what="buffer dtypes after a later training forward")
    return {"before": before, "after": after, "after a later forward": later}


def buffers_full_precision_in_eval(ctx: RankContext) -> dict[str, dict[str, str]]:
    """With FSDP_USE_FULL_PREC_IN_EVAL=1 and parameter mixed precision, an eval forward casts every float buffer
    back to its original dtype, and the next training forward casts each to its owner's buffer_dtype again."""
    previous = os.environ.get(FULL_PREC_IN_EVAL)
    os.environ[FULL_PREC_IN_EVAL] = "1"  # read once, when each unit and handle is built
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = nn.Sequential(_Scaled(4), _Scaled(4)).to(ctx.device)
        child = MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.float16)
        model[1] = FSDP(model[1], device_id=ctx.device, mixed_precision=child)
        parent = MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
        root = FSDP(model, device_id=ctx.device, mixed_precision=parent)
    finally:
        if previous is None:
            os.environ.pop(FULL_PREC_IN_EVAL)
        else:
            os.environ[FULL_PREC_IN_EVAL] = previous

    def buffer_dtypes() -> dict[str, str]:
        return {clean(name): str(b.dtype) for name, b in root.named_buffers()}

    owners = {"0.scale": "torch.bfloat16", "0.calls": "torch.int64", "1.scale": "torch.float16",
              "1.calls": "torch.int64"}  # fmt: skip
    original = {"0.scale": "torch.float32", "0.calls": "torch.int64", "1.scale": "torch.float32",
                "1.calls": "torch.int64"}  # fmt: skip
    seen = {}
    for label, training, expected, reason in (
        ("training", True, owners, "buffer-dtypes"),
        ("eval", False, original, "eval-not-full-precision"),
        ("training again", True, owners, "not-restored"),
    ):
        root.train(training)
        root(torch.randn(2, 4, device=ctx.device))
        seen[label] = buffer_dtypes()
        require_equal(seen[label], expected, reason=reason, what=f"buffer dtypes after a forward in {label} mode")
    return seen


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) --------------


def root_input_uncast(original: Any, state: Any, module: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """``_root_cast_forward_input`` that leaves the inputs as they are."""
    return args, kwargs


def align_in_fp32(original: Any, unsharded_dtype: Any) -> int:
    """``_get_aligned_numel`` that always counts the 16 bytes in fp32 elements."""
    import torch

    return original(torch.float32)


def gather_then_scale(original: Any, handle: Any, padded_unsharded_flat_param: Any) -> Any:
    """``FlatParamHandle._all_gather_flat_param`` whose low-precision results are off by a factor 1 + 2^-5 (a
    lossy low-precision path; full-precision all-gathers are left alone)."""
    import torch

    out = original(handle, padded_unsharded_flat_param)
    if out.dtype != torch.float32:
        out.mul_(1 + 2**-5)
    return out


def buffers_all_in_root_dtype(original: Any, state: Any, root_module: Any) -> tuple[Any, Any]:
    """``_get_buffers_and_dtypes_for_computation`` where the root's buffer_dtype wins over each owner's."""
    buffers, _ = original(state, root_module)
    return buffers, [state.mixed_precision.buffer_dtype] * len(buffers)


def reduce_dtype_ignored(original: Any, handle: Any, mp_param_dtype: Any, mp_reduce_dtype: Any) -> None:
    """``FlatParamHandle._init_param_reduce_dtypes`` that ignores ``reduce_dtype``: gradients are then reduced in
    ``param_dtype`` whatever the policy says."""
    original(handle, mp_param_dtype, None)


def buffer_casts_down_only(original: Any, buffers: Any, buffer_dtypes: Any, device: Any) -> None:
    """``_cast_buffers_to_dtype_and_device`` that refuses casts to full precision (fp32), and only those."""
    import torch

    if any(dtype == torch.float32 for dtype in buffer_dtypes):
        return
    original(buffers, buffer_dtypes, device)


def root_pre_forward_casting_buffers(original: Any, state: Any, module: Any, args: Any, kwargs: Any) -> Any:
    """``_root_pre_forward`` that, after its work, casts the buffers to their computation dtypes again: a cast at
    every training forward instead of once at lazy init."""
    from torch.distributed.fsdp import _runtime_utils

    out = original(state, module, args, kwargs)
    if state._is_root and module.training:
        buffers, dtypes = _runtime_utils._get_buffers_and_dtypes_for_computation(state, module)
        _runtime_utils._cast_buffers_to_dtype_and_device(buffers, dtypes, state.compute_device)
    return out
