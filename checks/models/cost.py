"""What a data-parallel job costs before it runs: memory per GPU by category, bytes and seconds of communication
per step, and dollars, from the parameter sizes alone (torch-free), with a guard that refuses a plan over budget.

One set of rules, reused, never restated:

- memory of a model given per module (`Param`: unit, name, shape) is `checks.models.zero_memory.per_rank` on its
  fullest rank: padding, AdamW's ``step`` scalars and ZeroRedundancyOptimizer's imbalance included, the model
  guide 13 proves equal to real runs on mini_gpt;
- memory of a bare parameter count Ψ is the closed form `textbook`: the same per-element bytes (`element_bytes`)
  with nothing to pad. Per module, subtracting padding and step scalars gives it back exactly (the tests);
- the collectives of a step are `checks.models.comm_volume`'s (FSDP1, FSDP2, DDP), built from its `Op` for the
  rest; their bytes are `checks.models.ring.ring_bytes`; their time is the seeds' τ/β ring model: a ring
  collective of S bytes on N ranks is STEPS·(N−1) sequential steps of τ + (S/N)·β (`collective_time`).

Precision is ``fp32`` or ``mixed`` (bf16/fp16 compute). Under ``mixed`` only the ZeRO paper's scheme (the
reference ZeRO-1/2/3, `checks.zero`) keeps 2-byte parameters and gradients plus an fp32 master: 2 + 2 + K with
K = 12 (master 4, Adam 8). PyTorch's DDP under autocast, ZeroRedundancyOptimizer and FSDP's MixedPrecision keep
fp32 persistent state (4 + 4 + 8; `zero_memory`'s docstring says why); FSDP's collectives do run in bf16.
K, the optimizer's bytes per parameter, counts the master as the paper does (``optimizer_bytes``).

Bytes are decimal (1 GB = 10⁹ B), as the seeds and the ZeRO paper count them. Communication is summed, not
overlapped with compute: an upper bound on what a step waits for. Activations are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from checks.models.comm_volume import Op, Volume, ddp_step, sharded_step
from checks.models.comm_volume import step as comm_step
from checks.models.flat_param import layout
from checks.models.ring import STEPS
from checks.models.zero_memory import CATEGORIES, FP32, Memory, Param, optimizer, per_rank, units
from checks.naming import ROOT

PRECISIONS = ("fp32", "mixed")
HALF = 2  # bytes of a bf16 / fp16 element


@dataclass(frozen=True)
class Strategy:
    """How a strategy keeps state between steps and which implementation it is."""

    impl: str  # the `zero_memory.IMPLEMENTATIONS` entry that models its memory
    stage: int  # 0 nothing sharded, 1 optimizer state, 2 + gradients, 3 + parameters
    paper_mixed: bool  # under mixed precision: 2-byte params and grads and an fp32 master (the ZeRO paper)
    low_precision_comm: bool  # under mixed precision its collectives move 2-byte elements
    label: str


STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy("ddp", 0, False, False, "DDP"),
    "torch-zero": Strategy("torch-zero", 1, False, False, "DDP + ZeroRedundancyOptimizer"),
    "zero1": Strategy("zero1", 1, True, True, "ZeRO-1 (reference)"),
    "zero2": Strategy("zero2", 2, True, True, "ZeRO-2 (reference)"),
    "zero3": Strategy("zero3", 3, True, True, "ZeRO-3 (reference)"),
    "no-shard": Strategy("no-shard", 0, False, True, "FSDP1 NO_SHARD"),
    "shard-grad-op": Strategy("shard-grad-op", 3, False, True, "FSDP1 SHARD_GRAD_OP"),
    "full-shard": Strategy("full-shard", 3, False, True, "FSDP1 FULL_SHARD"),
    "fsdp2": Strategy("fsdp2", 3, False, True, "FSDP2 reshard_after_forward=True"),
    "fsdp2-default": Strategy("fsdp2", 3, False, True, "FSDP2 reshard_after_forward=None"),
    "fsdp2-no-reshard": Strategy("fsdp2", 3, False, True, "FSDP2 reshard_after_forward=False"),
}
ALIASES = {
    "zero-1": "zero1",
    "zero-2": "zero2",
    "zero-3": "zero3",
    "fsdp": "full-shard",
    "fsdp1": "full-shard",
    "zero-redundancy-optimizer": "torch-zero",
    "zero-redundancy": "torch-zero",
}


class PlanError(ValueError):
    """A plan that cannot be estimated; the message says what to give instead."""


class OverBudget(Exception):
    """`guard` refused a plan: its cost exceeds the ceiling. ``budget`` holds the arithmetic."""

    def __init__(self, budget: Budget) -> None:
        super().__init__(budget.arithmetic())
        self.budget = budget


def strategy_name(name: str) -> str:
    """The canonical name of ``name`` (``FULL_SHARD``, ``ZeRO-3`` and ``zero3`` all work)."""
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in STRATEGIES:
        raise PlanError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}")
    return key


# -- inputs ------------------------------------------------------------------------------------------------------
def exact(value: int | float | str | Fraction, what: str) -> Fraction:
    """A number as an exact Fraction: strings and ints exactly, floats by their shortest repr ("0.35", not the
    binary double)."""
    try:
        return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    except (ValueError, ZeroDivisionError):
        raise PlanError(f"{what} must be a number, not {value!r}") from None


SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str, what: str = "the parameter count") -> int:
    """``7B``, ``7e9``, ``500k``, ``1.5M``, ``7_000_000_000`` → an exact non-negative integer."""
    raw = text.strip().replace("_", "").replace(",", "")
    scale = SUFFIXES.get(raw[-1:].lower(), 1) if raw and raw[-1:].isalpha() else 1
    value = exact(raw[:-1] if scale != 1 else raw, what) * scale
    if value.denominator != 1:
        raise PlanError(f"{what} must be a whole number, not {text!r}")
    if value < 0:
        raise PlanError(f"{what} cannot be negative: {text!r}")
    return int(value)


@dataclass(frozen=True)
class Link:
    """A network link: bandwidth in bytes per second and per-step latency τ in seconds."""

    bandwidth: Fraction  # bytes/s; β = 1/bandwidth
    latency: Fraction = Fraction(0)

    @classmethod
    def gbps(
        cls,
        gbps: int | float | str | Fraction,
        latency_us: int | float | str | Fraction = 0,
        *,
        names: tuple[str, str] = ("bandwidth", "latency"),
    ) -> Link:
        """From gigabits per second (10⁹ bits) and microseconds; ``names`` say which inputs they were (an
        option's name) in an error."""
        bandwidth, tau = exact(gbps, names[0]) * 10**9 / 8, exact(latency_us, names[1]) / 10**6
        if bandwidth <= 0:
            raise PlanError(f"{names[0]} must be positive, not {gbps} Gbps")
        if tau < 0:
            raise PlanError(f"{names[1]} cannot be negative, not {latency_us} µs")
        return cls(bandwidth, tau)

    @property
    def beta(self) -> Fraction:
        return 1 / self.bandwidth


DEFAULT_LINK = Link.gbps(100, 5)  # InfiniBand-class: seed 000's 100 Gbps; τ a few µs


@dataclass(frozen=True)
class Plan:
    """One job: a model (a parameter count, or per-module `Param`s), N GPUs on some nodes, a strategy, a
    precision, K, the links, and optionally a price per GPU-hour and the hours it runs."""

    params: int | tuple[Param, ...]
    world_size: int
    strategy: str = "ddp"
    nodes: int = 1
    precision: str = "fp32"
    optimizer_bytes: Fraction | None = None  # K per parameter, master included; None: the optimizer's (AdamW: 8)
    optimizer: str = "adamw"  # a `zero_memory.OPTIMIZERS` name: its state tensors, per module exactly
    link: Link = DEFAULT_LINK  # the link between nodes (or the only one)
    intra_link: Link | None = None  # inside a node; None: `link`
    price_per_gpu_hour: Fraction | None = None
    hours: Fraction | None = None
    root: str = ROOT

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", strategy_name(self.strategy))
        if isinstance(self.params, list):
            object.__setattr__(self, "params", tuple(self.params))
        if isinstance(self.params, bool) or not isinstance(self.params, int | tuple):
            raise PlanError(f"params is a parameter count or a sequence of Param, not {type(self.params).__name__}")
        if isinstance(self.params, int) and self.params < 0:
            raise PlanError(f"the parameter count cannot be negative: {self.params}")
        if isinstance(self.params, tuple):
            for p in self.params:
                if any(d < 0 for d in p.shape):
                    raise PlanError(f"parameter {p.name} has a negative size: shape {p.shape}")
        if self.world_size < 1:
            raise PlanError(f"the world size must be at least 1 GPU, not {self.world_size}")
        if self.nodes < 1 or self.world_size % self.nodes:
            raise PlanError(f"{self.nodes} nodes cannot split {self.world_size} GPUs evenly; give a divisor of it")
        object.__setattr__(self, "precision", {"bf16": "mixed", "fp16": "mixed"}.get(self.precision, self.precision))
        if self.precision not in PRECISIONS:
            raise PlanError(f"precision is one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        rule = STRATEGIES[self.strategy]
        master = FP32 if (rule.paper_mixed and self.mixed) else 0
        try:
            state = optimizer(self.optimizer).element_bytes
        except ValueError as exc:
            raise PlanError(str(exc)) from None
        if self.optimizer_bytes is not None:
            k = exact(self.optimizer_bytes, "K")
            object.__setattr__(self, "optimizer_bytes", k)
            if k < master:
                raise PlanError(f"K = {k} bytes cannot hold the {master}-byte fp32 master {rule.label} keeps")
            if isinstance(self.params, tuple) and k != master + state:
                raise PlanError(
                    f"with per-module sizes K is the optimizer's, as guide 13 measured it (K = {master + state} for "
                    f"{self.optimizer}, {self.strategy}, {self.precision}): name the optimizer instead, or give a "
                    "parameter count for another K"
                )
        for name in ("price_per_gpu_hour", "hours"):
            value = getattr(self, name)
            if value is not None:
                value = exact(value, name.replace("_", " "))
                if value < 0:
                    raise PlanError(f"{name.replace('_', ' ')} cannot be negative: {value}")
                object.__setattr__(self, name, value)

    @property
    def mixed(self) -> bool:
        return self.precision == "mixed"

    @property
    def rule(self) -> Strategy:
        return STRATEGIES[self.strategy]

    @property
    def psi(self) -> int:
        return self.params if isinstance(self.params, int) else sum(p.numel for p in self.params)

    @property
    def ring_link(self) -> Link:
        """A ring over several nodes crosses the inter-node link at every step, so that link sets each step's
        time; on one node the ring stays inside it."""
        return self.link if self.nodes > 1 or self.intra_link is None else self.intra_link

    def replace(self, **changes: object) -> Plan:
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return Plan(**{**fields, **changes})  # type: ignore[arg-type]


# -- memory --------------------------------------------------------------------------------------------------------
def element_bytes(plan: Plan) -> dict[str, Fraction]:
    """Bytes per parameter element of each category, before sharding: the rule shared by both forms of input."""
    paper = plan.rule.paper_mixed and plan.mixed
    width = HALF if paper else FP32
    master = FP32 if paper else 0
    k = (
        plan.optimizer_bytes
        if plan.optimizer_bytes is not None
        else Fraction(master + optimizer(plan.optimizer).element_bytes)
    )
    return {"params": Fraction(width), "grads": Fraction(width), "optim": k - master, "master": Fraction(master)}


def shards(stage: int, world_size: int) -> dict[str, int]:
    """What each category is divided by at a stage: optimizer state (and master) from 1, gradients from 2,
    parameters at 3."""
    n = world_size
    return {
        "params": n if stage >= 3 else 1,
        "grads": n if stage >= 2 else 1,
        "optim": n if stage >= 1 else 1,
        "master": n if stage >= 1 else 1,
    }


def textbook(stage: int, psi: int, world_size: int, per_element: dict[str, Fraction]) -> dict[str, Fraction]:
    """The seeds' and the ZeRO paper's formula, exact: each category's bytes per element × Ψ / its divisor."""
    div = shards(stage, world_size)
    return {c: Fraction(per_element.get(c, 0)) * psi / div[c] for c in CATEGORIES}


def _memory_precision(plan: Plan) -> str:
    return "bf16" if plan.mixed else "fp32"


def rank_memory(plan: Plan) -> list[Memory]:
    """`zero_memory.per_rank` for every rank of a per-module plan."""
    assert isinstance(plan.params, tuple)
    return [
        per_rank(plan.rule.impl, plan.params, plan.world_size, r, _memory_precision(plan), optim=plan.optimizer)
        for r in range(plan.world_size)
    ]


@dataclass(frozen=True)
class GPUMemory:
    """Bytes one GPU holds between steps, by category; ``rank`` the fullest rank (0 when all are alike)."""

    by_category: dict[str, Fraction]
    padding: dict[str, int] = field(default_factory=dict)
    rank: int = 0
    exact_model: bool = False  # True: per module, from zero_memory (padding and step scalars included)

    @property
    def total(self) -> Fraction:
        return sum(self.by_category.values(), Fraction(0))


def memory(plan: Plan) -> GPUMemory:
    if isinstance(plan.params, int):
        return GPUMemory(textbook(plan.rule.stage, plan.params, plan.world_size, element_bytes(plan)))
    ranks = rank_memory(plan)
    rank = max(range(len(ranks)), key=lambda r: (sum(ranks[r].by_category().values()), -r))
    m = ranks[rank]
    return GPUMemory({c: Fraction(b) for c, b in m.by_category().items()}, m.padding_bytes(), rank, True)


# -- communication -------------------------------------------------------------------------------------------------
def comm_element_bytes(plan: Plan) -> int:
    return HALF if plan.mixed and plan.rule.low_precision_comm else FP32


def _unit_numels(params: Sequence[Param]) -> dict[str, list[int]]:
    return {u: [p.numel for p in members] for u, members in units(params).items()}


def _root_first(params: Sequence[Param], root: str) -> dict[str, list[Param]]:
    """Parameters by unit, the root first: with no parameters when none is in it (a root without its own)."""
    grouped = units(params)
    return {root: grouped.get(root, []), **{u: grouped[u] for u in grouped if u != root}}


def collectives(plan: Plan) -> Volume:
    """One step's collectives (forward, backward, optimizer step)."""
    n, width, name = plan.world_size, comm_element_bytes(plan), plan.strategy
    if isinstance(plan.params, int):
        return _count_collectives(name, plan.params, width, n)
    grouped = _root_first(plan.params, plan.root)
    if name in ("ddp", "full-shard", "shard-grad-op", "fsdp2", "fsdp2-default", "fsdp2-no-reshard"):
        shapes = {u: [p.shape for p in members] for u, members in grouped.items()}
        return comm_step(name, shapes, n, root=plan.root, element_bytes=width)
    if name == "torch-zero":  # DDP's all-reduce, then each owner broadcasts every parameter it updated
        ops = ddp_step(plan.psi, width, n).ops + tuple(Op("broadcast", p.numel, False, p.unit) for p in plan.params)
        return Volume(ops, width, n)
    grouped = {u: m for u, m in grouped.items() if m}  # a unit without parameters communicates nothing
    if name == "no-shard":  # one all-reduce per unit of its whole (aligned) flat parameter
        ops = tuple(
            Op("all_reduce", layout([p.numel for p in m], width, n, sharded=False).padded_numel, True, u)
            for u, m in grouped.items()
        )
        return Volume(ops, width, n)
    # The reference ZeRO: one flat group per unit, padded to a multiple of N (`zero_memory.reference`)
    padded = {u: -(-sum(p.numel for p in m) // n) * n for u, m in grouped.items()}
    if name == "zero3":  # gathered in forward, again in backward but for the root it keeps; reduce-scattered
        return sharded_step(padded, {u for u in padded if u != plan.root}, width, n)
    # zero1 / zero2: reduce-scatter each group in backward, all-gather the updated shards after the step
    ops = tuple(Op("reduce_scatter", c, True, u) for u, c in reversed(padded.items()))
    return Volume(ops + tuple(Op("all_gather", c, False, u) for u, c in padded.items()), width, n)


def _count_collectives(name: str, psi: int, width: int, n: int) -> Volume:
    """The textbook step over Ψ elements as one unit; with no root known, |root| = 0 (the 3|θ| of the seeds)."""
    ar, rs, ag, bc = (
        Op(k, psi, b)
        for k, b in (("all_reduce", True), ("reduce_scatter", True), ("all_gather", False), ("broadcast", False))
    )
    ops = {
        "ddp": (ar,),
        "no-shard": (ar,),
        "torch-zero": (ar, bc),
        "zero1": (rs, ag),
        "zero2": (rs, ag),
        "shard-grad-op": (ag, rs),
        "fsdp2-no-reshard": (ag, rs),
    }.get(name, (ag, Op("all_gather", psi, True), rs))
    return Volume(ops, width, n)


def collective_time(op: str, nbytes: int | Fraction, world_size: int, link: Link) -> Fraction:
    """Seconds for a ring collective of ``nbytes`` (its full payload): STEPS·(N−1) steps of τ + (S/N)·β
    (for an all-reduce, `checks.models.ring.ring_time`'s 2(N−1)(τ + S/N·β))."""
    steps = STEPS[op] * (world_size - 1)
    return steps * (link.latency + Fraction(nbytes) / world_size * link.beta)


@dataclass(frozen=True)
class Comm:
    volume: Volume
    link: Link

    @property
    def ring_bytes(self) -> Fraction:
        """Bytes each rank sends per step, in the ring model."""
        return self.volume.ring

    @property
    def latency(self) -> Fraction:
        n = self.volume.world_size
        return sum((STEPS[o.op] * (o.ranks(n) - 1) * self.link.latency for o in self.volume.ops), Fraction(0))

    @property
    def bandwidth_time(self) -> Fraction:
        return self.time - self.latency

    @property
    def time(self) -> Fraction:
        v = self.volume
        return sum(
            (collective_time(o.op, o.numel * v.element_bytes, o.ranks(v.world_size), self.link) for o in v.ops),
            Fraction(0),
        )


def communication(plan: Plan) -> Comm:
    return Comm(collectives(plan), plan.ring_link)


# -- dollars ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    gpus: int
    price_per_gpu_hour: Fraction
    hours: Fraction
    ceiling: Fraction

    @property
    def cost(self) -> Fraction:
        return self.gpus * self.price_per_gpu_hour * self.hours

    @property
    def left(self) -> Fraction:
        return self.ceiling - self.cost

    @property
    def ok(self) -> bool:
        return self.cost <= self.ceiling  # spending exactly the ceiling is within it

    def arithmetic(self) -> str:
        """The seed's sentence: what runs, at what price, for how long, against what ceiling."""
        hourly = self.gpus * self.price_per_gpu_hour
        line = (
            f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} × {dollars(self.price_per_gpu_hour)}/GPU-hour = "
            f"{dollars(hourly)}/hour × {number(self.hours)} h = {dollars(self.cost)}"
        )
        if self.ok:
            return f"{line}; budget {dollars(self.ceiling)}: within it, {dollars(self.left)} left"
        return f"{line}; budget {dollars(self.ceiling)}: over it by {dollars(-self.left)}, refused"


def cost(plan: Plan) -> Fraction | None:
    if plan.price_per_gpu_hour is None or plan.hours is None:
        return None
    return plan.world_size * plan.price_per_gpu_hour * plan.hours


def budget(plan: Plan, ceiling: int | float | str | Fraction) -> Budget:
    if plan.price_per_gpu_hour is None or plan.hours is None:
        raise PlanError("a budget needs a price per GPU-hour and the hours the job runs")
    limit = exact(ceiling, "the budget")
    if limit < 0:
        raise PlanError(f"the budget cannot be negative: {ceiling}")
    return Budget(plan.world_size, plan.price_per_gpu_hour, plan.hours, limit)


def guard(plan: Plan, ceiling: int | float | str | Fraction) -> Budget:
    """For a launcher, before it starts anything: the `Budget` when the plan's cost is within ``ceiling``;
    raises `OverBudget` (its message the arithmetic) when it is over, `PlanError` when the plan has no price."""
    verdict = budget(plan, ceiling)
    if not verdict.ok:
        raise OverBudget(verdict)
    return verdict


# -- everything at once ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    plan: Plan
    memory: GPUMemory
    ddp_total: Fraction  # the same model under DDP, for the fraction
    comm: Comm
    cost: Fraction | None

    @property
    def of_ddp(self) -> Fraction:
        return self.memory.total / self.ddp_total if self.ddp_total else Fraction(1)


def estimate(plan: Plan) -> Estimate:
    ddp = memory(plan.replace(strategy="ddp", optimizer_bytes=None)) if plan.strategy != "ddp" else None
    mem = memory(plan)
    return Estimate(plan, mem, ddp.total if ddp else mem.total, communication(plan), cost(plan))


# -- numbers for people ------------------------------------------------------------------------------------------------
def dollars(value: Fraction) -> str:
    """Cents exactly when the value is a whole number of cents, else rounded to a hundredth of a cent (≈)."""
    if (value * 100).denominator == 1:
        return f"${fixed(value, 2)}" if value >= 0 else f"-${fixed(-value, 2)}"
    return f"≈${float(value):.4f}"


def number(value: Fraction | int) -> str:
    """A Fraction as its exact decimal when it has a short one, else to 4 significant figures (≈)."""
    value = Fraction(value)
    for places in range(7):
        if (value * 10**places).denominator == 1:
            return fixed(value, places)
    return f"≈{float(value):.4g}"


def fixed(value: Fraction, places: int) -> str:
    """``value`` (a multiple of 10**-places) written with exactly ``places`` decimals."""
    scaled = value * 10**places
    assert scaled.denominator == 1, (value, places)
    digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
    body = f"{digits[:-places]}.{digits[-places:]}" if places else digits
    return f"-{body}" if scaled < 0 else body


def human_bytes(value: Fraction | int) -> str:
    """Decimal units, as the seeds count, to 4 significant figures: 112 GB, 26.25 GB, 206.4 kB, 1.875 GB."""
    value = Fraction(value)
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(value) >= scale:
            return f"{_significant(value / scale)} {unit}"
    return f"{_significant(value)} B"


def _significant(value: Fraction) -> str:
    places = 1 if abs(value) >= 100 else 2 if abs(value) >= 10 else 3
    return number(round_to(value, places))


def round_to(value: Fraction, places: int) -> Fraction:
    """Half-up rounding to ``places`` decimals, exact."""
    scale = 10**places
    return Fraction(int(value * scale + Fraction(1, 2)) if value >= 0 else -int(-value * scale + Fraction(1, 2)), scale)


def human_seconds(value: Fraction) -> str:
    for unit, scale in (("s", 1), ("ms", Fraction(1, 10**3)), ("µs", Fraction(1, 10**6))):
        if value >= scale:
            return f"{number(round_to(value / scale, 3))} {unit}"
    return "0 s" if value == 0 else f"{number(round_to(value * 10**9, 1))} ns"
