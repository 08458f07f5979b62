"""Runtime evidence: what is traced, what counts, and what the failure says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from checks.ranks.protocol import CheckRequest
from reader.claims.evidence import NEVER_RAN, evidence_symbols, missing_evidence, trace_symbols
from reader.format.parse import parse_guide
from reader.gate.workspace import Workspace
from reader.pytest_plugin.runner import PoolRunner, RankPoolUnavailable
from reader.source.index import IndexCache
from tests.reader.reader_support import LIMIT_ANCHOR, PREFETCH_ANCHOR, UNSHARD_ANCHOR, TorchTree, guide

NESTED = """
[[anchors]]
name = "hook"
symbol = "torch.distributed.fsdp._runtime_utils:_register_pre_backward_hooks.<locals>._register_hook"
"""
CLAIM = """
[[claims]]
id = "c"
statement = "s"
check = "m:f"
world_size = 2
"""
RUNTIME = "torch.distributed.fsdp._runtime_utils"


def resolved(tree: TorchTree, tmp_path: Path, anchors: str, claims: str = CLAIM):
    g = parse_guide(guide(anchors=anchors, claims=claims), tmp_path / "04-x.md")
    ok, failed = Workspace(tree.source(), tmp_path / "l.lock", IndexCache()).resolutions(g)
    assert not failed
    return g, ok


def test_traced_symbols_skip_assignments_and_lift_nested_functions(torch_tree: TorchTree, tmp_path: Path):
    g, ok = resolved(torch_tree, tmp_path, PREFETCH_ANCHOR + LIMIT_ANCHOR + UNSHARD_ANCHOR + NESTED)
    assert trace_symbols(g, ok) == (
        f"{RUNTIME}:_prefetch_handle",
        "torch.distributed.fsdp._flat_param:FlatParamHandle.unshard",
        f"{RUNTIME}:_register_pre_backward_hooks",
    )
    assert evidence_symbols(g.claims[0], g, ok)[f"{RUNTIME}:_register_pre_backward_hooks"] == ["hook"]


def test_evidence_narrows_and_reports(torch_tree: TorchTree, tmp_path: Path):
    claims = CLAIM + 'evidence = ["unshard"]\n'
    g, ok = resolved(torch_tree, tmp_path, PREFETCH_ANCHOR + UNSHARD_ANCHOR, claims)
    unshard = "torch.distributed.fsdp._flat_param:FlatParamHandle.unshard"
    assert missing_evidence(g.claims[0], g, ok, frozenset({unshard})) is None
    message = missing_evidence(g.claims[0], g, ok, frozenset({f"{RUNTIME}:_prefetch_handle"}))
    assert message is not None and message.startswith(NEVER_RAN)
    assert f"  - unshard: {unshard}" in message and f"Executed: {RUNTIME}:_prefetch_handle." in message


def test_named_evidence_must_all_have_run(torch_tree: TorchTree, tmp_path: Path):
    # Without `evidence` any anchor of the guide will do; naming two promises both ran.
    unshard, prefetch = "torch.distributed.fsdp._flat_param:FlatParamHandle.unshard", f"{RUNTIME}:_prefetch_handle"
    g, ok = resolved(torch_tree, tmp_path, PREFETCH_ANCHOR + UNSHARD_ANCHOR, CLAIM)
    assert missing_evidence(g.claims[0], g, ok, frozenset({unshard})) is None
    g, ok = resolved(
        torch_tree, tmp_path, PREFETCH_ANCHOR + UNSHARD_ANCHOR, CLAIM + 'evidence = ["prefetch", "unshard"]\n'
    )
    assert missing_evidence(g.claims[0], g, ok, frozenset({unshard, prefetch})) is None
    message = missing_evidence(g.claims[0], g, ok, frozenset({unshard}))
    assert message is not None and f"  - prefetch: {prefetch}" in message and "  - unshard" not in message


def test_only_assignments_is_no_evidence_at_all(torch_tree: TorchTree, tmp_path: Path):
    g, ok = resolved(torch_tree, tmp_path, LIMIT_ANCHOR)
    message = missing_evidence(g.claims[0], g, ok, frozenset())
    assert message is not None and "no traceable anchor" in message and "(limit)" in message


def test_pool_runner_without_the_pool_says_so(monkeypatch: pytest.MonkeyPatch):
    # The runner imports the pool's plugin lazily; a None entry makes that import raise ImportError even though
    # the root conftest already loaded the real module.
    monkeypatch.setitem(sys.modules, "checks.ranks.pytest_plugin", None)
    runner = PoolRunner(config=None)  # type: ignore[arg-type]
    with pytest.raises(RankPoolUnavailable, match=r"the rank pool \(checks.ranks\) cannot be imported"):
        runner.run(CheckRequest("m:f", world_size=2))
