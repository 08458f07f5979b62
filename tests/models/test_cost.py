"""The cost model: its closed form is zero_memory's rule less padding and step scalars, its per-module memory is
zero_memory's (what guide 13 measures), its times are the seeds' τ/β ring, and the seeds' figures come out exact."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models import cost
from checks.models.comm_volume import step as comm_step
from checks.models.cost import (
    STRATEGIES,
    Link,
    OverBudget,
    Plan,
    PlanError,
    collective_time,
    element_bytes,
    estimate,
    guard,
    parse_count,
    textbook,
)
from checks.models.seed_figures import figure_1, figures, seed_budget, zero_table
from checks.models.zero_memory import STEP, Param, per_rank
from checks.models.zero_memory import textbook as zm_textbook

PSI_7B = 7 * 10**9
GB = 10**9


@pytest.fixture(scope="module")
def tiny() -> tuple[Param, ...]:
    """Guide 13's own input: mini_gpt tiny's parameters with their units, built on meta."""
    from checks.workloads.gpt import parameters_of_tiny

    return tuple(parameters_of_tiny())


def _gb(strategy: str, n: int = 8, precision: str = "fp32") -> Fraction:
    return estimate(Plan(PSI_7B, n, strategy, precision=precision)).memory.total / GB


# -- the closed form ------------------------------------------------------------------------------------------------
def test_the_seeds_zero_table() -> None:
    assert [_gb(s) for s in ("ddp", "zero1", "zero2", "zero3")] == [112, 63, Fraction(77, 2), 14]  # seed 002
    assert [_gb(s, precision="mixed") for s in ("zero1", "zero2", "zero3")] == [Fraction(77, 2), Fraction(105, 4), 14]
    # PyTorch's implementations keep fp32 persistent state under mixed precision: the fp32 figures.
    assert [_gb(s, precision="mixed") for s in ("torch-zero", "full-shard", "fsdp2")] == [63, 14, 14]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_the_closed_form_is_zero_memorys_textbook(stage: int, precision: str) -> None:
    # zero_memory.textbook files the master under optim (2 + 2 + 12); one rule. Stage 0 under mixed precision is
    # the paper's DDP (2 + 2 + 12), which PyTorch's DDP under autocast is not: the paper's per-element bytes.
    want = zm_textbook(stage, 8 * 10**6, 8, "fp32" if precision == "fp32" else "bf16")
    per_element = element_bytes(Plan(1, 1, "zero1", precision=precision))
    got = textbook(stage, 8 * 10**6, 8, per_element)
    assert (got["params"], got["grads"], got["optim"] + got["master"]) == tuple(Fraction(want[c]) for c in want)
    if stage:
        plan = estimate(Plan(8 * 10**6, 8, f"zero{stage}", precision=precision)).memory.by_category
        assert plan == got


def test_zero_paper_figure_1() -> None:
    assert [v for _, _, v in figure_1()] == [120, Fraction(1005, 32), Fraction(1065, 64), Fraction(15, 8)]
    k12 = Plan(7_500_000_000, 64, "zero1", precision="mixed", optimizer_bytes=12)
    assert estimate(k12).memory.total / GB == Fraction(1005, 32)  # K given explicitly: the same


def test_k_replaces_adams_bytes() -> None:
    sgd = estimate(Plan(10**6, 4, "zero1", optimizer_bytes=4)).memory.by_category  # SGD with momentum, fp32
    assert sgd["optim"] == Fraction(10**6, 1)
    assert element_bytes(Plan(1, 1, "zero2", precision="mixed", optimizer_bytes=16)) == {
        "params": 2,
        "grads": 2,
        "optim": 12,
        "master": 4,
    }


# -- per module: zero_memory, what guide 13 measures ----------------------------------------------------------------
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("n", [2, 4])
def test_per_module_memory_is_zero_memory_on_the_fullest_rank(tiny, strategy: str, n: int) -> None:
    for precision, zm in (("fp32", "fp32"), ("mixed", "bf16")):
        plan = Plan(tiny, n, strategy, precision=precision)
        ranks = [per_rank(STRATEGIES[strategy].impl, tiny, n, r, zm) for r in range(n)]
        got = estimate(plan).memory
        fullest = max(ranks, key=lambda m: sum(m.by_category().values()))
        assert got.by_category == fullest.by_category() and got.padding == fullest.padding_bytes()
        assert sum(ranks[got.rank].by_category().values()) == got.total
        ddp = sum(per_rank("ddp", tiny, n, 0, zm).by_category().values())
        assert estimate(plan).of_ddp == Fraction(sum(fullest.by_category().values()), ddp)


def _agrees_less_padding_and_steps(params: tuple[Param, ...], n: int, strategy: str, precision: str) -> None:
    """Summed over ranks, zero_memory's bytes less its padding are N × the closed form for params, grads and master
    exactly; optimizer state exceeds it only by AdamW's 4-byte step scalars, at most one per tensor per rank."""
    impl, zm = STRATEGIES[strategy].impl, "bf16" if precision == "mixed" else "fp32"
    ranks = [per_rank(impl, params, n, r, zm) for r in range(n)]
    psi = sum(p.numel for p in params)
    closed = estimate(Plan(psi, n, strategy, precision=precision)).memory.by_category
    for category in ("params", "grads", "master"):
        unpadded = sum(m.by_category()[category] - m.padding_bytes().get(category, 0) for m in ranks)
        assert unpadded == n * closed[category], category
    extra = sum(m.optim - m.padding_bytes().get("optim", 0) for m in ranks) - n * closed["optim"]
    assert extra % STEP == 0 and 0 <= extra <= STEP * len(params) * n


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("n", [2, 4, 3])
def test_the_closed_form_is_zero_memory_less_padding_on_mini_gpt(tiny, strategy: str, n: int) -> None:
    for precision in ("fp32", "mixed"):
        _agrees_less_padding_and_steps(tiny, n, strategy, precision)


