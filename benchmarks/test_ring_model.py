"""The seed's latency/bandwidth model of the ring all-reduce, fitted and tested on this machine (guide 14).

    pytest benchmarks/test_ring_model.py

``test_fit_at_2``: τ (seconds per message) and β (seconds per byte) are fitted on two ranks over loopback from
one-way point-to-point message times (half a send/recv ping-pong, `checks.ring.timing`), by a least-squares fit
of relative error (`checks.models.ring.fit_tau_beta`). From τ and β alone the model
2(N−1)·(τ + S/N·β) (`checks.models.ring.ring_time`) predicts the ring's time and gloo's ``dist.all_reduce``'s
across sizes; ``extra_info`` holds the fit, the measured and predicted seconds, and each prediction's relative
error. Beside it, ``<algorithm>_own_fit_*``: τ and β fitted to that algorithm's own times (per step, chunk
bytes), which asks only whether the model's shape, a line per step, fits the sizes. ``test_prediction_at_4``
applies the same τ and β at N = 4. This machine has 2 cores (shared): four busy ranks take turns on them, so a
step there costs a scheduling slice, not τ, and the errors show it.

Nothing here asserts a time: times belong to a run's benchmark table, not to a test.
"""

from __future__ import annotations

from typing import Any

import pytest

from checks.models import ring as model
from checks.ranks.manager import PoolManager
from checks.ranks.protocol import CheckRequest

SIZES = [1024, 4096, 16384, 65536, 262144, 1048576, 4194304]  # bytes, float32
FIT: dict[str, float] = {}  # τ and β from test_fit_at_2, reused at N = 4


def _measure(pool: PoolManager, benchmark: Any, world_size: int, p2p: bool) -> dict[str, Any]:
    request = CheckRequest("checks.ring.timing:timings", kwargs={"sizes": SIZES, "p2p": p2p}, world_size=world_size)
    run = benchmark.pedantic(pool.run, args=(request,), rounds=1, iterations=1)
    assert run.ok, run.failure
    return run.values()[0]


def _report(benchmark: Any, measured: dict[str, Any], world_size: int, tau: float, beta: float) -> None:
    info = benchmark.extra_info
    info["world_size"] = world_size
    info["sizes_bytes"] = SIZES
    for which in ("ring", "gloo"):
        predicted = [model.ring_time(s, world_size, tau, beta) for s in SIZES]
        errors = model.relative_errors(predicted, measured[which])
        info[f"{which}_measured_s"] = [round(t, 7) for t in measured[which]]
        info[f"{which}_predicted_s"] = [round(t, 7) for t in predicted]
        info[f"{which}_relative_error"] = [round(e, 3) for e in errors]
        info[f"{which}_max_abs_relative_error"] = round(max(abs(e) for e in errors), 3)
        # The model's shape on its own: (τ, β) fitted to this algorithm's own times at this N, per step.
        steps = model.ring_steps(world_size)
        own = model.fit_tau_beta([(s / world_size, t / steps) for s, t in zip(SIZES, measured[which], strict=True)])
        own_errors = model.relative_errors([model.ring_time(s, world_size, *own) for s in SIZES], measured[which])
        info[f"{which}_own_fit_tau_us"] = round(own[0] * 1e6, 2)
        info[f"{which}_own_fit_bandwidth_GB_per_s"] = round(1 / own[1] / 1e9, 3) if own[1] > 0 else None
        info[f"{which}_own_fit_max_abs_relative_error"] = round(max(abs(e) for e in own_errors), 3)


@pytest.mark.benchmark(group="ring-model")
def test_fit_at_2(benchmark, warm_pool: PoolManager) -> None:
    measured = _measure(warm_pool, benchmark, 2, p2p=True)
    points = list(zip(SIZES, measured["one_way"], strict=True))
    tau, beta = model.fit_tau_beta(points)
    FIT.update(tau=tau, beta=beta)
    fit_errors = model.relative_errors([model.message_time(s, tau, beta) for s in SIZES], measured["one_way"])
    benchmark.extra_info.update(
        tau_us=round(tau * 1e6, 2),
        bandwidth_GB_per_s=round(1 / beta / 1e9, 3),
        one_way_measured_s=[round(t, 7) for t in measured["one_way"]],
        fit_relative_error=[round(e, 3) for e in fit_errors],
        seed_tau_us=50,
        seed_bandwidth_GB_per_s=1.0,
    )
    _report(benchmark, measured, 2, tau, beta)


@pytest.mark.benchmark(group="ring-model")
def test_prediction_at_4(benchmark, warm_pool: PoolManager) -> None:
    if not FIT:
        pytest.skip("needs test_fit_at_2's τ and β (run the whole file)")
    measured = _measure(warm_pool, benchmark, 4, p2p=False)
    benchmark.extra_info.update(tau_us=round(FIT["tau"] * 1e6, 2), bandwidth_GB_per_s=round(1 / FIT["beta"] / 1e9, 3))
    _report(benchmark, measured, 4, FIT["tau"], FIT["beta"])
