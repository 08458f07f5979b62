"""The memory accountant: bytes per category per rank at 2 and 4 ranks, fractions between wrappers, peaks, and
CUDA allocator stats, each against sizes worked out here (`probe_spec`) from the toy's shapes and the sharding
rules."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from checks.probes.memory import MemorySnapshot, account_memory
from checks.ranks.protocol import Patch
from checks.workloads import toy
from tests.probes.probe_spec import (
    FP32,
    LAYERS,
    ROOT,
    UNITS,
    flat_numel,
    fsdp1_local_originals,
    fsdp1_shard,
    fsdp2_local,
    fsdp2_unit_shard,
    shapes,
    theta,
    zero_partition_of_toy,
)

ALL_UNITS = (ROOT, *UNITS)
PARAM_TENSORS = 2 * len(LAYERS)  # Adam keeps one 4-byte ``step`` per parameter tensor


def expected(kind: str, n: int, rank: int, *, use_orig_params: bool = False) -> dict[str, int]:
    """Bytes per category on ``rank`` after one step (gradients kept), fp32 Adam."""
    if kind in ("ddp", "single"):
        elements, steps = theta(), PARAM_TENSORS
        return {"params": FP32 * elements, "grads": FP32 * elements, "optim": 2 * FP32 * elements + FP32 * steps}
    if kind == "fsdp1":
        shard = sum(fsdp1_shard(u, n, use_orig_params=use_orig_params) for u in ALL_UNITS)
        if use_orig_params:  # the optimizer sees the originals' local views (no padding), one step each
            local = [k for u in ALL_UNITS for k in fsdp1_local_originals(u, n, rank)]
            optim = 2 * FP32 * sum(local) + FP32 * len(local)
        else:  # one flat parameter per unit, padding included
            optim = 2 * FP32 * shard + FP32 * len(ALL_UNITS)
        return {"params": FP32 * shard, "grads": FP32 * shard, "optim": optim}
    if kind == "fsdp2":  # parameters and gradients: padded shards; optimizer state: this rank's own rows
        padded = sum(fsdp2_unit_shard(u, n) for u in ALL_UNITS)
        local = sum(fsdp2_local(s, n, rank) for child in LAYERS for s in shapes(child))
        return {"params": FP32 * padded, "grads": FP32 * padded, "optim": 2 * FP32 * local + FP32 * PARAM_TENSORS}
    if kind == "zero":  # ZeRO-1: optimizer state for the parameters this rank owns
        owned = zero_partition_of_toy(n)[rank]
        optim = 2 * FP32 * sum(numel for _, numel in owned) + FP32 * len(owned)
        return {"params": FP32 * theta(), "grads": FP32 * theta(), "optim": optim}
    raise ValueError(kind)


def check_categories(snapshot: MemorySnapshot, want: dict[str, int], what: str) -> None:
    got = {c: snapshot.nbytes(c) for c in want}
    assert got == want, f"{what}: {got} != {want}"
    assert snapshot.nbytes("unsharded") == 0, f"{what}: FSDP freed its unsharded parameters after the step"


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.world_size(4))])
def test_bytes_per_category_per_rank(ranks, n: int) -> None:
    per_rank = ranks("memory_after_step", world_size=n, kinds=("ddp", "fsdp1", "fsdp2", "zero"))
    for rank, snapshots in enumerate(per_rank):
        for kind, snapshot in snapshots.items():
            check_categories(snapshot, expected(kind, n, rank), f"{kind} rank {rank} of {n}")
        ddp, fsdp1 = snapshots["ddp"], snapshots["fsdp1"]
        unit_params = {e.label: e.nbytes for e in fsdp1.entries if e.label.endswith("local shard")}
        for unit in UNITS:  # 28 and 40 divide by 2 and 4: exactly 1/N of the unit's parameters
            numel = sum(c.numel() for c in toy.toy_model()[int(unit)].parameters())
            assert Fraction(unit_params[f"fsdp1 {unit} local shard"], FP32 * numel) == Fraction(1, n)
        if n == 2:  # every unit divides by 2: sharded categories are exactly half of DDP's
            for category in ("params", "grads"):
                assert fsdp1.fraction_of(ddp, category) == Fraction(1, 2)
            assert fsdp1.fraction_of(ddp, "optim", scalars=False) == Fraction(1, 2)
        else:  # the root's 30 elements pad to 32: 8 per rank
            assert unit_params["fsdp1 root local shard"] == FP32 * 8
        zero = snapshots["zero"]
        assert zero.nbytes("optim", scalars=False) == 2 * FP32 * sum(x for _, x in zero_partition_of_toy(n)[rank])
    total_zero_optim = sum(s["zero"].nbytes("optim", scalars=False) for s in per_rank)
    assert total_zero_optim == per_rank[0]["ddp"].nbytes("optim", scalars=False)  # ZeRO-1 partitions, no copies


def test_freed_storages_count_zero_and_views_count_once(ranks) -> None:
    """use_orig_params: the original parameters (and their gradients) are views into the flat parameter (and its
    gradient): counting storages, they add nothing; FSDP's freed unsharded buffers are there, with 0 bytes."""
    options = {"fsdp1": {"use_orig_params": True}}
    for rank, snapshots in enumerate(ranks("memory_after_step", kinds=("fsdp1",), options=options)):
        snapshot = snapshots["fsdp1"]
        check_categories(snapshot, expected("fsdp1", 2, rank, use_orig_params=True), f"fsdp1 orig params {rank}")
        freed = [e for e in snapshot.entries if e.category == "unsharded"]
        assert len(freed) == len(ALL_UNITS) and all(e.nbytes == 0 for e in freed)
        originals = [e for e in snapshot.entries if e.category == "params" and not e.label.startswith("fsdp1")]
        assert all(e.nbytes == 0 for e in originals)  # only empty local views (a rank's empty shard) are separate


