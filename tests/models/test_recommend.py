"""`checks.models.recommend`'s pieces against hand-worked cases: the tensor-parallel shard of each parameter, the
pipeline's split into stages, the working memory of ZeRO-2 and ZeRO-3, the walk's order and its HSDP rule."""

from __future__ import annotations

from fractions import Fraction

import pytest

from checks.models.cost import Link, PlanError
from checks.models.recommend import Cluster, Job, Layout, in_torch, recommend, stages_of, tp_local, traffic, working
from checks.models.zero_memory import Param
from checks.naming import ROOT

GB = 10**9

# A root of 100 elements (an embedding 10×8 and a norm of 20) and three units of 60, 40 and 50.
TOY = (
    Param(ROOT, "emb.weight", (10, 8)),
    Param(ROOT, "norm.weight", (20,)),
    Param("blocks.0", "blocks.0.w", (6, 10)),
    Param("blocks.1", "blocks.1.w", (4, 10)),
    Param("blocks.2", "blocks.2.w", (5, 10)),
)


def test_tp_splits_matrices_on_dim_0_else_1_and_keeps_vectors_whole() -> None:
    local = {p.name: p.shape for p in tp_local(TOY, 2)}
    assert local == {
        "emb.weight": (5, 8),
        "norm.weight": (20,),
        "blocks.0.w": (3, 10),
        "blocks.1.w": (2, 10),
        "blocks.2.w": (5, 5),  # 5 rows do not split in two; 10 columns do
    }
    assert tp_local(TOY, 1) is TOY


def test_stages_take_consecutive_units_the_root_on_the_first() -> None:
    first, second = stages_of(TOY, 2, ROOT)
    assert [p.name for p in first] == ["emb.weight", "norm.weight", "blocks.0.w", "blocks.1.w"]
    assert [p.name for p in second] == ["blocks.2.w"]
    with pytest.raises(PlanError, match="3 units cannot fill 4 pipeline stages"):
        stages_of(TOY, 4, ROOT)


def job(**changes: object) -> Job:
    base = {"params": TOY, "cluster": Cluster(Fraction(GB), 2)}
    return Job(**{**base, **changes})  # type: ignore[arg-type]


def test_working_memory_zero2_is_one_units_gradient_zero3_the_kept_root_beside_one_unit() -> None:
    assert working(job(), TOY, 1) == (0, "")  # ZeRO-1: the gradients are whole anyway
    assert working(job(), TOY, 2) == (4 * 100, "emb.weight (10×8)")  # the root, 100 fp32 gradient elements
    # ZeRO-3: the root's 100 parameters kept, then max(its gradient 100, blocks.0's parameters and gradient 120).
    assert working(job(), TOY, 3) == (4 * 100 + 4 * 120, "blocks.0.w (6×10)")
    assert working(job(precision="mixed"), TOY, 3) == (2 * 100 + 2 * 120, "blocks.0.w (6×10)")


def test_the_walk_stops_at_the_first_step_that_fits() -> None:
    psi = 250
    # DDP 16Ψ = 4000; ZeRO-1 on 2: 8Ψ + 4Ψ = 3000 + step scalars; so a GPU of 3,500 bytes stops at step 2.
    result = recommend(job(cluster=Cluster(Fraction(3500), 2)))
    assert [a.step for a in result.attempts] == [1, 2] and result.chosen is result.attempts[-1]
    assert result.attempts[0].total == 16 * psi + 4 * len(TOY)


def test_hsdp_only_when_the_inter_node_link_is_the_slower() -> None:
    slow = Cluster(Fraction(GB), 2, 2, intra=Link.gbps(800), inter=Link.gbps(100))
    same = Cluster(Fraction(GB), 2, 2, intra=Link.gbps(100), inter=Link.gbps(100))
    assert slow.limited and not same.limited and not Cluster(Fraction(GB), 2, 1, intra=Link.gbps(800)).limited
    hybrid = Layout(3, 2, hybrid=True)
    levels = [(t.level, t.what, t.ops) for t in traffic(job(cluster=slow), hybrid)]
    # All-gathers and reduce-scatters inside the node; each GPU's gradient shard all-reduced across the 2 nodes.
    assert levels == [("intra-node", "data parallel", "7 AG, 4 RS"), ("inter-node", "replicas", "4 AR")]
    flat = [(t.level, t.ops) for t in traffic(job(cluster=same), Layout(3, 4))]
    assert flat == [("inter-node", "7 AG, 4 RS")]


def test_torch_forms_name_what_they_hold_beyond_the_reference() -> None:
    count = Job(7 * GB, Cluster(Fraction(80 * GB), 8), precision="mixed")
    two = recommend(count).chosen
    assert two is not None and two.step == 2
    form = in_torch(count, two)
    assert form.total == 63 * GB and form.fits  # ZeroRedundancyOptimizer under autocast: 4 + 4 + 8/8
    tight = Job(7 * GB, Cluster(Fraction(80 * GB), 8), precision="mixed", reserve=Fraction(20 * GB))
    assert not in_torch(tight, recommend(tight).chosen).fits  # type: ignore[arg-type]
    fp32 = Job(7 * GB, Cluster(Fraction(80 * GB), 8))
    assert in_torch(fp32, recommend(fp32).chosen).total is None  # type: ignore[arg-type]


def test_bad_jobs_are_refused() -> None:
    with pytest.raises(PlanError, match="at least one GPU"):
        Cluster(Fraction(GB), 0)
    with pytest.raises(PlanError, match="memory must be positive"):
        Cluster(Fraction(0), 1)
    with pytest.raises(PlanError, match="reserve cannot be negative"):
        job(reserve=Fraction(-1))
    with pytest.raises(PlanError, match="precision is one of"):
        job(precision="int8")


def test_hsdp_with_tensor_parallel_over_a_whole_node_still_all_reduces_across_replicas() -> None:
    slow = Cluster(Fraction(GB), 2, 2, intra=Link.gbps(800), inter=Link.gbps(100))
    levels = [(t.level, t.what, t.ops) for t in traffic(job(cluster=slow), Layout(3, 1, tp=2, hybrid=True))]
    assert levels == [
        ("inter-node", "replicas", "4 AR"),
        ("intra-node", "tensor parallel", "4 AR per block"),  # TOY has no shape: named, not priced
    ]
