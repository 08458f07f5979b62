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
    assert code == 6 and "not yet approved" in out  # drift: re-read only
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
    assert code == 6
    # the words pytest's failure says too (`reader.views.drift`): the heading, then the summary
    heading = "anchor `prefetch` (torch.distributed.fsdp._runtime_utils:_prefetch_handle) drifted: code changed"
    assert f"readings/04-forward-prefetch.md:8: {heading}\n  the code changed\n" in out
    assert "+    handle._prefetched = False" in out and "-    handle._prefetched = True" in out
    assert "pytest readings/04-forward-prefetch.md --approve=04-forward-prefetch" in out
    report = json.loads(Path("out/drift.json").read_text())
    assert report["exit_code"] == 6 and report["guides"][0]["anchors"][0]["drift"] == "code changed"
    assert Path("out/drift.md").read_text().startswith("## fsdp-readings: re-read (claims did not run) · torch 2.13")


def test_approve_shows_what_it_records_and_refuses_removed(readings: Path, installed_tree: TorchTree, capsys):
    run(capsys, "approve")
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = 1")
    code, out = run(capsys, "approve")
    assert code == 0 and "approving code changed" in out and "+    handle._prefetched = 1" in out
    lock = (readings / "anchors.lock").read_text()
    installed_tree.edit(RUNTIME, "handle._prefetched = 1", "handle._prefetched = 2")
    installed_tree.edit("torch/distributed/fsdp/_flat_param.py", "def unshard(self):", "def unshard_now(self):")
    code, out = run(capsys, "approve")
    assert code == 6  # refused: `unshard` cannot be pinned until the guide is re-read
    assert "removed: torch.distributed.fsdp._flat_param has no `FlatParamHandle.unshard`" in out
    assert "`FlatParamHandle.unshard_now`" in out
    assert (readings / "anchors.lock").read_text() == lock  # all or nothing: the new `prefetch` is not kept


def test_broken_input_and_bad_arguments_exit_2(readings: Path, installed_tree: TorchTree, capsys, tmp_path: Path):
    (readings / "05-broken.md").write_text("+++\nid = \n+++\n")
    code, out = run(capsys, "drift")
    assert code == 2 and "readings/05-broken.md:2: malformed TOML front matter" in out
    code, _ = run(capsys, "drift", "04-forward-prefetch")  # problems of guides not asked about do not count
    assert code == 6
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


def test_drift_names_a_guide_that_does_not_parse_instead_of_calling_it_unknown(readings: Path, capsys):
    (readings / "05-broken.md").write_text('+++\nid = "05-broken"\ntitle = [\n+++\n')
    for given in ("05-broken", "05"):
        code, out = run(capsys, "drift", given)
        assert code == 2, out
        assert "unknown guide id" not in out
        assert "readings/05-broken.md:2: malformed TOML front matter" in out
        assert "fix the guide's problems above, then run the command again" in out


@pytest.mark.parametrize("colour", [True, False])
def test_a_broken_guide_is_printed_as_text_never_as_literal_markup(readings: Path, colour: bool):
    from io import StringIO

    from reader.commands.app import make_console

    (readings / "05-broken.md").write_text("+++\nid = \n+++\n")
    console = make_console(file=StringIO(), force_terminal=colour, color_system="standard" if colour else None,
                           width=100)  # fmt: skip
    assert main(["drift"], console) == 2
    out = console.file.getvalue()
    assert "[red]" not in out and "[/]" not in out
    assert "readings/05-broken.md:2: malformed TOML front matter" in out
    assert ("\x1b[31m" in out) is colour  # red when the terminal has colour, plain text when not


def test_drift_outcomes_fail_on_and_a_report_even_when_nothing_opens(readings: Path, installed_tree, capsys, tmp_path):
    run(capsys, "approve")
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = False")
    code, out = run(capsys, "drift", "--fail-on", "broken")
    assert code == 0 and "outcome: re-read (exit 0)" in out  # report-only: drift does not fail
    code, out = run(capsys, "drift", "--report", "gate/torch.json")
    summary = json.loads(Path("gate/summary.json").read_text())
    assert code == 6 and (summary["outcome"], summary["exit_code"], summary["claims_ran"]) == ("re-read", 6, False)
    assert "`fsdp-readings drift` compares the source only" in Path("gate/torch.md").read_text()
    code, out = run(capsys, "drift", "--torch-source", str(tmp_path / "missing.whl"), "--report", "bad/torch.json")
    assert code == 2
    assert json.loads(Path("bad/summary.json").read_text())["outcome"] == "broken"
    code, out = run(capsys, "drift", "--report", "gate/summary.md")
    assert code == 2 and "summary.json and summary.md are the gate's summary" in out


def test_the_help_of_drift_says_what_it_exits_with():
    from tests.study.test_study_fixes import _help

    text = " ".join(_help("drift").split())
    assert "(exit 0 clean, 6 drift, 2 broken)" in text and "1 drift" not in text
    assert "exit status: 0 clean, 6 anchors drift (re-read the guides), 2 broken input" in text
    approve = " ".join(_help("approve").split())
    assert "1 refused: a claim failed" in approve and "6 refused: an anchor cannot be pinned" in approve