shapes = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 6)), min_size=1, max_size=6)


@given(shapes, st.integers(1, 6), st.sampled_from(list(STRATEGIES)), st.sampled_from(["fp32", "mixed"]))
def test_the_closed_form_is_zero_memory_less_padding_on_drawn_units(sizes, n, strategy, precision) -> None:
    params = tuple(Param(f"u{i % 3}" if i % 3 else "root", f"p{i}", s) for i, s in enumerate(sizes))
    _agrees_less_padding_and_steps(params, n, strategy, precision)


# -- properties --------------------------------------------------------------------------------------------------------
@given(
    st.integers(0, 10**12),
    st.integers(1, 512),
    st.sampled_from(list(STRATEGIES)),
    st.sampled_from(["fp32", "mixed"]),
    st.integers(4, 24),
)
def test_memory_per_gpu_never_increases_with_n(psi, n, strategy, precision, k) -> None:
    plans = [Plan(psi, m, strategy, precision=precision, optimizer_bytes=k) for m in (n, n + 1, 2 * n)]
    totals = [estimate(p).memory for p in plans]
    for category in ("params", "grads", "optim", "master"):
        assert totals[0].by_category[category] >= totals[1].by_category[category] >= totals[2].by_category[category]


@given(shapes, st.integers(1, 8), st.sampled_from(list(STRATEGIES)))
def test_per_module_memory_less_padding_never_increases_when_n_doubles(sizes, n, strategy) -> None:
    # Without its padding, the fullest rank never holds more when N doubles. With it, it can: see below.
    params = tuple(Param(f"u{i % 2}", f"p{i}", s) for i, s in enumerate(sizes))
    small, big = (estimate(Plan(params, m, strategy)).memory for m in (n, 2 * n))
    assert big.total - sum(big.padding.values()) <= small.total - sum(small.padding.values())


def test_replicated_padding_grows_with_n() -> None:
    # The reference ZeRO-1/2 pad each flat group to a multiple of N and keep the whole padded buffer on every rank:
    # one 1-element parameter holds 4 + 4 + 12 = 20 bytes at N=1 and 28 at N=2 (params and grads padded to 2).
    one = (Param("root", "w", (1,)),)
    assert [estimate(Plan(one, n, "zero1")).memory.total for n in (1, 2)] == [20, 28]


@given(st.integers(1, 10**10), st.integers(2, 256))
def test_fractions_of_ddp(psi, n) -> None:
    frac = {s: estimate(Plan(psi, n, s)).of_ddp for s in ("zero1", "zero2", "zero3", "full-shard")}
    assert frac["zero3"] == frac["full-shard"] == Fraction(1, n)
    assert frac["zero1"] == (8 + Fraction(8, n)) / 16  # guide 13: fp32 Adam, not the mixed-precision formula
    assert frac["zero2"] == (4 + Fraction(12, n)) / 16


# -- communication -----------------------------------------------------------------------------------------------------
@given(st.integers(0, 10**10), st.integers(1, 128), st.integers(0, 1000), st.integers(1, 400))
def test_all_reduce_time_is_the_seeds_ring(nbytes, n, tau_us, gbps) -> None:
    link = Link.gbps(gbps, tau_us)
    want = 2 * (n - 1) * (link.latency + Fraction(nbytes, n) / link.bandwidth)
    assert collective_time("all_reduce", nbytes, n, link) == want
    assert collective_time("all_reduce", nbytes, n, link) == collective_time(
        "reduce_scatter", nbytes, n, link
    ) + collective_time("all_gather", nbytes, n, link)


