"""The gate's verdict end to end (pytester, in process): one outcome per session and its exit code, ``--fail-on``,
``summary.json`` written whatever happens (even when the command line is refused), the preview's headline, and
failed claims that point at the guide's expect rows they make false.

Outcomes and codes (README, "Gating a torch upgrade"): clean 0, re-read only 6, behaviour changed 1, broken 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reader.reader_support import PREFETCH_ANCHOR, TorchTree, guide

RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
GUIDE = "readings/04-forward-prefetch.md"

# A runner whose claims pass, fail with a `Violation` that records the row of the expect block ``expected`` whose
# key is ``kwargs["bad"]`` (``fake = "row"``: the line the guide parser gave that row; none when no row has that
# key), or fail without running (``"absent"``).
RUNNER = """
from checks.ranks.protocol import CheckRun, RankResult


class Runner:
    def run(self, request):
        mode = request.kwargs.get("fake", "ok")
        ran = frozenset(request.trace)
        if mode == "row":
            bad, expected = request.kwargs["bad"], request.kwargs["expected"]
            rows = tuple(row.record(expected.name) for row in expected if row.key == bad)
            failed = RankResult(0, ok=False, executed=ran, error="Violation", error_type="checks.violation.Violation",
                                message=f"{bad}: dtypes differ", reason="dtypes-differ",
                                details={"policy": bad, "observed": {"grads": ["float32"]}}, expect_rows=rows)
            return CheckRun(request, [failed, RankResult(1, ok=True, executed=ran)], failure=f"rank 0: {bad}")
        return CheckRun(request, [RankResult(r, ok=True, value=r, executed=ran) for r in range(2)])


def pytest_reader_check_runner(config):
    return Runner()
"""

EXPECT_BODY = """
# Forward prefetch

```source prefetch
note "handle._prefetched = True": marks the handle.
```

The policies and what they do:

