"""Checks for guide 16, FSDP2's per-parameter sharding: every parameter a ``Shard(0)`` DTensor whose local tensor
is its unpadded ``torch.chunk`` rows, the padded ``_sharded_param_data`` behind it, the all-gather's copy-in and
copy-out, and the bytes a rank holds.

The property checks take one drawn model (`checks.models.fsdp2_draws`, plain data drawn in the pytest process)
and build it here, identically on every rank. Expected values never come from FSDP: shapes, sizes and bytes from
the spec (`checks.models.fsdp2_shards`), values from an unwrapped replica built from the same seed, sliced at the
spec's rows. Every comparison is exact (``torch.equal``, or byte for byte where the all-gather runs in bytes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from checks.models import fsdp2_shards as spec
from checks.models.fsdp2_draws import describe, groups_of, params_of
from checks.ranks.context import RankContext
from checks.violation import Violation, require, require_equal

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# The guide's fixed model (its `expect nine-rows-on-four` block): dim 0 of 9 (not divisible by 4), 3 (fewer rows
# than ranks) and 0 (none), and a (9, 0) parameter with rows but no elements; fp32.
NINE: dict[str, Any] = {
    "root": [
        {"name": "w", "shape": [9, 2], "dtype": "float32"},
        {"name": "b", "shape": [3], "dtype": "float32"},
        {"name": "e", "shape": [0, 4], "dtype": "float32"},
        {"name": "z", "shape": [9, 0], "dtype": "float32"},
    ],
    "child": None,
}


# -- building a drawn model -----------------------------------------------------------------------------------------
class Bare(nn.Module):
    """A module that only holds parameters (the checks all-gather them with ``unshard``; nothing runs forward)."""

    def __init__(self, params: list[dict[str, Any]], generator: torch.Generator) -> None:
        super().__init__()
        for p in params:
            value = torch.randn(p["shape"], generator=generator).to(DTYPES[p["dtype"]])
            self.register_parameter(p["name"], nn.Parameter(value))


def build(model: dict[str, Any], seed: int = 0) -> nn.Module:
    """The drawn model, the same values on every rank (its own generator, not the global RNG)."""
    generator = torch.Generator().manual_seed(seed)
    root = Bare(model["root"], generator)
    if model["child"] is not None:
        root.c = Bare(model["child"], generator)
    return root


def wrap(ctx: RankContext, model: dict[str, Any]) -> nn.Module:
    """``fully_shard`` on the child (if any), then on the root, over a 1-D cpu mesh of all ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    module = build(model).to(ctx.device)
    if model["child"] is not None:
        fully_shard(module.c, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def fsdp_modules(module: nn.Module, model: dict[str, Any]) -> dict[str, nn.Module]:
    """The modules ``fully_shard`` was applied to, by prefix, child first (`groups_of`'s order)."""
    return {prefix: module.get_submodule(prefix) for prefix in groups_of(model)}


def fsdp_params_of(module: nn.Module) -> list[Any]:
    """The ``FSDPParam`` s of one ``fully_shard`` ed module, in its group's order."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]
    return [fsdp_param for group in groups if group is not None for fsdp_param in group.fsdp_params]


def param_groups_of(module: nn.Module) -> list[Any]:
    state = module._get_fsdp_state()
    return [g for g in (getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]) if g is not None]


def by_fqn(module: nn.Module, model: dict[str, Any]) -> dict[str, Any]:
    """Each parameter's ``FSDPParam``, by fqn, matched by identity with the module's sharded parameter."""
    found: dict[str, Any] = {}
    for prefix, sub in fsdp_modules(module, model).items():
        for fsdp_param in fsdp_params_of(sub):
            for fqn in groups_of(model)[prefix]:
                if module.get_parameter(fqn) is fsdp_param.sharded_param:
                    found[fqn] = fsdp_param
    return found


def expected_rows(replica: nn.Module, fqn: str, shape: tuple[int, ...], n: int, rank: int) -> torch.Tensor:
    """The rank's rows of the replica's parameter, as the spec places them (rules 1 and 2)."""
    start, stop = spec.row_range(shape, n, rank)
    value = replica.get_parameter(fqn).detach()
    return value[start:stop].reshape(spec.local_shape(shape, n, rank))


def expected_padded(replica: nn.Module, fqn: str, shape: tuple[int, ...], n: int, rank: int) -> torch.Tensor:
    """Rule 3: the rank's rows flattened, then zeros up to the padded chunk."""
    rows = expected_rows(replica, fqn, shape, n, rank).reshape(-1)
    padded = torch.zeros(spec.padded_shard_numel(shape, n), dtype=rows.dtype)
    padded[: rows.numel()] = rows
    return padded


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def require_same(observed: torch.Tensor, expected: torch.Tensor, *, reason: str, what: str, **details: Any) -> None:
    """Same shape, dtype and bits, or a `Violation` naming the first byte that differs."""
    observed = observed.detach().cpu()
    same_meta = observed.shape == expected.shape and observed.dtype == expected.dtype
    if same_meta and torch.equal(_bytes(observed), _bytes(expected)):
        return
    info: dict[str, Any] = {
        "observed_shape": list(observed.shape),
        "expected_shape": list(expected.shape),
        "observed_dtype": str(observed.dtype),
        "expected_dtype": str(expected.dtype),
    }
    if same_meta:
        info["byte"] = int((_bytes(observed) != _bytes(expected)).nonzero()[0])
    raise Violation(reason, f"{what} differs: {info}", what=what, **info, **details)


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


# -- (a) the DTensor shards and the padded buffer -----------------------------------------------------------------
def _check_shards(module: nn.Module, model: dict[str, Any], n: int, rank: int) -> dict[str, Any]:
    replica = build(model)
    fsdp_params = by_fqn(module, model)
    seen: dict[str, Any] = {}
    for fqn, shape, dtype in params_of(model):
        param = module.get_parameter(fqn)
        require(isinstance(param, DTensor), "not-a-dtensor", f"{fqn} is a {type(param).__name__}", fqn=fqn)
        require_equal(tuple(param.placements), (Shard(0),), reason="placement-differs", what=f"{fqn} placements")
        require_equal(param.device_mesh.mesh.tolist(), list(range(n)), reason="mesh-differs", what=f"{fqn} mesh")
        require_equal(tuple(param.shape), shape, reason="global-shape-differs", what=f"{fqn} global shape")
        local = param.to_local()
        local_shape = spec.local_shape(shape, n, rank)
        require_equal(tuple(local.shape), local_shape, reason="local-shape-differs", what=f"{fqn} local shape")
        require_same(
            local, expected_rows(replica, fqn, shape, n, rank), reason="local-values-differ", what=f"{fqn} rows"
        )
        require(fqn in fsdp_params, "no-fsdp-param", f"no FSDPParam holds {fqn}", fqn=fqn)
        fsdp_param = fsdp_params[fqn]
        require_equal(
            tuple(fsdp_param.padded_sharded_param_size),
            spec.padded_shape(shape, n),
            reason="padded-size-differs",
            what=f"{fqn} padded_sharded_param_size",
        )
        data = fsdp_param._sharded_param_data
        require_same(
            data,
            expected_padded(replica, fqn, shape, n, rank),
            reason="sharded-param-data-differs",
            what=f"{fqn} _sharded_param_data",
        )
        if data.numel():
            require(
                local.numel() == 0 or _storage(local) == _storage(data),
                "local-not-a-view",
                f"{fqn}'s local tensor is not a view of _sharded_param_data",
                fqn=fqn,
            )
        seen[fqn] = {"local": list(local.shape), "padded": data.numel(), "dtype": dtype}
    return seen


def shards_match_spec(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (a): every parameter is a ``Shard(0)`` DTensor on the mesh of all ranks, of its global shape; its
    local tensor is the spec's rows of the replica, unpadded; ``padded_sharded_param_size`` and the 1-D
    ``_sharded_param_data`` (the rows, then zeros) are the spec's; the local tensor is a view of that buffer."""
    module = wrap(ctx, example)
    seen = ctx.agreed(_check_shards, module, example, ctx.world_size, ctx.rank)
    return {"model": describe(example), "params": seen}


# -- (b) the all-gather: copy-in, the collective, copy-out --------------------------------------------------------
def _check_gathered_input(output: torch.Tensor, fqns: list[str], model: dict[str, Any], n: int) -> None:
    """Rule 4: the all-gather output is N inputs, rank by rank; each the padded chunks of the group, in order."""
    shapes = dict((fqn, shape) for fqn, shape, _ in params_of(model))
    replica = build(model)
    rows = output.view(n, -1)
    for r in range(n):
        expected = [_bytes(expected_padded(replica, fqn, shapes[fqn], n, r)) for fqn in fqns]
        whole = torch.cat(expected) if expected else torch.zeros(0, dtype=torch.uint8)
        observed = _bytes(rows[r]) if rows[r].dtype != torch.uint8 else rows[r]
        require_same(observed, whole, reason="all-gather-input-differs", what=f"rank {r}'s all-gather input", rank=r)


def _check_unsharded(module: nn.Module, fsdp_params: dict[str, Any], fqns: list[str], model: dict[str, Any], n: int):
    shapes = {fqn: shape for fqn, shape, _ in params_of(model)}
    replica = build(model)
    for fqn in fqns:
        shape, fsdp_param = shapes[fqn], fsdp_params[fqn]
        outputs = fsdp_param.all_gather_outputs
        require_equal(len(outputs), 1, reason="all-gather-outputs-differ", what=f"{fqn} all_gather_outputs")
        padded = spec.padded_shard_numel(shape, n)
        require_equal(
            outputs[0].numel(), n * padded, reason="all-gather-output-numel-differs", what=f"{fqn} all-gather output"
        )
        for r in range(n):
            require_same(
                outputs[0].view(n, -1)[r] if padded else outputs[0][:0],
                expected_padded(replica, fqn, shape, n, r),
                reason="copy-out-differs",
                what=f"{fqn}'s rows from rank {r}",
            )
        param = module.get_parameter(fqn)
        require(not isinstance(param, DTensor), "still-sharded", f"{fqn} is a DTensor after unshard", fqn=fqn)
        require(param is fsdp_param._unsharded_param, "not-the-unsharded-param", f"{fqn}", fqn=fqn)
        require_same(param, replica.get_parameter(fqn).detach(), reason="unsharded-param-differs", what=fqn)
        if param.numel():
            require(
                _storage(param)[0] == _storage(outputs[0])[0],
                "unsharded-not-a-view",
                f"{fqn} is not a view of its all-gather output",
                fqn=fqn,
            )


def _check_resharded(module: nn.Module, fsdp_params: dict[str, Any], fqns: list[str]) -> None:
    for fqn in fqns:
        fsdp_param = fsdp_params[fqn]
        require(module.get_parameter(fqn) is fsdp_param.sharded_param, "not-resharded", f"{fqn}", fqn=fqn)
        sizes = [t.untyped_storage().nbytes() for t in fsdp_param.all_gather_outputs]
        require(all(s == 0 for s in sizes), "unsharded-not-freed", f"{fqn} keeps {sizes} bytes", fqn=fqn)


def all_gather_reconstructs(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (b): for each group, ``unshard`` all-gathers one buffer whose row r is rank r's padded chunks in
    parameter order (copy-in); each parameter's all-gather output holds every rank's chunk (copy-out), and the
    module's parameter is then a plain tensor, a view of that output, bitwise the replica's; ``reshard`` puts the
    sharded DTensor back and frees the output."""
    module, n = wrap(ctx, example), ctx.world_size
    fsdp_params = by_fqn(module, example)
    gathered: dict[str, int] = {}
    for prefix, sub in fsdp_modules(module, example).items():
        fqns = groups_of(example)[prefix]
        handle = sub.unshard(async_op=True)
        results = [g._all_gather_result for g in param_groups_of(sub)]
        for result in results:
            if result is not None and result.all_gather_work is not None:
                result.all_gather_work.wait()
        outputs = [r.all_gather_output for r in results if r is not None]
        handle.wait()
        order = [fqn for fsdp_param in fsdp_params_of(sub) for fqn in fqns if fsdp_params[fqn] is fsdp_param]
        ctx.agreed(_check_gathered_input, outputs[0], order, example, n)
        ctx.agreed(_check_unsharded, module, fsdp_params, fqns, example, n)
        gathered[prefix or "root"] = outputs[0].numel() * outputs[0].element_size()
        sub.reshard()
        ctx.agreed(_check_resharded, module, fsdp_params, fqns)
    return {"model": describe(example), "all_gather_bytes": gathered}


# -- (c) memory per rank ------------------------------------------------------------------------------------------
def held_bytes(module: nn.Module, model: dict[str, Any]) -> int:
    """Bytes of the distinct live storages behind the rank's parameters: each DTensor's local tensor, each
    ``_sharded_param_data`` and each all-gather output (0 bytes while freed)."""
    storages: dict[int, int] = {}
    tensors = [p.to_local() if isinstance(p, DTensor) else p for p in module.parameters()]
    for fsdp_param in by_fqn(module, model).values():
        tensors += [fsdp_param._sharded_param_data, *fsdp_param.all_gather_outputs]
    for tensor in tensors:
        ptr, nbytes = _storage(tensor)
        if nbytes:
            storages[ptr] = nbytes
    return sum(storages.values())


def _check_memory(module: nn.Module, model: dict[str, Any], n: int, rank: int, when: str) -> dict[str, int]:
    params = [(shape, torch.empty(0, dtype=DTYPES[dtype]).element_size()) for _, shape, dtype in params_of(model)]
    expected = spec.shard_bytes(params, n)
    observed = held_bytes(module, model)
    require_equal(observed, expected, reason="memory-differs", what=f"bytes held on rank {rank} {when}", when=when)
    return {"bytes": observed, "unpadded": spec.local_bytes(params, n, rank)}


def memory_is_shard_bytes(ctx: RankContext, example: dict[str, Any]) -> dict[str, Any]:
    """Property (c): after ``fully_shard``, and again after an unshard and a reshard of every group, a rank holds
    exactly the spec's shard bytes: its padded chunks, padding included, and no second copy."""
    module = wrap(ctx, example)
    before = ctx.agreed(_check_memory, module, example, ctx.world_size, ctx.rank, "after fully_shard")
    for sub in fsdp_modules(module, example).values():
        sub.unshard()
        sub.reshard()
    ctx.agreed(_check_memory, module, example, ctx.world_size, ctx.rank, "after unshard and reshard")
    return {"model": describe(example), **before}


# -- (d) the guide's fixed model ----------------------------------------------------------------------------------
def _shape_text(shape: Any) -> str:
    return "x".join(str(d) for d in shape)


def _nine_lines(module: nn.Module, n: int, rank: int) -> dict[str, Any]:
    locals_ = {name: module.get_parameter(name).to_local() for name in ("w", "b", "e", "z")}
    shapes = " ".join(f"{name} {_shape_text(t.shape)}" for name, t in locals_.items())
    elements = sum(t.numel() for t in locals_.values())
    return {"line": f"rank {rank}: {shapes}  holds {elements} elements in {held_bytes(module, NINE)} bytes"}


def nine_rows_on_four(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """The guide's model on four ranks, line for line: each rank's local shapes, elements and bytes (distinct
    live storages), then each parameter's all-gather output (elements) and unsharded shape. The same lines are
    also written from the spec alone, and must agree."""
    n = ctx.world_size
    module = wrap(ctx, NINE)
    fsdp_params = by_fqn(module, NINE)
    lines = [entry["line"] for entry in ctx.gather(_nine_lines(module, n, ctx.rank))]
    module.unshard()
    gathered = {
        name: (fsdp_params[name].all_gather_outputs[0].numel(), tuple(module.get_parameter(name).shape))
        for name in ("w", "b", "e", "z")
    }
    module.reshard()
    lines.append(
        "all-gather: "
        + "  ".join(f"{name} {numel} -> {_shape_text(shape)}" for name, (numel, shape) in gathered.items())
    )
    shapes = [(p["name"], tuple(p["shape"])) for p in NINE["root"]]
    params = [(shape, 4) for _, shape in shapes]
    spec_lines = [
        f"rank {r}: "
        + " ".join(f"{name} {_shape_text(spec.local_shape(shape, n, r))}" for name, shape in shapes)
        + f"  holds {sum(spec.local_numel(s, n, r) for s, _ in params)} elements in {spec.shard_bytes(params, n)} bytes"
        for r in range(n)
    ]
    spec_lines.append(
        "all-gather: "
        + "  ".join(f"{name} {n * spec.padded_shard_numel(shape, n)} -> {_shape_text(shape)}" for name, shape in shapes)
    )
    for i, (seen, want) in enumerate(zip(lines, expected, strict=False)):
        require(seen == want, "layout-differs", f"line {i}: {seen!r} vs {want!r}", line=i, observed=seen, expected=want)
    require_equal(len(lines), len(expected), reason="layout-differs", what="number of lines")
    require_equal(lines, spec_lines, reason="spec-differs", what="the lines the spec gives")
    return {
        "lines": lines,
        "w_local": [line.split(": ")[1].split()[1] for line in lines[:n]],
        "bytes": [int(line.split(" in ")[1].split()[0]) for line in lines[:n]],
        "bytes_text": [line.split(" in ")[1].split()[0] for line in lines[:n]],
        "w_gathered": gathered["w"][0],
    }


# -- (e) keeping the unsharded storage across a reshard (torch 2.15's option) ----------------------------------------
def _keep_storage(module: nn.Module, keep: bool) -> None:
    """Ask every ``FSDPParam`` of the model to keep (or free) its unsharded storage on reshard: through
    ``FSDPModule.set_keep_unsharded_storage`` where torch has it (2.15), else by setting the attribute that method
    sets on each ``FSDPParam`` (``_fully_shard.py`` on 2.15), which torch before 2.15 never reads."""
    if hasattr(module, "set_keep_unsharded_storage"):
        module.set_keep_unsharded_storage(keep)
        return
    for sub in module.modules():
        if hasattr(sub, "_get_fsdp_state"):
            for fsdp_param in fsdp_params_of(sub):
                fsdp_param.keep_unsharded_storage = keep


def _output_storages(fsdp_params: dict[str, Any], fqns: list[str]) -> dict[str, tuple[int, int]]:
    return {fqn: _storage(fsdp_params[fqn].all_gather_outputs[0]) for fqn in fqns}


def _check_kept(
    module: nn.Module, fsdp_params: dict[str, Any], fqns: list[str], model: dict[str, Any], kept: bool
) -> None:
    """After a reshard asked to keep the storage: the sharded DTensor is back on the module either way; each
    all-gather output holds N padded chunks of bytes (spec) where the release keeps it, 0 bytes where it frees."""
    shapes = {fqn: (shape, DTYPES[dtype]) for fqn, shape, dtype in params_of(model)}
    n = torch.distributed.get_world_size()
    for fqn in fqns:
        fsdp_param = fsdp_params[fqn]
        require(module.get_parameter(fqn) is fsdp_param.sharded_param, "not-resharded", f"{fqn}", fqn=fqn)
        shape, dtype = shapes[fqn]
        whole = n * spec.padded_shard_numel(shape, n) * torch.empty(0, dtype=dtype).element_size()
        nbytes = fsdp_param.all_gather_outputs[0].untyped_storage().nbytes()
        if kept:
            require_equal(nbytes, whole, reason="storage-not-kept", what=f"{fqn}'s all-gather output bytes", fqn=fqn)
        else:
            require_equal(nbytes, 0, reason="unsharded-not-freed", what=f"{fqn}'s all-gather output bytes", fqn=fqn)


def keep_unsharded_storage(ctx: RankContext, example: dict[str, Any], kept: bool) -> dict[str, Any]:
    """Property (e): every ``FSDPParam`` asked to keep its unsharded storage, then each group unsharded and
    resharded, child first. With ``kept`` (2.15): the outputs keep their bytes, so a rank holds its shard bytes
    plus N times them for the groups resharded so far (spec), the next unshard reuses the same storage (same data
    pointers) and rebuilds the replica bitwise, and turning the option off frees the outputs at the next reshard.
    Without ``kept`` (before 2.15, where nothing reads the attribute): the reshard frees the outputs as always."""
    module, n = wrap(ctx, example), ctx.world_size
    fsdp_params = by_fqn(module, example)
    _keep_storage(module, True)
    params = [(shape, torch.empty(0, dtype=DTYPES[dtype]).element_size()) for _, shape, dtype in params_of(example)]
    shards = dict(zip([fqn for fqn, _, _ in params_of(example)], params, strict=True))
    held = spec.shard_bytes(params, n)
    for prefix, sub in fsdp_modules(module, example).items():
        fqns = groups_of(example)[prefix]
        sub.unshard()
        first = _output_storages(fsdp_params, fqns)
        sub.reshard()
        ctx.agreed(_check_kept, module, fsdp_params, fqns, example, kept)
        if kept:
            held += n * spec.shard_bytes([shards[fqn] for fqn in fqns], n)
        require_equal(held_bytes(module, example), held, reason="memory-differs", what=f"bytes held after {prefix!r}")
        if kept:
            sub.unshard()
            again = _output_storages(fsdp_params, fqns)
            moved = [fqn for fqn in fqns if first[fqn][1] and again[fqn][0] != first[fqn][0]]
            require(not moved, "storage-moved", f"the all-gather outputs of {moved} moved on the next unshard")
            ctx.agreed(_check_unsharded, module, fsdp_params, fqns, example, n)
            sub.reshard()
    _keep_storage(module, False)
    for sub in fsdp_modules(module, example).values():
        sub.unshard()
        sub.reshard()
    ctx.agreed(_check_memory, module, example, n, ctx.rank, "after the option is turned off")
    return {"model": describe(example), "kept": kept, "bytes_while_kept": held}


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) ------------------------
def split_like_tensor_split(original: Any, tensor: Any, num_chunks: int, dim: int) -> Any:
    """``_chunk_with_empty`` with ``torch.tensor_split``'s rule: 9 rows on 4 ranks become 3, 2, 2, 2."""
    return list(torch.tensor_split(tensor, num_chunks, dim=dim))


def pads_with_ones(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """``_init_sharded_param``, then the padding of ``_sharded_param_data`` filled with ones instead of zeros."""
    out = original(fsdp_param, *args, **kwargs)
    data, local = fsdp_param._sharded_param_data, fsdp_param.sharded_param.to_local()
    data[local.numel() :] = 1
    return out


def own_local_copy(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """``_init_sharded_param``, then a local tensor that is a copy of its rows, not a view of the padded buffer."""
    out = original(fsdp_param, *args, **kwargs)
    copy = fsdp_param.sharded_param.to_local().clone()
    requires_grad = fsdp_param.sharded_param.requires_grad
    fsdp_param.sharded_param = nn.Parameter(fsdp_param.to_sharded_dtensor(copy), requires_grad=requires_grad)
    fsdp_param._setattr_on_modules(fsdp_param.sharded_param)
    return out


def copy_out_off_by_one(original: Any, result: Any, fsdp_params: Any, *args: Any, **kwargs: Any) -> Any:
    """``foreach_all_gather_copy_out``, then 1 added to every parameter's all-gather output."""
    out = original(result, fsdp_params, *args, **kwargs)
    for fsdp_param in fsdp_params:
        for tensor in fsdp_param.all_gather_outputs:
            with torch.autograd._unsafe_preserve_version_counter(tensor):
                tensor.add_(1)
    return out


def rolled_inputs(original: Any, fsdp_params: Any) -> Any:
    """``_get_param_all_gather_inputs`` with every input rolled by one element."""
    return [[t.roll(1) for t in inputs] for inputs in original(fsdp_params)]


def one_nth(original: Any, shape: Any, world_size: int) -> int:
    """The spec's padded chunk replaced by the naive ``numel / N`` (no padding)."""
    total = 1
    for d in shape:
        total *= d
    return total // world_size


def frees_regardless(original: Any, fsdp_param: Any) -> Any:
    """``to_sharded`` as torch before 2.15 wrote it: free the unsharded storage whatever ``keep_unsharded_storage``
    says."""
    out = original(fsdp_param)
    fsdp_param.free_unsharded_param()
    return out


def honours_keep(original: Any, fsdp_param: Any) -> Any:
    """``to_sharded`` as torch 2.15 writes it, on an older torch: free only ``if not self.keep_unsharded_storage``."""
    if not getattr(fsdp_param, "keep_unsharded_storage", False):
        return original(fsdp_param)
    fsdp_param.free_unsharded_param = lambda: None
    try:
        return original(fsdp_param)
    finally:
        del fsdp_param.free_unsharded_param


def fresh_outputs(original: Any, fsdp_param: Any, *args: Any, **kwargs: Any) -> Any:
    """``init_all_gather_outputs`` that always allocates new output tensors (so the storage moves each unshard)."""
    fsdp_param.all_gather_outputs = []
    return original(fsdp_param, *args, **kwargs)