def test_ring_time_matches_the_ring_model_where_it_has_one() -> None:
    from checks.models import ring

    if not hasattr(ring, "ring_time"):
        pytest.skip("checks.models.ring has no ring_time yet (guide 14)")
    link = Link.gbps(8, 50)
    assert float(collective_time("all_reduce", 10**6, 4, link)) == pytest.approx(
        ring.ring_time(10**6, 4, float(link.latency), float(link.beta))
    )


@given(st.integers(1, 10**10), st.integers(2, 64))
def test_comm_ratios_are_the_seeds(psi, n) -> None:
    ring = {s: estimate(Plan(psi, n, s)).comm.ring_bytes for s in STRATEGIES}
    assert ring["ddp"] == Fraction(2 * (n - 1) * 4 * psi, n)
    assert ring["zero1"] == ring["zero2"] == ring["shard-grad-op"] == ring["ddp"]
    assert ring["zero3"] == ring["fsdp2"] == Fraction(3, 2) * ring["ddp"]  # seed 000's 1.5×
    assert ring["torch-zero"] == Fraction(3, 2) * ring["ddp"]  # all-reduce + a broadcast of every parameter


def test_per_module_comm_is_comm_volumes_step(tiny) -> None:
    shapes_by_unit: dict[str, list[tuple[int, ...]]] = {}
    for p in tiny:
        shapes_by_unit.setdefault(p.unit, []).append(p.shape)
    for strategy in ("ddp", "full-shard", "shard-grad-op", "fsdp2", "fsdp2-default", "fsdp2-no-reshard"):
        for precision, width in (("fp32", 4), ("mixed", 2 if strategy != "ddp" else 4)):
            got = estimate(Plan(tiny, 4, strategy, precision=precision)).comm.volume
            assert got == comm_step(strategy, shapes_by_unit, 4, root="root", element_bytes=width)


def test_one_gpu_communicates_nothing() -> None:
    for strategy in STRATEGIES:
        comm = estimate(Plan(10**6, 1, strategy)).comm
        assert comm.ring_bytes == 0 and comm.time == 0


def test_several_nodes_ring_over_the_inter_node_link() -> None:
    fast, slow = Link.gbps(800, 1), Link.gbps(100, 5)
    one = estimate(Plan(10**9, 8, "ddp", link=slow, intra_link=fast)).comm.time
    two = estimate(Plan(10**9, 8, "ddp", nodes=2, link=slow, intra_link=fast)).comm.time
    assert one == collective_time("all_reduce", 4 * 10**9, 8, fast)
    assert two == collective_time("all_reduce", 4 * 10**9, 8, slow)


# -- dollars ---------------------------------------------------------------------------------------------------------
def test_the_seeds_budget_sentence() -> None:
    budget = seed_budget()
    assert (budget.cost, budget.left, budget.ok) == (Fraction("2.10"), Fraction("0.90"), True)
    plan = Plan(10**6, 2, price_per_gpu_hour="0.35", hours=3)
    assert guard(plan, "3.00") == budget
    assert guard(plan, "3.00").arithmetic() == (
        "2 GPUs × $0.35/GPU-hour = $0.70/hour × 3 h = $2.10; budget $3.00: within it, $0.90 left"
    )
    with pytest.raises(OverBudget, match=r"= \$2\.10; budget \$2\.00: over it by \$0\.10, refused") as refused:
        guard(plan, 2)
    assert refused.value.budget.left == Fraction("-0.10")


@given(st.integers(1, 4096), st.integers(0, 10**5), st.integers(0, 10**4), st.integers(0, 10**7))
def test_guard_passes_exactly_within_the_ceiling(gpus, cents, hours, ceiling_cents) -> None:
    plan = Plan(1, gpus, price_per_gpu_hour=Fraction(cents, 100), hours=hours)
    ceiling = Fraction(ceiling_cents, 100)
    cost_ = gpus * Fraction(cents, 100) * hours
    if cost_ <= ceiling:
        assert guard(plan, ceiling).left == ceiling - cost_
    else:
        with pytest.raises(OverBudget):
            guard(plan, ceiling)


def test_guard_needs_a_price() -> None:
    with pytest.raises(PlanError, match="price per GPU-hour"):
        guard(Plan(1, 2), 3)


