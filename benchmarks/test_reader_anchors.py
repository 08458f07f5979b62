"""Anchor resolution speed (pytest-benchmark): cold parse vs warm on-disk cache vs in-memory, and a drift
preview read straight from a torch wheel.

Run: ``pytest benchmarks/test_reader_anchors.py --benchmark-only``. The symbol set is every anchor of the
guides in ``readings/`` plus ~40 representative FSDP1/FSDP2 symbols of the installed torch, so the numbers
mean something before many guides exist. The wheel benchmark reads ``$FSDP_READINGS_WHEEL`` or the wheel under
/opt/wheels.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from reader.format.guide import AnchorSpec
from reader.format.parse import load_all
from reader.gate.drift import classify
from reader.gate.lock import Lock, approve
from reader.source.anchors import AnchorError, Resolver
from reader.source.index import IndexCache
from reader.source.torch_source import TorchSource, open_source

FSDP = "torch.distributed.fsdp"
REPRESENTATIVE = (
    [
        f"{FSDP}._runtime_utils:{name}"
        for name in (
            "_lazy_init",
            "_unshard",
            "_reshard",
            "_pre_forward",
            "_pre_forward_unshard",
            "_post_forward",
            "_post_forward_reshard",
            "_root_pre_forward",
            "_pre_backward_hook",
            "_post_backward_hook",
            "_reduce_grad",
            "_reduce_grad_no_shard",
            "_post_backward_final_callback",
            "_catch_all_reshard",
            "_finalize_params",
            "_prefetch_handle",
            "_get_handle_to_prefetch",
            "_PrefetchMode",
            "_register_pre_backward_hooks",
        )
    ]
    + [
        f"{FSDP}._flat_param:FlatParamHandle.{name}"
        for name in (
            "shard",
            "pre_unshard",
            "unshard",
            "_all_gather_flat_param",
            "post_unshard",
            "reshard",
            "_use_unsharded_views",
            "_use_sharded_views",
            "flatten_tensors",
        )
    ]
    + [
        f"{FSDP}._flat_param:FlatParameter",
        f"{FSDP}._exec_order_utils:_ExecOrderData.get_handle_to_backward_prefetch",
        f"{FSDP}._exec_order_utils:_ExecOrderData.get_handle_to_forward_prefetch",
        f"{FSDP}._exec_order_utils:_ExecOrderData.record_pre_forward",
        f"{FSDP}._fully_shard._fsdp_param_group:FSDPParamGroup.unshard",
        f"{FSDP}._fully_shard._fsdp_param_group:FSDPParamGroup.reshard",
        f"{FSDP}._fully_shard._fsdp_param_group:FSDPParamGroup.pre_backward",
        f"{FSDP}._fully_shard._fsdp_param_group:FSDPParamGroup.post_backward",
        f"{FSDP}._fully_shard._fsdp_state:FSDPState._root_pre_forward",
        f"{FSDP}._fully_shard._fsdp_collectives:foreach_all_gather",
        f"{FSDP}._fully_shard._fsdp_collectives:foreach_reduce",
        f"{FSDP}._fully_shard._fsdp_param:FSDPParam.to_unsharded",
        f"{FSDP}._fully_shard._fully_shard:fully_shard",
    ]
)
READINGS = Path(__file__).resolve().parents[1] / "readings"


def anchors() -> list[AnchorSpec]:
    guides, _ = load_all([READINGS], None) if READINGS.is_dir() else ([], [])
    found = {(a.symbol, a.pattern): a for g in guides for a in g.anchors}
    for i, symbol in enumerate(REPRESENTATIVE):
        found.setdefault((symbol, None), AnchorSpec(f"r{i}", symbol, None, 1))
    return list(found.values())


ANCHORS = anchors()


def resolve_all(source: TorchSource, cache: IndexCache) -> int:
    resolver = Resolver(source, cache)
    resolved = 0
    for anchor in ANCHORS:
        try:
            resolver.resolve(anchor.symbol, anchor.pattern)
            resolved += 1
        except AnchorError:
            pass
    return resolved


@pytest.fixture
def installed() -> TorchSource:
    return open_source()


def test_resolve_cold(benchmark, installed: TorchSource, tmp_path: Path):
    """Every file parsed by libcst: the first run after a torch upgrade."""
    counter = iter(range(10**6))

    def setup():
        IndexCache.clear_memory()
        return (installed, IndexCache(tmp_path / f"cold-{next(counter)}")), {}

    resolved = benchmark.pedantic(resolve_all, setup=setup, rounds=3, iterations=1)
    assert resolved >= len(REPRESENTATIVE) - 2


def test_resolve_warm_disk_cache(benchmark, installed: TorchSource, tmp_path: Path):
    """A second process: indexes and fingerprints come from the on-disk cache, nothing is parsed."""
    IndexCache.clear_memory()  # else earlier tests' memory hits would leave the disk cache empty
    resolve_all(installed, IndexCache(tmp_path))

    def setup():
        IndexCache.clear_memory()
        return (installed, IndexCache(tmp_path)), {}

    benchmark.pedantic(resolve_all, setup=setup, rounds=10, iterations=1)


def test_resolve_hot_memory(benchmark, installed: TorchSource, tmp_path: Path):
    """Same process, new resolver: only reading and hashing files remain."""
    resolve_all(installed, IndexCache(tmp_path))
    benchmark(resolve_all, installed, IndexCache(tmp_path))


def wheel_path() -> Path | None:
    configured = os.environ.get("FSDP_READINGS_WHEEL")
    candidates = [Path(configured)] if configured else sorted(Path("/opt/wheels").glob("torch-*.whl"))
    return next((p for p in candidates if p.is_file()), None)


def test_drift_preview_from_wheel(benchmark, installed: TorchSource, tmp_path: Path):
    """Open the wheel, resolve every anchor from its zip members and classify against a lock approved on the
    installed torch: what ``pytest readings/ --torch-source torch.whl`` does before anyone installs it."""
    wheel = wheel_path()
    if wheel is None:
        pytest.skip("no torch wheel: set FSDP_READINGS_WHEEL or put one under /opt/wheels")
    resolver = Resolver(installed, IndexCache(tmp_path / "installed"))
    lock = Lock(tmp_path / "anchors.lock")
    for anchor in ANCHORS:
        try:
            current = resolver.resolve(anchor.symbol, anchor.pattern)
        except AnchorError:
            continue
        lock.put(
            "bench",
            anchor.name,
            approve(
                None,
                symbol=anchor.symbol,
                pattern=anchor.pattern,
                file=current.relpath,
                lines=(current.start, current.end),
                source=current.text,
                torch_version=installed.version,
            ),
        )
    counter = iter(range(10**6))

    def preview() -> int:
        IndexCache.clear_memory()
        source = open_source(wheel)
        wheel_resolver = Resolver(source, IndexCache(tmp_path / f"wheel-{next(counter)}"))  # cold: parse all
        drifted = 0
        for anchor in ANCHORS:
            try:
                current = wheel_resolver.resolve(anchor.symbol, anchor.pattern)
            except AnchorError as exc:
                current = exc
            drift = classify(
                "bench",
                anchor,
                approved=lock.get("bench", anchor.name),
                lock=lock,
                current=current,
                current_version=source.version,
            )
            drifted += not drift.ok
        source.close()
        return drifted

    started = time.perf_counter()
    drifted = benchmark.pedantic(preview, rounds=3, iterations=1)
    assert time.perf_counter() - started < 3 * 60, "a wheel preview must take seconds, not minutes"
    benchmark.extra_info.update(
        {
            "wheel": wheel.name,
            "wheel_mb": round(wheel.stat().st_size / 2**20),
            "anchors": len(ANCHORS),
            "drifted": drifted,
        }
    )
