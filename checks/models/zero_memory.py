"""Per-rank bytes by category, between steps, for every data-parallel implementation guide 13 compares.

Torch-free: the input is each parameter's unit, name and shape (registration order, a tied weight once), the world
size N, the rank and the precision; the output is what one rank holds after ``optimizer.step()`` with the
gradients still there: parameters, gradients, optimizer state (by default AdamW: ``exp_avg`` and ``exp_avg_sq`` per
element, a 4-byte fp32 ``step`` per parameter tensor it updates; `OPTIMIZERS` has Adam, Adam with amsgrad, SGD
and SGD with momentum) and, where there is one, an fp32 master copy. Each result
also says how many of those bytes are padding, so the formula's only slack is a term computed here.

The textbook per-element formulas (Ψ parameters, N ranks; fp32 AdamW 4 + 4 + 8 bytes) hold up to two terms this
model computes exactly: padding (FSDP1 flat parameters, FSDP2 dim-0 chunks, the reference's flat groups) and the
``step`` scalars (4 bytes per parameter tensor with state on this rank). ZeroRedundancyOptimizer does not pad: it
gives whole parameters to ranks (`checks.models.zero_partition`), so its slack is the partition's imbalance.

Mixed precision (bf16 compute) per implementation:

- reference ZeRO (`checks.zero`), the ZeRO paper's scheme: bf16 parameters and gradients, an fp32 master shard and
  fp32 AdamW state: 2 + 2 bytes per replicated element, 4 + 8 per sharded one;
- FSDP1 ``MixedPrecision(param_dtype=bf16)`` and FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16)``: the sharded
  parameter stays fp32 and is the only persistent copy (the bf16 one exists while unsharded); gradients are
  reduced in bf16 and cast back to fp32: the fp32 formula. FSDP1 aligns parameters to 16 bytes of the *compute*
  dtype, 8 elements instead of 4 (`checks.models.flat_param` rule 2), so its padding changes;
- DDP and ZeroRedundancyOptimizer under ``torch.autocast``: fp32 parameters, gradients and state; autocast's bf16
  copies live inside the forward only: the fp32 formula.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from checks.models.flat_param import layout
from checks.models.fsdp2_shards import local_numel, padded_shard_numel
from checks.models.zero_partition import greedy_partition

FP32 = 4
ADAM_STATE = 2 * FP32  # exp_avg, exp_avg_sq: fp32 like the parameter the optimizer updates
STEP = FP32  # AdamW's ``step``: a 0-dim fp32 tensor per parameter tensor (CPU, non-capturable)


@dataclass(frozen=True)
class Optimizer:
    """What a torch optimizer keeps per parameter tensor it updates (`torch.optim`'s lazy state, made at the first
    ``step()`` for each parameter that has a gradient): ``buffers`` tensors shaped like the parameter, in its
    dtype (fp32 here), and whether a 0-dim fp32 ``step`` comes with them."""

    name: str
    buffers: int
    step: bool
    torch_class: str  # the torch.optim class
    options: tuple[tuple[str, object], ...] = ()  # the constructor's keyword arguments that make this state

    def state_bytes(self, elements: int, tensors: int) -> int:
        """Bytes of state for ``tensors`` parameter tensors holding ``elements`` elements on this rank."""
        return FP32 * self.buffers * elements + (STEP * tensors if self.step else 0)

    @property
    def element_bytes(self) -> int:
        return FP32 * self.buffers


# Adam and AdamW: exp_avg and exp_avg_sq, a third max_exp_avg_sq with amsgrad, and step (adam.py's _init_group);
# SGD: a momentum_buffer only when momentum != 0, and no step (sgd.py's _init_group and step).
OPTIMIZERS: dict[str, Optimizer] = {
    o.name: o
    for o in (
        Optimizer("adamw", 2, True, "AdamW"),
        Optimizer("adam", 2, True, "Adam"),
        Optimizer("adam-amsgrad", 3, True, "Adam", (("amsgrad", True),)),
        Optimizer("sgd", 0, False, "SGD"),
        Optimizer("sgd-momentum", 1, False, "SGD", (("momentum", 0.9),)),
    )
}


def optimizer(name: str) -> Optimizer:
    """The `Optimizer` called ``name``; an unknown name is refused with the ones this model knows."""
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"the memory model knows no optimizer {name!r}; one of {', '.join(OPTIMIZERS)}") from None


PRECISIONS = {"fp32": 4, "bf16": 2}  # bytes per element of the compute dtype
CATEGORIES = ("params", "grads", "optim", "master")

FSDP1 = {"no-shard": False, "shard-grad-op": True, "full-shard": True}  # strategy -> shards its flat parameter
REFERENCE = {"zero1": 1, "zero2": 2, "zero3": 3, "zero3-prefetch": 3}
IMPLEMENTATIONS = ("ddp", "torch-zero", *REFERENCE, *FSDP1, "fsdp2")


@dataclass(frozen=True)
class Param:
    """A parameter: its unit, name and shape; whether it requires a gradient (``trainable``, False when frozen)
    and whether the step's backward reaches it (False: an expert no token reached)."""

    unit: str
    name: str
    shape: tuple[int, ...]
    trainable: bool = True
    reached: bool = True

    @property
    def grad(self) -> bool:
        """Autograd gives it a gradient of its own."""
        return self.trainable and self.reached

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class Memory:
    """Bytes per category on one rank, and the bytes of each category that are padding."""

    params: int
    grads: int
    optim: int
    master: int = 0
    padding: tuple[tuple[str, int], ...] = ()  # (category, bytes of padding included above)

    def by_category(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in CATEGORIES}

    def padding_bytes(self) -> dict[str, int]:
        return dict(self.padding)


