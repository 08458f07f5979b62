"""Seed 001's standard recipe as a function (torch-free): walk DDP → ZeRO-1 → ZeRO-2 → ZeRO-3 / FSDP → + tensor
parallel inside a node → + pipeline parallel across nodes, and stop at the first step whose memory fits one GPU,
keeping the numbers that decided every step.

What "fits" means: the bytes a GPU holds by category, plus a reserve the caller gives for what is not modelled
(activations, the allocator's slack, NCCL's buffers), are at most the GPU's memory. The categories:

- ``params``, ``grads``, ``optim`` (AdamW's state and any fp32 master), between steps: `checks.models.cost.memory`,
  exact per module (guide 13's model) or the closed form for a bare count. The data-parallel steps are the
  reference ZeRO (`checks.zero`, the seeds' and the ZeRO paper's scheme; under mixed precision 2 + 2 + 12 bytes);
- ``working``, what a sharded step must also hold while it computes, a lower bound: ZeRO-2 one unit's unsharded
  gradient (each unit's gradients stay whole until its reduce-scatter, `checks.zero.zero2`); ZeRO-3 the root's
  parameters, kept unsharded from forward to backward (guide 21's kept root), beside one more unit's unsharded
  parameters and gradient, or the root's gradient. Prefetching holds one more unit; that is not counted. A bare
  parameter count has no units, so its working memory is not known and counts 0.

The steps, each tried only when the one before does not fit:

1. DDP; 2. ZeRO-1 (shards the optimizer state over all N GPUs); 3. ZeRO-2 (and the gradients);
4. ZeRO-3 (and the parameters). With several nodes and an inter-node link slower than the intra-node one (seed
   000's "limited bandwidth" row) the parameters are sharded inside a node only and replicated across nodes
   (HSDP: FSDP's HYBRID_SHARD): the all-gathers stay on the fast link, and only an all-reduce of each GPU's
   gradient shard crosses nodes. ZeRO-1 and ZeRO-2 stay sharded over all N: their reduce-scatter and all-gather
   send what DDP's all-reduce sends (guide 15), so a node-local ZeRO-1 would save no inter-node byte.
5. Tensor parallel of degree t inside a node (t divides the GPUs per node), FSDP over the other GPUs on each
   parameter's tensor-parallel shard (guide 21's 2D). It divides the working memory by t; it cannot shrink the
   sharded state, which is 1/(dp·t) of the model either way. So it is tried only when step 4 failed on working
   memory: one gathered unit too big for a GPU, "one matmul too big" in the seed's words.
6. Pipeline parallel across nodes: p stages (p divides the nodes), consecutive units per stage (the root's
   parameters on the first), each stage sharded as in step 4 or 5 over its GPUs. It helps only when ZeRO-3 is
   kept inside a node: sharded over all N, the state is already as small as it gets.

Communication per step is priced per link level with the ring model of `checks.models.cost` (summed, not
overlapped): a ring over several nodes crosses the inter-node link at every step; tensor parallelism all-reduces
activations inside a node (`checks.models.tensor_parallel`, 4 per transformer block); pipeline parallelism sends
m activations forward and m gradients back across each cut (`checks.models.pipeline`), priced on the inter-node
link. Both need the model's shape (layers, d_model) and the tokens a replica runs per step.

`in_torch` names torch's implementation of the chosen data-parallel step and, where it holds more than the
reference, how much: DDP's buckets (another 4 bytes per parameter by default, guides 13 and 19),
ZeroRedundancyOptimizer under autocast (fp32 parameters and gradients), SHARD_GRAD_OP's parameters kept unsharded
from forward to backward (guide 13).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from checks.models import cost, pipeline, tensor_parallel
from checks.models.comm_volume import Op, Volume
from checks.models.cost import HALF, Link, Plan, PlanError
from checks.models.zero_memory import FP32, Param, units
from checks.naming import ROOT

CATEGORIES = ("params", "grads", "optim", "working")
INTRA, INTER = "intra-node", "inter-node"
DATA_PARALLEL = {1: "ddp", 2: "zero1", 3: "zero2", 4: "zero3"}
NAMES = {1: "DDP", 2: "ZeRO-1", 3: "ZeRO-2", 4: "ZeRO-3 / FSDP", 5: "+ tensor parallel", 6: "+ pipeline parallel"}


@dataclass(frozen=True)
class Cluster:
    """GPUs of ``gpu_memory`` bytes, ``gpus_per_node`` on each of ``nodes`` nodes, and the two links."""

    gpu_memory: Fraction
    gpus_per_node: int
    nodes: int = 1
    intra: Link = cost.DEFAULT_LINK
    inter: Link = cost.DEFAULT_LINK

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise PlanError(f"a cluster needs at least one GPU on one node, not {self.gpus_per_node} × {self.nodes}")
        if self.gpu_memory <= 0:
            raise PlanError(f"a GPU's memory must be positive, not {self.gpu_memory} bytes")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def limited(self) -> bool:
        """Seed 000's "limited bandwidth across nodes": several nodes, the link between them slower."""
        return self.nodes > 1 and self.inter.bandwidth < self.intra.bandwidth