def unsharded_peak(step: object) -> int:
    return step.memory.peak.peak.get("unsharded", 0)


@pytest.mark.parametrize(
    ("strategy", "policy", "units_at_once"),
    [
        # FULL_SHARD without prefetch: the root stays unsharded from its pre-forward to its post-backward (the last
        # one); units are unsharded one at a time, each freed before the next is gathered.
        ("FULL_SHARD", None, "root+largest"),
        # BACKWARD_PRE: unit 1's pre-backward prefetches unit 0 while unit 1 and the root are unsharded.
        ("FULL_SHARD", "BACKWARD_PRE", "all"),
        # SHARD_GRAD_OP frees nothing after forward: everything is unsharded at the end of forward.
        ("SHARD_GRAD_OP", None, "all"),
    ],
)
def test_fsdp1_unsharded_peak(ranks, strategy: str, policy: str | None, units_at_once: str) -> None:
    step = ranks("step_probes", kind="fsdp1", strategy=strategy, backward_prefetch=policy, peaks=True)[0]
    flat = {u: flat_numel(u, 2) for u in ALL_UNITS}
    elements = sum(flat.values()) if units_at_once == "all" else flat[ROOT] + max(flat[u] for u in UNITS)
    report = step.memory.peak
    assert report.tracker == "MemTracker"
    assert unsharded_peak(step) == FP32 * elements
    assert report.peak["params"] == FP32 * sum(fsdp1_shard(u, 2) for u in ALL_UNITS)  # shards only
    assert step.memory.after.nbytes("unsharded") == 0


def test_fsdp2_and_ddp_peaks(ranks) -> None:
    """FSDP2 (FSDPMemTracker): a unit's unsharded parameters exist from its copy-out to its reshard; units are
    resharded before the next copies out, the root is held through forward and backward: peak = root + the
    largest unit. DDP (MemTracker): parameters and gradients peak at |θ|·4; the tracker counts the optimizer
    step's temporaries as optimizer state, so that peak is at least the state left after the step."""
    fsdp2 = ranks("step_probes", kind="fsdp2", steps=2, peaks=True)[
        0
    ]  # two iterations: the trackers' per-module stats reset
    assert fsdp2.memory.peak.tracker == "FSDPMemTracker"
    padded = {u: 2 * fsdp2_unit_shard(u, 2) for u in ALL_UNITS}
    assert unsharded_peak(fsdp2) == FP32 * (padded[ROOT] + max(padded[u] for u in UNITS))
    assert fsdp2.memory.peak.peak["params"] == FP32 * sum(fsdp2_unit_shard(u, 2) for u in ALL_UNITS)
    ddp = ranks("step_probes", kind="ddp", peaks=True)[0]
    assert ddp.memory.peak.peak["params"] == ddp.memory.peak.peak["grads"] == FP32 * theta()
    assert ddp.memory.peak.peak["optim"] >= ddp.memory.after.nbytes("optim")


def test_accountant_follows_sabotaged_free(ranks) -> None:
    """Make FSDP1's ``_free_storage`` a no-op (in every module that imported it): nothing is ever freed, so FSDP
    believes every unit is already unsharded and never all-gathers; the accountant must show all unsharded flat
    parameters alive after the step, and the comm recorder no all-gather."""
    sabotage = Patch("torch.distributed.utils:_free_storage", "checks.breakit.sabotage:noop")
    step = ranks("step_probes", kind="fsdp1", patches=(sabotage,), peaks=True)[0]
    everything = FP32 * sum(flat_numel(u, 2) for u in ALL_UNITS)
    assert step.memory.after.nbytes("unsharded") == everything
    assert unsharded_peak(step) == everything
    assert step.comm.count("all_gather") == 0


# -- in this process (no ranks) --------------------------------------------------------------------------------------
def _single_step(device: torch.device) -> object:
    model = toy.toy_model(device)
    optim = toy.adam(model.parameters())
    with account_memory(model, optim) as mem:
        model(torch.randn(4, 3, device=device)).sum().backward()
        optim.step()
    return mem


def test_cuda_stats_unavailable_on_cpu_say_why() -> None:
    mem = _single_step(torch.device("cpu"))
    assert mem.cuda is None and "need a CUDA device" in mem.cuda_unavailable and "cpu" in mem.cuda_unavailable
    check_categories(mem.after, expected("single", 1, 0), "single process")
    assert mem.before.nbytes("grads") == mem.before.nbytes("optim") == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA allocator stats need a CUDA device; none here")
def test_cuda_allocator_stats_on_gpu() -> None:
    mem = _single_step(torch.device("cuda", 0))
    assert mem.cuda_unavailable is None
    stats = mem.cuda
    # Allocator blocks round up (512 B minimum): at least what the live storages hold, never less.
    assert stats.allocated_after - stats.allocated_before >= mem.after.total - mem.before.total
    assert stats.peak_allocated >= stats.allocated_after
    assert stats.peak_reserved >= stats.peak_allocated