def units(params: Sequence[Param]) -> dict[str, list[Param]]:
    """Parameters per unit, units in order of first appearance, parameters in registration order."""
    out: dict[str, list[Param]] = {}
    for p in params:
        out.setdefault(p.unit, []).append(p)
    return out


def per_rank(
    impl: str,
    params: Sequence[Param],
    world_size: int,
    rank: int,
    precision: str = "fp32",
    *,
    optim: str = "adamw",
    use_orig_params: bool = True,
) -> Memory:
    """What ``rank`` of ``world_size`` holds under ``impl`` (one of `IMPLEMENTATIONS`), the optimizer ``optim``
    (one of `OPTIMIZERS`); ``use_orig_params`` is FSDP1's (any other implementation refuses False)."""
    opt = optimizer(optim)
    if not use_orig_params and impl not in FSDP1:
        raise ValueError(f"use_orig_params is an FSDP1 setting; {impl!r} has none (one of {', '.join(FSDP1)})")
    if precision not in PRECISIONS:
        raise ValueError(f"precision is one of {sorted(PRECISIONS)}, not {precision!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    psi = sum(p.numel for p in params)
    if impl == "ddp":
        trained = [p for p in params if p.grad]
        grads = sum(p.numel for p in trained)
        return Memory(FP32 * psi, FP32 * grads, opt.state_bytes(grads, len(trained)))
    if impl == "torch-zero":
        return torch_zero(params, world_size, rank, opt=opt)
    if impl in REFERENCE:
        return reference(REFERENCE[impl], params, world_size, rank, precision, opt=opt)
    if impl in FSDP1:
        return fsdp1(FSDP1[impl], params, world_size, rank, precision, opt=opt, use_orig_params=use_orig_params)
    if impl == "fsdp2":
        return fsdp2(params, world_size, rank, opt=opt)
    raise ValueError(f"unknown implementation {impl!r}; one of {IMPLEMENTATIONS}")


def torch_zero(params: Sequence[Param], world_size: int, rank: int, *, opt: Optimizer = OPTIMIZERS["adamw"]) -> Memory:
    """DDP + ZeroRedundancyOptimizer: whole parameters and gradients; state for the parameters this rank owns
    that get a gradient (the partition takes every parameter, frozen ones too)."""
    psi = sum(p.numel for p in params)
    grads = sum(p.numel for p in params if p.grad)
    owned = greedy_partition([(p.name, p.numel) for p in params], world_size)[rank]
    trained = {p.name for p in params if p.grad}
    state = [n for name, n in owned if name in trained]
    return Memory(FP32 * psi, FP32 * grads, opt.state_bytes(sum(state), len(state)))


def owned_elements(params: Sequence[Param], world_size: int) -> list[int]:
    """Elements of optimizer state per rank under ZeroRedundancyOptimizer's greedy partition."""
    return [sum(n for _, n in r) for r in greedy_partition([(p.name, p.numel) for p in params], world_size)]


def _padding_in(lo: int, hi: int, end: int) -> int:
    """Elements of [lo, hi) at or past ``end`` (the end of the real data)."""
    return hi - max(lo, min(hi, end))


def reference(
    stage: int,
    params: Sequence[Param],
    world_size: int,
    rank: int,
    precision: str,
    *,
    opt: Optimizer = OPTIMIZERS["adamw"],
) -> Memory:
    """`checks.zero`: one flat group per unit, padded to a multiple of N; the optimizer over one shard per group
    (a group's shard is one tensor, padding included). Under mixed precision the fp32 master shard is what the
    optimizer updates, whatever its state."""
    width = PRECISIONS[precision]
    whole = shard = whole_pad = shard_pad = 0
    frozen = sum(p.numel for p in params if not p.trainable)  # outside every group: whole on every rank
    groups = units([p for p in params if p.trainable])
    for members in groups.values():
        numel = sum(p.numel for p in members)
        padded = -(-numel // world_size) * world_size
        c = padded // world_size
        whole, shard = whole + padded, shard + c
        whole_pad += padded - numel
        shard_pad += _padding_in(rank * c, (rank + 1) * c, numel)
    params_elems, params_pad = (shard, shard_pad) if stage == 3 else (whole, whole_pad)
    grads_elems, grads_pad = (whole, whole_pad) if stage == 1 else (shard, shard_pad)
    master = FP32 * shard if width != FP32 else 0
    padding = (
        ("params", width * params_pad),
        ("grads", width * grads_pad),
        ("optim", opt.element_bytes * shard_pad),
        ("master", FP32 * shard_pad if master else 0),
    )
    optim = opt.state_bytes(shard, len(groups))
    return Memory(width * (params_elems + frozen), width * grads_elems, optim, master, padding)


def fsdp1(
    sharded: bool,
    params: Sequence[Param],
    world_size: int,
    rank: int,
    precision: str,
    *,
    opt: Optimizer = OPTIMIZERS["adamw"],
    use_orig_params: bool = True,
) -> Memory:
    """FSDP1, one unit per `Param.unit`: fp32 flat parameter and gradient (its shard, or the whole under
    NO_SHARD, padding included). With ``use_orig_params=True`` the optimizer updates the original parameters'
    views, so its state has no padding, and a parameter with no element on this rank has no gradient, hence no
    state. With False it updates each unit's `FlatParameter` itself: one state per unit, over the whole flat
    shard, padding included, and the flat parameter is not aligned (`checks.models.flat_param`, rule 2)."""
    width = PRECISIONS[precision]
    flat = pad = state = tensors = grads = grads_pad = 0
    for members in units(params).values():
        lay = layout([p.numel for p in members], width, world_size, sharded=sharded, align=use_orig_params)
        if sharded:
            lo, hi = lay.shard_range(rank)
            held, real = hi - lo, sum(lay.in_shard(rank))
            slices = lay.in_shard(rank)
        else:
            held, real = lay.padded_numel, sum(lay.numels)
            slices = list(lay.numels)
        flat, pad = flat + held, pad + held - real
        if not any(p.grad for p in members):
            continue  # no view got a gradient: the flat parameter has none, and nothing has state
        grads, grads_pad = grads + held, grads_pad + held - real
        # Every view of a flat gradient that requires one gets it, zeros where no input reached it
        # (`_use_sharded_grad_views`); a frozen one gets None.
        local = [k for k, p in zip(slices, members, strict=True) if k and p.trainable]
        if not use_orig_params:
            local = [held]  # the flat shard is the one tensor the optimizer sees
        state, tensors = state + sum(local), tensors + len(local)
    state_pad = 0 if use_orig_params else opt.element_bytes * pad
    padding = (("params", FP32 * pad), ("grads", FP32 * grads_pad), ("optim", state_pad), ("master", 0))
    return Memory(FP32 * flat, FP32 * grads, opt.state_bytes(state, tensors), 0, padding)


def fsdp2(params: Sequence[Param], world_size: int, rank: int, *, opt: Optimizer = OPTIMIZERS["adamw"]) -> Memory:
    """FSDP2: each parameter split on dim 0, every rank's chunk padded to ceil(d0 / N) rows (parameters and
    gradients); the optimizer's state is the DTensor's local, unpadded rows; a parameter that gets no gradient
    has neither (FSDP2 reduce-scatters only the parameters that have one)."""
    padded = sum(padded_shard_numel(p.shape, world_size) for p in params)
    local = sum(local_numel(p.shape, world_size, rank) for p in params)
    trained = [p for p in params if p.grad]
    grads = sum(padded_shard_numel(p.shape, world_size) for p in trained)
    state = sum(local_numel(p.shape, world_size, rank) for p in trained)
    pad, grads_pad = FP32 * (padded - local), FP32 * (grads - state)
    padding = (("params", pad), ("grads", grads_pad), ("optim", 0), ("master", 0))
    return Memory(FP32 * padded, FP32 * grads, opt.state_bytes(state, len(trained)), 0, padding)


def textbook(stage: int, psi: int, world_size: int, precision: str = "fp32") -> dict[str, float]:
    """The seeds' formulas, per category, without padding or step scalars: fp32 4 + 4 + 8 bytes per element
    (seed 002), mixed precision 2 + 2 + 12 (seed 000, the master weights counted with the optimizer state).
    Stage 0 is DDP."""
    p, g, k = (4, 4, 8) if precision == "fp32" else (2, 2, 12)
    n = world_size
    return {
        "params": p * psi / (n if stage >= 3 else 1),
        "grads": g * psi / (n if stage >= 2 else 1),
        "optim": k * psi / (n if stage >= 1 else 1),
    }