@dataclass(frozen=True)
class Shape:
    """What tensor and pipeline parallelism's traffic depends on: a transformer's blocks and width."""

    n_layer: int
    d_model: int
    hidden: int  # the MLP's inner width


@dataclass(frozen=True)
class Job:
    params: int | tuple[Param, ...]
    cluster: Cluster
    precision: str = "fp32"
    optimizer_bytes: Fraction | None = None
    reserve: Fraction = Fraction(0)  # bytes per GPU for what is not modelled (activations, workspace)
    shape: Shape | None = None
    tokens: int | None = None  # tokens one data-parallel replica runs per step
    microbatches: int = 8
    root: str = ROOT
    optimizer: str = "adamw"  # a `zero_memory.OPTIMIZERS` name

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", {"bf16": "mixed", "fp16": "mixed"}.get(self.precision, self.precision))
        if self.precision not in cost.PRECISIONS:
            raise PlanError(f"precision is one of {', '.join(cost.PRECISIONS)}, not {self.precision!r}")
        if self.reserve < 0:
            raise PlanError(f"the reserve cannot be negative: {self.reserve} bytes")
        if self.tokens is not None and self.tokens < 1:
            raise PlanError(f"tokens per step must be positive, not {self.tokens}")
        if self.microbatches < 1:
            raise PlanError(f"microbatches must be at least 1, not {self.microbatches}")

    @property
    def available(self) -> Fraction:
        return Fraction(self.cluster.gpu_memory) - self.reserve

    @property
    def per_module(self) -> bool:
        return isinstance(self.params, tuple)


@dataclass(frozen=True)
class Layout:
    """Where a step puts the model: a data-parallel stage sharded over ``shard`` GPUs, ``tp``-way tensor
    parallel, ``pp`` pipeline stages, and replicas of all that across the rest."""

    stage: int  # 0 DDP … 3 ZeRO-3
    shard: int  # GPUs the state is sharded over (1 for DDP)
    tp: int = 1
    pp: int = 1
    hybrid: bool = False  # ZeRO-3 inside a node, replicated across nodes

    def describe(self, cluster: Cluster) -> str:
        parts = [
            ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"][self.stage] + (f" over {self.shard} GPUs" if self.stage else ""),
        ]
        if self.hybrid:
            parts[0] += f" in a node, {self.replicas(cluster)} replicas (HSDP)"
        if self.tp > 1:
            parts.append(f"TP {self.tp}")
        if self.pp > 1:
            parts.append(f"PP {self.pp}")
        return " · ".join(parts)

    def replicas(self, cluster: Cluster) -> int:
        return cluster.world_size // (max(self.shard, 1) * self.tp * self.pp)


@dataclass(frozen=True)
class Traffic:
    """One step's communication on one link level, for one job of the layout."""

    level: str  # INTRA | INTER
    what: str  # "data parallel", "tensor parallel", "pipeline"
    ops: str  # "4 AG, 3 AG, 4 RS" …
    sent: Fraction | None  # bytes each GPU sends (None: not priced, see note)
    seconds: Fraction | None
    note: str = ""


