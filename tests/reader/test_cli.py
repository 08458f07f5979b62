"""``fsdp-readings drift`` and ``approve``: same engine as the plugin, same exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reader.commands.app import build_parser, main
from tests.reader.reader_support import PREFETCH_ANCHOR, UNSHARD_ANCHOR, TorchTree, guide

RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"


@pytest.fixture
def readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / "readings"
    directory.mkdir()
    (directory / "04-forward-prefetch.md").write_text(guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR))
    (directory / "README.md").write_text("# not a guide\n")
    return directory


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_drift_then_approve_then_clean(readings: Path, installed_tree: TorchTree, capsys):
    code, out = run(capsys, "drift")
    assert code == 1 and "not yet approved" in out
    code, out = run(capsys, "approve", "04-forward-prefetch")
    assert code == 0 and "04-forward-prefetch/prefetch (was: not yet approved; torch 2.13.0)" in out
    assert "wrote readings/anchors.lock" in out
    code, out = run(capsys, "drift")
    assert code == 0
    code, out = run(capsys, "approve")
    assert code == 0 and "nothing to approve: every anchor reads as approved on torch 2.13.0+cpu" in out
    assert "unchanged: readings/anchors.lock" in out


def test_drift_shows_the_diff_and_writes_a_report(readings: Path, installed_tree: TorchTree, capsys):
    run(capsys, "approve")
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = False")
    code, out = run(capsys, "drift", "--report", "out/drift.json")
    assert code == 1
    assert "code changed: the code changed" in out
    assert "+    handle._prefetched = False" in out and "-    handle._prefetched = True" in out
    assert "pytest readings/04-forward-prefetch.md --approve=04-forward-prefetch" in out
    report = json.loads(Path("out/drift.json").read_text())
    assert report["exit_code"] == 1 and report["guides"][0]["anchors"][0]["drift"] == "code changed"
    assert Path("out/drift.md").read_text().startswith("## fsdp-readings: drift or failed claims")


def test_approve_shows_what_it_records_and_refuses_removed(readings: Path, installed_tree: TorchTree, capsys):
    run(capsys, "approve")
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = 1")
    code, out = run(capsys, "approve")
    assert code == 0 and "approving code changed" in out and "+    handle._prefetched = 1" in out
    lock = (readings / "anchors.lock").read_text()
    installed_tree.edit(RUNTIME, "handle._prefetched = 1", "handle._prefetched = 2")
    installed_tree.edit("torch/distributed/fsdp/_flat_param.py", "def unshard(self):", "def unshard_now(self):")
    code, out = run(capsys, "approve")
    assert code == 1
    assert "removed: torch.distributed.fsdp._flat_param has no `FlatParamHandle.unshard`" in out
    assert "`FlatParamHandle.unshard_now`" in out
    assert (readings / "anchors.lock").read_text() == lock  # all or nothing: the new `prefetch` is not kept


def test_broken_input_and_bad_arguments_exit_2(readings: Path, installed_tree: TorchTree, capsys, tmp_path: Path):
    (readings / "05-broken.md").write_text("+++\nid = \n+++\n")
    code, out = run(capsys, "drift")
    assert code == 2 and "readings/05-broken.md:2: malformed TOML front matter" in out
    code, _ = run(capsys, "drift", "04-forward-prefetch")  # problems of guides not asked about do not count
    assert code == 1
    code, out = run(capsys, "approve", "no-such-guide")
    assert code == 2 and "unknown guide id: no-such-guide" in out
    code, out = run(capsys, "drift", "--torch-source", str(tmp_path / "missing.whl"))
    assert code == 2 and "no such file or directory" in out
    code, out = run(capsys, "--readings", "nowhere", "drift")
    assert code == 2 and "no readings directory" in out


def test_drift_against_a_wheel(readings: Path, installed_tree: TorchTree, capsys, tmp_path: Path):
    run(capsys, "approve")
    installed_tree.set_version("2.14.0")
    wheel = installed_tree.wheel(tmp_path / "torch-2.14.0-py3-none-any.whl")
    code, out = run(capsys, "drift", "--torch-source", str(wheel))
    assert code == 0 and "torch 2.14.0" in out and "wheel at" in out


def test_commands_are_registered():
    parser = build_parser()
    assert parser.parse_args(["drift"]).command == "drift"
    bare = parser.parse_args([])  # no command: the reading path, where to start
    assert bare.command is None and bare.run.__name__ == "run_path"


def test_approving_everything_drops_entries_of_deleted_guides(readings: Path, installed_tree: TorchTree, capsys):
    (readings / "05-gone.md").write_text(guide("05-gone", anchors=PREFETCH_ANCHOR))
    run(capsys, "approve", "04-forward-prefetch", "05-gone")
    (readings / "05-gone.md").unlink()
    code, out = run(capsys, "approve", "04-forward-prefetch")
    assert "05-gone/prefetch" in (readings / "anchors.lock").read_text()  # not asked about: kept
    code, out = run(capsys, "approve")
    assert code == 0 and "dropped stale lock entry 05-gone/prefetch" in out
    assert "05-gone" not in (readings / "anchors.lock").read_text()
