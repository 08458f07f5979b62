"""A release no one has read yet, end to end: the real guide 06 and the real lock (approved on the matrix) meet a
torch tree that stands for 2.16.0, in which one anchored function's code changed and one behaviour changed with it.

The story the tree tells: "2.16 looks one unit further back when it picks the backward prefetch". Its source is
the installed torch's FSDP files with `_ExecOrderData.get_handle_to_backward_prefetch` edited (its loop runs one
more step); its behaviour is that edit, applied in the ranks as a patch of the real torch (a limit of 2, the same
patch guide 06's break-it tests use). The gate must fail on it clearly: the anchor drifts with the edited line
in its diff, the guide's note pinned to that line is lost (its sentence is the one 2.16 makes false), the claim
the change makes false is named with its structured reason, and the outcome is "behaviour changed" (exit 1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from reader.source import torch_source
from tests.reader.reader_support import TorchTree

REPO = Path(__file__).resolve().parents[2]
GUIDE = "06-backward-prefetch"
EXEC_ORDER = "torch/distributed/fsdp/_exec_order_utils.py"
LOOP = "        for _ in range(self._backward_prefetch_limit):"
LOOP_2_16 = "        for _ in range(self._backward_prefetch_limit + 1):"

# The rank side of 2.16's change: the ranks run the real torch with the prefetch looking two units back.
RUNNER = """
from dataclasses import replace

from checks.breakit.patches import wrapping
from checks.guides.g06_backward_prefetch.recipes import prefetch_two_back
from reader.pytest_plugin.runner import PoolRunner

LOOKS_TWO_BACK = wrapping(
    "torch.distributed.fsdp._exec_order_utils:_ExecOrderData.get_handle_to_backward_prefetch", prefetch_two_back
)


class NextRelease:
    def __init__(self, config):
        self.pool = PoolRunner(config)

    def run(self, request):
        return self.pool.run(replace(request, patches=(*request.patches, LOOKS_TWO_BACK)))


def pytest_reader_check_runner(config):
    return NextRelease(config)
"""


@pytest.fixture
def next_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TorchTree:
    """The installed torch's FSDP sources, as release 2.16.0, with the backward-prefetch loop edited."""
    tree = TorchTree(tmp_path / "site-packages")
    installed = Path(torch.__file__).parent
    shutil.copytree(installed / "distributed" / "fsdp", tree.path("torch/distributed/fsdp"))
    tree.write("torch/__init__.py", "")
    tree.write("torch/distributed/__init__.py", "")
    tree.set_version("2.16.0")
    tree.edit(EXEC_ORDER, LOOP, LOOP_2_16)
    monkeypatch.setattr(torch_source, "installed_root", lambda: tree.root)
    return tree


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly -p checks.ranks.pytest_plugin "
                     "-p reader.plugin\n")  # fmt: skip
    pytester.makeconftest(RUNNER)
    (pytester.path / "readings").mkdir()
    for name in (f"{GUIDE}.md", "anchors.lock"):
        shutil.copy2(REPO / "readings" / name, pytester.path / "readings" / name)
    return pytester


def test_the_next_release_drifts_with_its_diff_and_names_the_claim_it_changes(
    project: pytest.Pytester, next_release: TorchTree
) -> None:
    lock = json.loads((project.path / "readings" / "anchors.lock").read_text())
    assert lock["torch_matrix"][-1] != "2.16.0"  # a release the lock has not seen
    guide = f"readings/{GUIDE}.md"
    result = project.runpytest(
        guide,
        "-k",
        "anchor or pre-prefetches-reverse-post-forward",
        "--drift-report",
        "gate/torch-2.16.0.json",
    )
    summary = json.loads((project.path / "gate" / "summary.json").read_text())
    assert (summary["outcome"], summary["exit_code"], result.ret) == ("behaviour-changed", 1, 1)
    assert summary["torch"]["version"] == "2.16.0"

    [reread] = summary["reread"]  # one guide to re-read, one anchor in it: the function whose code changed
    assert (reread["guide"], [a["name"] for a in reread["anchors"]]) == (GUIDE, ["backward-target"])
    # The note pinned to the loop ("with the limit of 1, the loop runs once") has lost its line: the sentence the
    # change makes false is the one the gate refuses to carry over, until a person re-reads and repins it.
    assert (reread["anchors"][0]["class"], reread["anchors"][0]["notes_lost"]) == ("pattern lost", 1)
    report = json.loads((project.path / "gate" / "torch-2.16.0.json").read_text())
    drifted = [a for g in report["guides"] for a in g["anchors"] if a.get("diff")]
    assert [a["name"] for a in drifted] == ["backward-target"]
    assert f"-{LOOP}\n+{LOOP_2_16}\n" in drifted[0]["diff"]  # the diff shows exactly the edited line

    [failed] = summary["failed_claims"]  # the claim the behaviour makes false, and why, as data
    assert (failed["guide"], failed["claim"], failed["reason"]) == (GUIDE, "pre-prefetches-reverse-post-forward",
                                                                    "prefetch-order")  # fmt: skip
    assert summary["claims"] == {"total": 1, "held": 0, "failed": 1, "skipped": 0}