@dataclass(frozen=True)
class Attempt:
    step: int
    layout: Layout | None  # None: the step was not tried
    memory: dict[str, Fraction] = field(default_factory=dict)
    traffic: tuple[Traffic, ...] = ()
    largest: str = ""  # the tensor that sets the working memory
    verdict: str = ""  # why it fits, why not, and what the next step does (or why this one was skipped)

    @property
    def name(self) -> str:
        return NAMES[self.step]

    @property
    def total(self) -> Fraction:
        return sum(self.memory.values(), Fraction(0))

    @property
    def tried(self) -> bool:
        return self.layout is not None


@dataclass(frozen=True)
class Recommendation:
    job: Job
    attempts: tuple[Attempt, ...]
    chosen: Attempt | None

    @property
    def fits(self) -> bool:
        return self.chosen is not None


# -- what a layout holds ------------------------------------------------------------------------------------------
def widths(job: Job, stage: int) -> tuple[int, int]:
    """Bytes per element of the unsharded parameters and gradients a step computes with: the reference ZeRO's
    2-byte ones under mixed precision (DDP's autocast keeps fp32, `checks.models.cost`)."""
    half = job.precision == "mixed" and stage >= 1
    return (HALF, HALF) if half else (FP32, FP32)


def tp_local(params: tuple[Param, ...], tp: int) -> tuple[Param, ...]:
    """Each parameter as one of ``tp`` tensor-parallel ranks holds it: a matrix split on dim 0 (column-wise
    Linear, vocab-parallel Embedding) or else dim 1 (row-wise Linear), as guide 21's plan does; a vector (a bias,
    a norm) counted whole, an upper bound: a column-wise bias is split too."""
    if tp == 1:
        return params
    out = []
    for p in params:
        shape = list(p.shape)
        if len(shape) >= 2:
            dim = 0 if shape[0] % tp == 0 else 1 if shape[1] % tp == 0 else None
            if dim is not None:
                shape[dim] //= tp
        out.append(Param(p.unit, p.name, tuple(shape)))
    return tuple(out)


def stages_of(params: tuple[Param, ...], pp: int, root: str) -> list[tuple[Param, ...]]:
    """Consecutive units per stage, as equal in count as they split (the first stages take one more), the
    root's parameters on the first stage."""
    grouped = units(params)
    layers = [u for u in grouped if u != root]
    if len(layers) < pp:
        raise PlanError(f"{len(layers)} units cannot fill {pp} pipeline stages")
    base, extra = divmod(len(layers), pp)
    out, start = [], 0
    for s in range(pp):
        count = base + (s < extra)
        members = [p for u in layers[start : start + count] for p in grouped[u]]
        if s == 0 and root in grouped:
            members = grouped[root] + members
        out.append(tuple(members))
        start += count
    return out


def working(job: Job, params: tuple[Param, ...], stage: int) -> tuple[Fraction, str]:
    """The working memory of ``params`` at ``stage`` (module docstring), and the tensor that sets it."""
    if stage < 2 or not params:
        return Fraction(0), ""
    pw, gw = widths(job, stage)
    grouped = units(params)
    numel = {u: sum(p.numel for p in m) for u, m in grouped.items()}
    if stage == 2:
        unit = max(numel, key=lambda u: numel[u])
        return Fraction(gw * numel[unit]), _largest(grouped[unit])
    root = numel.get(job.root, 0)
    others = {u: n for u, n in numel.items() if u != job.root}
    child = max(others, key=lambda u: others[u]) if others else None
    with_child = (pw + gw) * others[child] if child else 0
    if child is None or gw * root >= with_child:
        return Fraction(pw * root + gw * root), _largest(grouped[job.root])
    return Fraction(pw * root + with_child), _largest(grouped[child])


def _largest(members: Sequence[Param]) -> str:
    top = max(members, key=lambda p: p.numel)
    return f"{top.name} ({'×'.join(map(str, top.shape))})"


