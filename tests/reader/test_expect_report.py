"""A failed claim's report points at the exact expect row that is now false, end to end: one real guide per shape
(pairs, mapping, table, lines), one of its rows bent in a copy, the real claim run on the rank pool, and the gate's
summary read. The line comes from the parser through the check's `Violation` (`checks.expected.Expected.fail`),
never from the message's words: the bent row's text is one no check prints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# shape → (guide, claim, block, a row as written, the same row bent)
CASES = {
    "pairs": ("04-forward-prefetch", "follows-iteration-1-order", "forward-prefetches",
              "blocks.0  -> blocks.1", "blocks.0  -> blocks.2"),
    "mapping": ("19-ddp-buckets", "default-buckets", "default-buckets",
                "iteration 2: 263168 131584", "iteration 2: 263168 131585"),
    "table": ("06-backward-prefetch", "units-alive", "units-alive",
              "compute blocks.1        3             2              2",
              "compute blocks.1        3             2              3"),
    "lines": ("10-no-sync-and-frozen-params", "frozen-middle-reshards-in-backward", "frozen-middle",
              "free blocks.2", "free blocks.0"),
}  # fmt: skip


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly -p checks.ranks.pytest_plugin "
                     "-p reader.plugin\n")  # fmt: skip
    (pytester.path / "readings").mkdir()
    shutil.copy2(REPO / "readings" / "anchors.lock", pytester.path / "readings" / "anchors.lock")
    return pytester


@pytest.mark.parametrize("shape", list(CASES))
def test_a_failed_claim_names_the_bent_row_of_its_block(project: pytest.Pytester, shape: str) -> None:
    guide, claim, block, old, new = CASES[shape]
    text = (REPO / "readings" / f"{guide}.md").read_text(encoding="utf-8")
    lines = text.split("\n")
    fence = next(i for i, line in enumerate(lines, 1) if line.strip().startswith(f"```expect {block} {shape}"))
    row = next(i for i, line in enumerate(lines, 1) if i > fence and line.strip() == old)
    lines[row - 1] = lines[row - 1].replace(old, new)
    (project.path / "readings" / f"{guide}.md").write_text("\n".join(lines), encoding="utf-8")

    result = project.runpytest("readings", "-k", f"claim and {claim} and not at-4", "--drift-report", "gate/r.json")

    assert result.ret == 1, result.stdout.str()[-3000:]
    summary = json.loads((project.path / "gate" / "summary.json").read_text())
    (failed,) = summary["failed_claims"]
    assert failed["at"] == f"readings/{guide}.md:{row}"
    assert failed["expect"]["block"] == block and failed["expect"]["line"] == fence
    assert [r["line"] for r in failed["expect"]["rows"]] == [row]