# -- inputs --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, value",
    [
        ("7B", 7 * 10**9),
        ("7e9", 7 * 10**9),
        ("500k", 500_000),
        ("1.5M", 1_500_000),
        ("7_000", 7000),
        ("0", 0),
        ("7.5b", 7_500_000_000),
    ],
)
def test_parse_count(text: str, value: int) -> None:
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["-5", "1.5", "seven", "", "1/0"])
def test_parse_count_refuses(text: str) -> None:
    with pytest.raises(PlanError):
        parse_count(text)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"params": -1}, "cannot be negative"),
        ({"params": (Param("root", "w", (3, -1)),)}, "negative size"),
        ({"world_size": 0}, "at least 1 GPU"),
        ({"strategy": "zero4"}, "unknown strategy 'zero4'; choose one of: ddp"),
        ({"nodes": 3}, "cannot split 8 GPUs"),
        ({"precision": "fp8"}, "precision is one of"),
        ({"strategy": "zero2", "precision": "mixed", "optimizer_bytes": 2}, "cannot hold the 4-byte fp32 master"),
        ({"price_per_gpu_hour": -1}, "cannot be negative"),
    ],
)
def test_bad_plans_say_what_to_do(kwargs: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("(", r"\(")):
        Plan(**{"params": 10, "world_size": 8, **kwargs})


def test_a_custom_k_needs_a_count(tiny) -> None:
    with pytest.raises(PlanError, match="name the optimizer instead, or give a parameter count for another K"):
        Plan(tiny, 2, "zero1", optimizer_bytes=4)
    assert Plan(tiny, 2, "zero1", optimizer_bytes=8).optimizer_bytes == 8  # AdamW's own K is fine


def test_strategy_spellings() -> None:
    assert [Plan(1, 2, s).strategy for s in ("FULL_SHARD", "ZeRO-3", "zero_1", "fsdp")] == [
        "full-shard",
        "zero3",
        "zero1",
        "full-shard",
    ]


# -- the seeds -------------------------------------------------------------------------------------------------------
def test_each_seed_figure_says_which_is_which() -> None:
    by = {(f.seed, f.quantity): f for f in figures()}
    assert len(by) == len(figures())
    for f in figures():
        assert f.convention and f.corrected_convention and f.unit
        if f.verdict == "exact":
            assert f.said == f.exact
        elif f.verdict == "rounded":
            assert f.said != f.exact
    cases = {
        ("000", "DDP memory per GPU, 7B"): (112, 112, "exact"),
        ("002", "ZeRO-1 memory per GPU, 7B, N=8"): (63, Fraction(77, 2), "exact"),
        ("002", "ZeRO-2 memory per GPU, 7B, N=8"): (Fraction(77, 2), Fraction(105, 4), "exact"),
        ("002", "ZeRO-3 memory per GPU, 7B, N=8"): (14, 14, "exact"),
        ("000", "DDP bytes per step, 500k params"): (4, 2, "exact"),
        ("000", "all-reduce time at 10 Gbps, 500k params"): (Fraction(16, 5), Fraction(17, 10), "rounded"),
        ("000", "DDP all-reduce time, 7B, 100 Gbps"): (Fraction(14, 3), Fraction(49, 12), "rounded"),
        ("001", "S, 500k params"): (1, 2, "exact"),
        ("001", "bytes per worker per all-reduce, N=4"): (Fraction(3, 2), 3, "differs"),
        ("001", "all-reduce time, N=4"): (Fraction(9, 5), Fraction(33, 10), "differs"),
        ("001", "latency time, N=4, τ = 50 µs"): (300, 300, "exact"),
        ("000", "embedding table 600k × 4096, fp32 weights"): (Fraction("9.8304"), Fraction("39.3216"), "rounded"),
        ("003", "2 × RTX 4090 at $0.35/h for 3 h"): (Fraction("2.1"), Fraction("2.1"), "exact"),
        ("ZeRO", "Figure 1 Pos+g+p"): (Fraction(15, 8), Fraction(15, 8), "rounded"),
    }
    for key, (exact_value, corrected, verdict) in cases.items():
        assert (by[key].exact, by[key].corrected, by[key].verdict) == (exact_value, corrected, verdict), key


def test_zero_table_rows_add_up() -> None:
    for _name, fp32, mixed in zero_table():
        assert sum(fp32.values()) in (112, 63, Fraction(77, 2), 14)
        assert 2 * mixed["params"] == fp32["params"] and 2 * mixed["grads"] == fp32["grads"]


def test_number_formats_are_exact_or_marked() -> None:
    assert cost.number(Fraction(105, 4)) == "26.25" and cost.number(Fraction(14, 3)) == "≈4.667"
    assert cost.human_bytes(Fraction(77, 2) * GB) == "38.5 GB" and cost.human_bytes(206_352) == "206.4 kB"
    assert cost.dollars(Fraction("2.1")) == "$2.10" and cost.human_seconds(Fraction(9, 5000)) == "1.8 ms"
    assert textbook(3, 64, 4, element_bytes(Plan(1, 1)))["params"] == 64