def holds(job: Job, layout: Layout) -> tuple[dict[str, Fraction], str]:
    """Bytes by category on the fullest GPU of ``layout``, and the tensor that sets its working memory."""
    strategy = DATA_PARALLEL[layout.stage + 1]
    if not isinstance(job.params, tuple):  # a count: split evenly over tensor and pipeline ranks
        per_element = cost.element_bytes(_plan(job, 1, strategy, 1))
        share = Fraction(job.params, layout.tp * layout.pp)
        mem = {c: v * share for c, v in cost.textbook(layout.stage, 1, layout.shard, per_element).items()}
        return _categories(mem, Fraction(0)), ""
    best: tuple[dict[str, Fraction], str] | None = None
    stages = stages_of(job.params, layout.pp, job.root) if layout.pp > 1 else [job.params]
    for members in stages:
        local = tp_local(members, layout.tp)
        mem = cost.memory(_plan(job, local, strategy, layout.shard)).by_category
        extra, largest = working(job, local, layout.stage)
        held = _categories(mem, extra)
        if best is None or sum(held.values()) > sum(best[0].values()):
            best = (held, largest)
    assert best is not None
    return best


def _categories(mem: dict[str, Fraction], extra: Fraction) -> dict[str, Fraction]:
    return {
        "params": Fraction(mem["params"]),
        "grads": Fraction(mem["grads"]),
        "optim": Fraction(mem["optim"]) + Fraction(mem["master"]),
        "working": extra,
    }


def _plan(job: Job, params: int | tuple[Param, ...], strategy: str, world: int) -> Plan:
    return Plan(
        params, world, strategy, precision=job.precision, optimizer_bytes=job.optimizer_bytes, optimizer=job.optimizer
    )


# -- what a layout sends ------------------------------------------------------------------------------------------
NOT_PRICED = "not priced: a mini_gpt shape gives the blocks and width"
SHORT = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "broadcast": "BC"}


def _ops(volume: Volume) -> str:
    return ", ".join(f"{v['count']} {SHORT[k]}" for k, v in volume.by_op().items())


def _time(volume: Volume, link: Link) -> Fraction:
    return cost.Comm(volume, link).time