```expect policies mapping
bf16/None: reduce bfloat16
bf16/fp32: reduce float32
```
"""


def claim(mode: str, claim_id: str = "dtypes", extra: str = "") -> str:
    return (
        f'[[claims]]\nid = "{claim_id}"\nstatement = "The reductions have the guide\'s dtypes."\n'
        f'check = "fakechecks.prefetch:forward_order"\nworld_size = 2\n'
        f'kwargs = {{ fake = "{mode}", expected = {{ expect = "policies" }}{extra} }}\n'
    )


@pytest.fixture
def project(pytester: pytest.Pytester, installed_tree: TorchTree) -> pytest.Pytester:
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p reader.plugin\n")
    pytester.makeconftest(RUNNER)
    pytester.mkpydir("fakechecks")
    (pytester.path / "fakechecks" / "prefetch.py").write_text("def forward_order(**kwargs):\n    pass\n")
    pytester.syspathinsert()
    return pytester


def write(project: pytest.Pytester, claims: str, body: str = EXPECT_BODY) -> list[str]:
    path = project.path / GUIDE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(guide(anchors=PREFETCH_ANCHOR, claims=claims, body=body))
    return path.read_text().splitlines()


def summary(project: pytest.Pytester, folder: str = "gate") -> dict:
    return json.loads((project.path / folder / "summary.json").read_text())


def test_each_outcome_has_its_own_exit_code_and_summary(project: pytest.Pytester, installed_tree: TorchTree):
    write(project, claim("ok"))
    assert project.runpytest("readings", "--approve").ret == 0
    clean = project.runpytest("readings", "--drift-report", "gate/torch.json")
    assert clean.ret == 0 and summary(project)["outcome"] == "clean"

    installed_tree.edit(RUNTIME, "_PREFETCH_LIMIT: int = 2", "_PREFETCH_LIMIT: int = 3")  # drift, claims hold
    installed_tree.edit(RUNTIME, "    if not current_handle:", "    if current_handle is None:")
    reread = project.runpytest("readings", "--drift-report", "gate/torch.json")
    assert reread.ret == 6
    found = summary(project)
    assert (found["outcome"], found["exit_code"], found["claims"]["failed"]) == ("re-read", 6, 0)
    assert found["reread"][0]["guide"] == "04-forward-prefetch" and found["reread"][0]["lines"]
    reread.stdout.fnmatch_lines(["outcome: re-read (exit 6)", "summary: gate/summary.md, gate/summary.json"])

    write(project, claim("row", extra=', bad = "bf16/None"'))  # and now a claim fails too
    changed = project.runpytest("readings", "--drift-report", "gate/torch.json")
    assert changed.ret == 1 and summary(project)["outcome"] == "behaviour-changed"

    (project.path / "readings" / "anchors.lock").write_text("{ not json")
    broken = project.runpytest("readings", "--drift-report", "gate/torch.json")
    assert broken.ret == 2 and summary(project)["outcome"] == "broken"


def test_fail_on_lets_the_milder_outcomes_pass_and_the_summary_still_says_them(project: pytest.Pytester):
    write(project, claim("ok"))  # never approved: its anchor drifts, its claim holds
    lenient = project.runpytest("readings", "--drift-report", "gate/t.json", "--fail-on", "behaviour-changed")
    assert lenient.ret == 0
    found = summary(project)
    assert (found["outcome"], found["exit_code"], found["fail_on"]) == ("re-read", 0, "behaviour-changed")
    write(project, claim("row", extra=', bad = "bf16/None"'))
    assert project.runpytest("readings", "--fail-on", "behaviour-changed").ret == 1
    assert project.runpytest("readings", "--fail-on", "broken").ret == 0  # report-only: only broken fails
    (project.path / "readings" / "anchors.lock").write_text("{ not json")
    assert project.runpytest("readings", "--fail-on", "broken").ret == 2  # broken always fails
    bad = project.runpytest("readings", "--fail-on", "drift")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR  # pytest's own refusal: before the plugin runs


def test_a_refused_command_line_is_broken_and_still_writes_the_summary(project: pytest.Pytester, tmp_path: Path):
    write(project, claim("ok"))
    missing = tmp_path / "nonexistent"
    result = project.runpytest("readings", "--drift-report", "gate/r.json", "--torch-source", str(missing))
    assert result.ret == 2  # not pytest's 4: broken input, as `fsdp-readings drift --torch-source` says it
    result.stderr.fnmatch_lines([f"*{missing}*"])
    found = summary(project)
    assert (found["outcome"], found["exit_code"]) == ("broken", 2) and str(missing) in found["broken"][0]
    assert (project.path / "gate" / "r.md").read_text().startswith("## fsdp-readings: broken input")
    assert (project.path / "gate" / "summary.md").read_text().startswith("## fsdp-readings: broken input")


def test_pytests_own_usage_error_and_no_tests_map_to_broken_with_a_summary(project: pytest.Pytester):
    write(project, claim("ok"))
    gone = project.runpytest("readings/05-gone.md", "--drift-report", "gate/r.json")
    assert gone.ret == pytest.ExitCode.USAGE_ERROR  # raised by pytest past every hook: its 4 stands
    found = summary(project)
    assert (found["outcome"], found["exit_code"]) == ("broken", 4)
    assert "pytest refused its command line (a usage error): exit 4" in found["broken"]
    nothing = project.runpytest("readings", "-k", "no-such-item", "--drift-report", "gate/r.json")
    assert nothing.ret == 2
    assert summary(project)["broken"] == ["no test ran (pytest's exit 5): the selection left no guide item"]
    assert project.runpytest("readings", "-k", "no-such-item").ret == pytest.ExitCode.NO_TESTS_COLLECTED  # no gate


def test_the_report_name_cannot_be_the_summarys(project: pytest.Pytester):
    write(project, claim("ok"))
    result = project.runpytest("readings", "--drift-report", "gate/summary.json")
    assert result.ret == 2
    result.stderr.fnmatch_lines(["*summary.json and summary.md are the gate's summary, written next to the report*"])
    assert not (project.path / "gate").exists()


def test_a_preview_says_that_claims_did_not_run(project: pytest.Pytester, installed_tree: TorchTree, tmp_path):
    write(project, claim("ok"))
    wheel = installed_tree.wheel(tmp_path / "torch-2.15.0-py3-none-any.whl", version="2.15.0")
    result = project.runpytest("readings", "--torch-source", str(wheel), "--drift-report", "gate/r.json")
    assert result.ret == 6
    markdown = (project.path / "gate" / "r.md").read_text()
    assert markdown.startswith("## fsdp-readings: re-read (claims did not run) · torch 2.13.0+cpu\n")
    assert "Claims did not run: --torch-source previews the source only" in markdown
    assert "hold" not in markdown.split("\n")[4]  # not "No claim failed; 0 of 1 hold"
    found = summary(project)
    assert found["claims_ran"] is False and "--torch-source" in found["why_claims_did_not_run"]
    result.stdout.fnmatch_lines(["claims did not run: --torch-source previews the source only;*"])


def test_a_failed_claim_points_at_the_expect_row_it_makes_false(project: pytest.Pytester):
    lines = write(project, claim("row", extra=', bad = "bf16/None"'))
    row = lines.index("bf16/None: reduce bfloat16") + 1
    fence = lines.index("```expect policies mapping") + 1
    claim_line = lines.index('id = "dtypes"')  # its [[claims]] line, 1-based
    result = project.runpytest("readings", "-k", "claim", "--drift-report", "gate/r.json")
    assert result.ret == 1
    (failed,) = summary(project)["failed_claims"]
    assert failed["at"] == f"{GUIDE}:{row}" and failed["claim_line"] == claim_line
    assert failed["expect"] == {"block": "policies", "line": fence,
                                "rows": [{"line": row, "text": "bf16/None: reduce bfloat16"}]}  # fmt: skip
    markdown = (project.path / "gate" / "r.md").read_text()
    assert f"| `04-forward-prefetch` | `dtypes` | {GUIDE}:{row} | `dtypes-differ` |" in markdown
    pr = (project.path / "gate" / "summary.md").read_text()
    assert f"  - now false, {GUIDE}:{row} (expect `policies`): `bf16/None: reduce bfloat16`" in pr


def test_a_failure_that_names_no_row_points_at_the_expect_block(project: pytest.Pytester):
    lines = write(project, claim("row", extra=', bad = "fp16"'))  # no row says fp16
    fence = lines.index("```expect policies mapping") + 1
    project.runpytest("readings", "-k", "claim", "--drift-report", "gate/r.json")
    (failed,) = summary(project)["failed_claims"]
    assert failed["at"] == f"{GUIDE}:{fence}" and failed["expect"]["rows"] == []


def test_a_claim_blocked_by_a_removed_anchor_is_drift_to_reread_not_a_behaviour_change(project: pytest.Pytester):
    anchors = PREFETCH_ANCHOR.replace("_prefetch_handle", "_prefetch_handels")
    path = project.path / GUIDE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(guide(anchors=anchors, claims=claim("ok"), body=EXPECT_BODY))
    result = project.runpytest("readings", "--drift-report", "gate/r.json")
    result.assert_outcomes(failed=2)
    assert result.ret == 6
    found = summary(project)
    assert found["outcome"] == "re-read" and found["anchors"]["by_class"] == {"removed": 1}
    data = json.loads((project.path / "gate" / "r.json").read_text())
    (row,) = data["guides"][0]["claims"]
    assert (row["outcome"], row["ran"], row["blocked"]) == ("failed", False, True)
