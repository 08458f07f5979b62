"""``fsdp-readings approve`` cannot record a lie: it runs the guide's claims on the installed torch (through the
same runner and verdict as ``check``), records the guide whole or not at all, refuses a preview, and asks which
guide when several drift. The claims go to a `FakeManager` (``args.manager``), so no rank pool starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reader.gate.lock import GuideRecord, Lock
from tests.reader.reader_support import (
    PREFETCH_ANCHOR,
    UNSHARD_ANCHOR,
    FakeManager,
    TorchTree,
    claim,
    cli,
    guide,
    write_fake_checks,
)

RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
GUIDE_ID = "18-fsdp2"
CLAIMS = "\n".join([claim("sharding"), claim("mixed-precision"), claim("old-only", torch='"<2.13"')])
GPU_CLAIM = claim("offload", markers='["gpu"]')


@pytest.fixture
def readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    write_fake_checks(tmp_path)
    directory = tmp_path / "readings"
    directory.mkdir()
    (directory / f"{GUIDE_ID}.md").write_text(guide(GUIDE_ID, anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR, claims=CLAIMS))
    return directory


def lock_of(readings: Path) -> Lock:
    return Lock.load(readings / "anchors.lock")


def test_approval_runs_the_claims_and_records_what_they_did(readings: Path, installed_tree: TorchTree, capsys):
    manager = FakeManager()
    assert cli(["approve", GUIDE_ID], manager) == 0
    assert sorted(r.kwargs["claim"] for r in manager.requests) == ["mixed-precision", "sharding"]  # each ran
    assert all("torch.distributed.fsdp._runtime_utils:_prefetch_handle" in r.trace for r in manager.requests)
    out = capsys.readouterr().out
    assert f"{GUIDE_ID} on torch 2.13.0: 2 of 3 claims held, 1 skipped here (old-only)\n" in out
    assert lock_of(readings).guides == {GUIDE_ID: {"2.13.0": GuideRecord(held=2, skipped=("old-only",))}}


def test_a_failing_claim_refuses_the_approval_and_nothing_is_written(readings: Path, installed_tree: TorchTree, capsys):
    assert cli(["approve", GUIDE_ID]) == 0
    before = (readings / "anchors.lock").read_text()
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = prefetch_mode is not None")
    installed_tree.set_version("2.15.0+cu132")
    capsys.readouterr()
    assert cli(["approve", GUIDE_ID], FakeManager(fail={"mixed-precision"})) == 1
    out = capsys.readouterr().out
    assert "not approved (nothing of these guides was recorded):" in out
    assert (
        f"{GUIDE_ID}: claim `mixed-precision` failed on torch 2.15.0+cu132: `dtype-changed` rank 1: reduce dtype "
        "was float32, not bfloat16"
    ) in out
    assert '--force "<why>"' in out
    assert (readings / "anchors.lock").read_text() == before  # the drifted `prefetch` was not recorded either


def test_force_records_the_failed_claims_and_the_reason(readings: Path, installed_tree: TorchTree, capsys):
    installed_tree.set_version("2.15.0")
    reason = "2.15 reduces bf16 gradients in fp32: a real behaviour change, re-read in [torch-2.15]"
    assert cli(["approve", GUIDE_ID, "--force", reason], FakeManager(fail={"mixed-precision"})) == 0
    record = lock_of(readings).guides[GUIDE_ID]["2.15.0"]
    assert record == GuideRecord(held=1, skipped=("old-only",), failed=("mixed-precision",), forced=reason)
    assert f"forced over mixed-precision: {reason}" in capsys.readouterr().out
    saved = json.loads((readings / "anchors.lock").read_text())["guides"][GUIDE_ID]["2.15.0"]
    assert saved == {"claims_failed": ["mixed-precision"], "claims_held": 1, "claims_skipped": ["old-only"],
                     "forced": reason}  # fmt: skip


def test_a_force_without_a_reason_is_a_usage_error(readings: Path, installed_tree: TorchTree, capsys):
    with pytest.raises(SystemExit) as exited:
        cli(["approve", GUIDE_ID, "--force", "  ok "])
    assert exited.value.code == 2
    assert "--force needs the reason a person approves anyway, in words" in capsys.readouterr().err
    assert not (readings / "anchors.lock").exists()


def test_a_preview_cannot_approve(readings: Path, installed_tree: TorchTree, tmp_path: Path, capsys):
    wheel = installed_tree.wheel(tmp_path / "torch-2.15.0-cp311-cp311-linux_x86_64.whl", version="2.15.0")
    manager = FakeManager()
    assert cli(["approve", "--torch-source", str(wheel), GUIDE_ID], manager) == 2
    out = capsys.readouterr().out
    assert f"approve records what ran on the installed torch; nothing runs on --torch-source {wheel}" in out
    assert not manager.requests and not (readings / "anchors.lock").exists()


def test_a_bare_approve_with_several_guides_to_approve_lists_them(readings: Path, installed_tree: TorchTree, capsys):
    other = guide("19-ddp", anchors=PREFETCH_ANCHOR, claims=claim("buckets"))
    (readings / "19-ddp.md").write_text(other)
    manager = FakeManager()
    assert cli(["approve"], manager) == 2
    out = capsys.readouterr().out
    assert "2 guides to approve on torch 2.13.0+cpu; re-read each, then approve it by id (nothing was written):" in out
    assert f"  fsdp-readings approve {GUIDE_ID}    # prefetch (not yet approved), unshard (not yet approved)" in out
    assert "  fsdp-readings approve 19-ddp    # prefetch (not yet approved)" in out
    assert not manager.requests and not (readings / "anchors.lock").exists()
    assert cli(["approve", "19-ddp"], manager) == 0
    assert cli(["approve"], manager) == 0  # one guide left to approve: that one
    assert set(lock_of(readings).guides) == {GUIDE_ID, "19-ddp"}


def test_a_gpu_claim_is_skipped_without_gpus_as_pytest_skips_it(readings: Path, installed_tree: TorchTree):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA devices: the claim would run")
    (readings / f"{GUIDE_ID}.md").write_text(guide(GUIDE_ID, anchors=PREFETCH_ANCHOR, claims=GPU_CLAIM))
    manager = FakeManager(fail={"offload"})  # it would fail if it ran: a CUDA call on a CPU-only machine
    assert cli(["approve", GUIDE_ID], manager) == 0
    assert not manager.requests
    assert lock_of(readings).guides[GUIDE_ID]["2.13.0"] == GuideRecord(held=0, skipped=("offload",))