def traffic(job: Job, layout: Layout) -> tuple[Traffic, ...]:
    """Each link level's share of one step on the busiest GPU of ``layout`` (the first pipeline stage's data
    parallelism, a middle stage's sends)."""
    c = job.cluster
    strategy = DATA_PARALLEL[layout.stage + 1]
    params: int | tuple[Param, ...]
    if isinstance(job.params, tuple):
        params = stages_of(job.params, layout.pp, job.root)[0] if layout.pp > 1 else job.params
        params = tp_local(params, layout.tp)
    else:
        params = job.params // (layout.tp * layout.pp)
    # DDP all-reduces over every replica; a ZeRO stage reduces over its shard group (and HSDP across replicas).
    group = layout.replicas(c) if layout.stage == 0 else layout.shard
    crosses = c.nodes > 1 and not layout.hybrid
    out: list[Traffic] = []
    volume = cost.collectives(_plan(job, params, strategy, group))
    if group > 1:
        link = c.inter if crosses else c.intra
        level = INTER if crosses else INTRA
        out.append(Traffic(level, "data parallel", _ops(volume), volume.ring, _time(volume, link)))
    if layout.hybrid and layout.replicas(c) > 1:  # each GPU's gradient shard, all-reduced across the replicas
        shards = tuple(Op("all_reduce", o.numel // group, True, o.unit) for o in volume.ops if o.op == "reduce_scatter")
        across = Volume(shards, volume.element_bytes, layout.replicas(c))
        out.append(Traffic(INTER, "replicas", _ops(across), across.ring, _time(across, c.inter)))
    width = FP32 if job.precision == "fp32" else HALF  # activations in the compute dtype
    if layout.tp > 1:
        out.append(_tp_traffic(job, layout.tp, width))
    if layout.pp > 1:
        out.append(_pp_traffic(job, layout.pp, width))
    return tuple(out)


def _tp_traffic(job: Job, tp: int, width: int) -> Traffic:
    s = job.shape
    if s is None or job.tokens is None:
        return Traffic(INTRA, "tensor parallel", "4 AR per block", None, None, NOT_PRICED)
    block = [tensor_parallel.attention(s.d_model, prepared_input=True), tensor_parallel.mlp(s.d_model, s.hidden)]
    ops = tensor_parallel.collectives(block * s.n_layer, job.tokens, tp)
    sent = tensor_parallel.step_ring_bytes(ops, width, tp)
    seconds = sum((cost.collective_time(o.op, o.numel * width, tp, job.cluster.intra) for o in ops), Fraction(0))
    return Traffic(INTRA, "tensor parallel", f"{len(ops)} AR", sent, seconds)


def _pp_traffic(job: Job, pp: int, width: int) -> Traffic:
    s, m = job.shape, job.microbatches
    ops = f"{m} activations out, {m} gradients back per cut"
    if s is None or job.tokens is None:
        return Traffic(INTER, "pipeline", ops, None, None, NOT_PRICED)
    activation = Fraction(job.tokens * s.d_model * width, m)  # one microbatch's activation at a cut
    messages = pipeline.sent_bytes(1 if pp > 2 else 0, pp, m, 1)  # a middle stage sends both ways
    link = job.cluster.inter
    return Traffic(INTER, "pipeline", ops, messages * activation, messages * (link.latency + activation * link.beta))


# -- the walk -----------------------------------------------------------------------------------------------------
def _try(job: Job, step: int, layout: Layout) -> Attempt:
    memory, largest = holds(job, layout)
    return Attempt(step, layout, memory, traffic(job, layout), largest)


def _fits(job: Job, attempt: Attempt) -> bool:
    return attempt.total <= job.available


def _with(attempt: Attempt, verdict: str) -> Attempt:
    return Attempt(attempt.step, attempt.layout, attempt.memory, attempt.traffic, attempt.largest, verdict)


def divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def recommend(job: Job) -> Recommendation:
    c, hb = job.cluster, cost.human_bytes
    n, g = c.world_size, c.gpus_per_node
    done: list[Attempt] = []

    def finish(chosen: Attempt | None) -> Recommendation:
        return Recommendation(job, tuple(done), chosen)

    def fits_line(a: Attempt) -> str:
        return f"{hb(a.total)} ≤ {hb(job.available)}: fits, {hb(job.available - a.total)} left per GPU"

    def over(a: Attempt) -> str:
        return f"{hb(a.total)} > {hb(job.available)}"

    # Steps 1-3: data parallel over every GPU.
    nexts = {
        1: ("optim", "ZeRO-1 shards the optimizer state"),
        2: ("grads", "ZeRO-2 shards the gradients too"),
        3: ("params", "ZeRO-3 shards the parameters too"),
    }
    for step in (1, 2, 3):
        a = _try(job, step, Layout(step - 1, n if step > 1 else 1))
        if _fits(job, a):
            done.append(_with(a, fits_line(a)))
            return finish(done[-1])
        category, action = nexts[step]
        done.append(_with(a, f"{over(a)}; {action} ({hb(a.memory[category])} on every GPU here)"))

    # Step 4: ZeRO-3 over all N, or inside a node when the inter-node link is the slower one.
    hybrid = c.limited
    four = _try(job, 4, Layout(3, g if hybrid else n, hybrid=hybrid))
    where = (
        f"the inter-node link ({_gbps(c.inter)}) is slower than the intra-node one ({_gbps(c.intra)}): "
        f"sharded in a node, replicated across {c.nodes}; "
        if hybrid
        else ""
    )
    if _fits(job, four):
        done.append(_with(four, where + fits_line(four)))
        return finish(done[-1])
    state = four.total - four.memory["working"]
    state_fits = state <= job.available
    if state_fits:
        why = (
            f"{where}{over(four)}: the sharded state fits ({hb(state)}), the working memory beside it does not "
            f"({hb(four.memory['working'])}, set by {four.largest}); tensor parallelism splits it"
        )
    else:
        why = f"{where}{over(four)}: the sharded state alone ({hb(state)}) does not fit over {four.layout.shard} GPUs"  # type: ignore[union-attr]
        why += "; splitting the model across nodes is next" if hybrid else "; no step shrinks it further"
    if isinstance(job.params, tuple) and len(units(job.params)) == 1:
        why += "; the model is one unit, gathered whole: --units names the submodules to wrap"
    done.append(_with(four, why))

    # Step 5: tensor parallel inside a node, when the working memory is what does not fit.
    if state_fits and job.per_module:
        last = None
        for tp in divisors(g):
            shard = (g if hybrid else n) // tp
            a = _try(job, 5, Layout(3, shard, tp=tp, hybrid=hybrid))
            last = a
            if _fits(job, a):
                done.append(_with(a, f"TP {tp} (the smallest that fits): {fits_line(a)}"))
                return finish(done[-1])
        if last is None:
            done.append(Attempt(5, None, verdict="one GPU per node: no tensor-parallel degree to try"))
        else:
            done.append(_with(last, f"even TP {last.layout.tp}: {over(last)}"))  # type: ignore[union-attr]
    else:
        reason = (
            "not tried: a parameter count has no units, so its working memory is not known (give --model)"
            if not job.per_module
            else "not tried: TP shrinks the working memory, and the sharded state is what does not fit"
        )
        done.append(Attempt(5, None, verdict=reason))

    # Step 6: pipeline stages across nodes, each sharded inside its nodes.
    if not hybrid:
        reason = (
            "not tried: one node, no nodes to split the layers across"
            if c.nodes == 1
            else "not tried: ZeRO-3 over every GPU already holds the smallest state; stages would not shrink it"
        )
        done.append(Attempt(6, None, verdict=reason))
        return finish(None)
    last = None
    for pp in divisors(c.nodes):
        for tp in [1, *divisors(g)]:
            try:
                a = _try(job, 6, Layout(3, g // tp, tp=tp, pp=pp, hybrid=True))
            except PlanError as exc:  # more stages than units
                done.append(Attempt(6, None, verdict=f"not tried further: {exc}"))
                return finish(None)
            last = a
            if _fits(job, a):
                tp_text = f" with TP {tp}" if tp > 1 else ""
                done.append(_with(a, f"PP {pp}{tp_text} (the fewest stages that fit): {fits_line(a)}"))
                return finish(done[-1])
    assert last is not None
    done.append(_with(last, f"even {last.layout.pp} stages: {over(last)}"))  # type: ignore[union-attr]
    return finish(None)


def _gbps(link: Link) -> str:
    return f"{cost.number(link.bandwidth * 8 / 10**9)} Gbps"


# -- what torch's implementation of a step holds -----------------------------------------------------------------
@dataclass(frozen=True)
class InTorch:
    """torch's implementation of a data-parallel step, the bytes it holds on this job where they are not the
    reference's, and whether it fits then."""

    name: str
    total: Fraction | None  # None: the same bytes as the reference (up to padding)
    why: str = ""
    fits: bool = True


def in_torch(job: Job, attempt: Attempt) -> InTorch:
    layout = attempt.layout
    assert layout is not None
    psi = job.params if isinstance(job.params, int) else sum(p.numel for p in job.params)
    pw = widths(job, 3)[0]
    if layout.stage == 0:  # the reducer's buckets, a second copy of every gradient (guides 13, 19)
        total = attempt.total + FP32 * psi
        why = (
            "its buckets hold another 4 bytes per parameter with gradient_as_bucket_view=False, the default "
            "(True saves them: guide 19)"
        )
        return InTorch("DistributedDataParallel", total, why, total <= job.available)
    if layout.tp > 1 or layout.pp > 1:
        return InTorch("", None)
    if layout.stage == 1:
        if job.precision == "fp32":  # the same 4 + 4 + 8/N, up to its partition's imbalance
            return InTorch("ZeroRedundancyOptimizer over DDP", None)
        mem = cost.memory(_plan(job, job.params, "torch-zero", layout.shard))
        why = "autocast keeps its parameters and gradients fp32 (guide 13)"
        return InTorch("ZeroRedundancyOptimizer over DDP", mem.total, why, mem.total <= job.available)
    if layout.stage == 2:  # FSDP's SHARD_GRAD_OP: parameters sharded between steps, kept whole through backward
        mem = cost.memory(_plan(job, job.params, "shard-grad-op", layout.shard))
        total = mem.total + pw * psi
        why = "it keeps every unit's parameters unsharded from forward to backward (guide 13)"
        return InTorch("FSDP1 SHARD_GRAD_OP or FSDP2 reshard_after_forward=False", total, why, total <= job.available)
    if layout.hybrid:
        return InTorch("FSDP1 HYBRID_SHARD, or FSDP2 fully_shard on a 2-D (replicate, shard) mesh", None)
    return InTorch("FSDP1 FULL_SHARD or FSDP2 fully_shard", None)
