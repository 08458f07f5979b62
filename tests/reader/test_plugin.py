"""The pytest plugin end to end (pytester, in process): ids, drift gate, approval, claims, exit codes,
reports.

The "installed" torch is a synthetic tree (``installed_tree``), and claims go to a fake runner supplied
through the ``pytest_reader_check_runner`` hook; its behaviour is chosen per claim by the ``fake`` kwarg, and
every request it receives is appended to ``requests.jsonl`` for the assertions.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from checks.ranks.protocol import CheckRequest, Patch
from tests.reader.reader_support import LIMIT_ANCHOR, PREFETCH_ANCHOR, UNSHARD_ANCHOR, TorchTree, guide

RUNTIME = "torch/distributed/fsdp/_runtime_utils.py"
GUIDE = "readings/04-forward-prefetch.md"

FAKE_RUNNER = """
import json
import pickle

from checks.ranks.protocol import CheckRun, RankResult

FAILURE = "rank 1 raised AssertionError: prefetch order was [2, 1]"


def rows(value):
    # an expect block (checks.expected.Expected) is logged as the texts of its rows
    return [row.text for row in value]


class FakeRunner:
    def run(self, request):
        with open("requests.jsonl", "a") as log:
            log.write(json.dumps({"target": request.target, "kwargs": dict(request.kwargs),
                                  "world_size": request.world_size, "trace": list(request.trace),
                                  "timeout": request.timeout}, default=rows) + "\\n")
        with open("requests.pickle", "ab") as sent:
            pickle.dump(request, sent)
        ranks = range(request.world_size)
        mode = request.kwargs.get("fake", "ok")
        if mode == "skip":
            return CheckRun(request, [], skipped="needs 2 CUDA devices")
        if mode == "fail":
            return CheckRun(request, [_failed(rank, request) if rank == 1 else _passed(rank) for rank in ranks],
                            failure=FAILURE)
        if mode == "property":  # fails for every example above 50, so hypothesis shrinks to 51
            if request.kwargs["example"] > 50:
                return CheckRun(request, [_failed(rank, request) for rank in ranks], failure=FAILURE)
            return CheckRun(request, [_passed(rank, request.trace) for rank in ranks])
        if mode == "no-evidence":
            return CheckRun(request, [_passed(rank) for rank in ranks])
        # Only rank 0 runs the last traced symbol: evidence is the union over ranks.
        return CheckRun(request, [_passed(rank, request.trace[-1:] if rank == 0 else ()) for rank in ranks])


def _passed(rank, executed=()):
    return RankResult(rank, ok=True, value=rank, executed=frozenset(executed))


def _failed(rank, request):
    message = "prefetch order was [2, 1]"
    return RankResult(
        rank, ok=False, executed=frozenset(request.trace),
        error=f"Traceback (most recent call last):\\n  ...\\nAssertionError: {message}\\n",
        error_type="builtins.AssertionError", message=message,
        reason="prefetch-order", details={"expected": [1, 2], "actual": [2, 1]},
    )


def pytest_reader_check_runner(config):
    return FakeRunner()
"""

CLAIMS = """
[[claims]]
id = "forward-order"
statement = "Forward prefetch follows the order recorded in iteration 1."
check = "fakechecks.prefetch:forward_order"
world_size = 2
markers = ["slow"]
kwargs = { fake = "ok" }

[[claims]]
id = "no-prefetch"
statement = "Without forward_prefetch nothing is prefetched in forward."
check = "fakechecks.prefetch:forward_order"
world_size = 4
timeout = 30
kwargs = { fake = "ok" }
"""

BODY = """
# Forward prefetch

```source prefetch
note "handle._prefetched = True": marks the handle.
```
"""


@pytest.fixture
def project(pytester: pytest.Pytester, installed_tree: TorchTree) -> pytest.Pytester:
    # hypothesis's pytest plugin slows every in-process run and is not needed inside these sessions.
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p reader.plugin --slow\n")
    pytester.makeconftest(FAKE_RUNNER)
    pytester.mkpydir("fakechecks")
    (pytester.path / "fakechecks" / "prefetch.py").write_text("def forward_order(**kwargs):\n    pass\n")
    (pytester.path / "fakechecks" / "draws.py").write_text(
        "def numbers():\n    from hypothesis import strategies as st\n\n    return st.integers(0, 100)\n"
    )
    pytester.syspathinsert()
    return pytester


def write_guide(project: pytest.Pytester, text: str, path: str = GUIDE) -> Path:
    target = project.path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def requests(project: pytest.Pytester) -> list[dict]:
    log = project.path / "requests.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_items_have_stable_ids_and_start_unapproved(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR, claims=CLAIMS, body=BODY))
    collected = project.runpytest("readings", "--collect-only", "-q")
    collected.stdout.fnmatch_lines(
        [
            f"{GUIDE}::anchor[prefetch]",
            f"{GUIDE}::anchor[unshard]",
            f"{GUIDE}::claim[forward-order]",
            f"{GUIDE}::claim[no-prefetch]",
        ]
    )
    result = project.runpytest("readings")
    assert result.ret == 6  # drift alone, every claim held: re-read only
    result.assert_outcomes(failed=2, passed=2)
    result.stdout.fnmatch_lines(
        [
            f"{GUIDE}:8: anchor `prefetch` (torch.distributed.fsdp._runtime_utils:_prefetch_handle) drifted: "
            "not yet approved",
            f"  current:  {project.path.parent}/*/site-packages/{RUNTIME}:17-29",
            "  read the guide against this source, then approve it:",
            f"    pytest {GUIDE} --approve=04-forward-prefetch",
            "    fsdp-readings approve 04-forward-prefetch",
        ]
    )


def test_approve_round_trip(project: pytest.Pytester, installed_tree: TorchTree):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR, body=BODY))
    approved = project.runpytest("readings", "--approve")
    assert approved.ret == 0
    approved.stdout.fnmatch_lines(
        ["approved into readings/anchors.lock:", "  04-forward-prefetch/prefetch (was: not yet approved)"]
    )
    lock = project.path / "readings" / "anchors.lock"
    first = lock.read_bytes()
    assert project.runpytest("readings").ret == 0

    # A code change fails the anchor with a readable diff, both locations and the approve command.
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = prefetch_mode is not None")
    changed = project.runpytest("readings")
    assert changed.ret == 6
    changed.assert_outcomes(failed=1, passed=1)
    changed.stdout.fnmatch_lines(
        [
            "*anchor `prefetch`*drifted: pattern lost: 1 note, and code changed",  # the report's label too
            "  the code changed",
            f"  approved: {RUNTIME}:17-29 (torch 2.13.0)",
            f"  current:  */site-packages/{RUNTIME}:17-29",
            f"--- approved {RUNTIME}:17-29 (torch 2.13.0)",
            f"+++ current  {RUNTIME}:17-29 (torch 2.13.0+cpu)",
            "@@ -26,4 +26,4 @@",
            "-    handle._prefetched = True",
            "+    handle._prefetched = prefetch_mode is not None",
            f"  fix the anchor at {GUIDE}:8 (or the notes above), re-read the guide, then approve:",
            f"    pytest {GUIDE} --approve=04-forward-prefetch",
        ]
    )
    assert "Traceback" not in changed.stdout.str()
    assert lock.read_bytes() == first  # failing never writes the lock

    # Only comments changed (after reverting the code): passes, with a note.
    installed_tree.edit(RUNTIME, "handle._prefetched = prefetch_mode is not None", "handle._prefetched = True")
    installed_tree.edit(RUNTIME, "# Prefetch is issued from the hooks, never from user code.", "# Reworded.")
    cosmetic = project.runpytest("readings")
    assert cosmetic.ret == 0
    cosmetic.stdout.fnmatch_lines(
        ["notes (passing; approve to record them):", "  04-forward-prefetch/prefetch: cosmetic — *"]
    )

    # Approving records the new text and clears the note.
    assert project.runpytest("readings", "--approve=04-forward-prefetch").ret == 0
    assert b"# Reworded." in lock.read_bytes()
    clean = project.runpytest("readings")
    assert clean.ret == 0 and "notes (passing" not in clean.stdout.str()


def test_claims_go_to_the_runner_with_trace_symbols_and_markers(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + LIMIT_ANCHOR + UNSHARD_ANCHOR, claims=CLAIMS))
    result = project.runpytest("readings", "-k", "claim")
    result.assert_outcomes(passed=2, deselected=3)
    first, second = requests(project)
    assert first == {
        "target": "fakechecks.prefetch:forward_order",
        "kwargs": {"fake": "ok"},
        "world_size": 2,
        "timeout": None,
        "trace": [
            "torch.distributed.fsdp._runtime_utils:_prefetch_handle",
            "torch.distributed.fsdp._flat_param:FlatParamHandle.unshard",
        ],
    }
    assert (second["world_size"], second["timeout"]) == (4, 30.0)  # the assignment anchor is never traced
    assert project.runpytest("readings", "-m", "not slow", "-k", "claim").parseoutcomes() == {
        "passed": 1,
        "deselected": 4,
    }
    assert project.runpytest("readings", "-m", "world_size", "-k", "claim").parseoutcomes()["passed"] == 2
    assert project.runpytest("readings", "-k", "forward-order").parseoutcomes() == {
        "passed": 1,
        "deselected": 4,
    }


PATCH = Patch("torch.distributed.fsdp._runtime_utils:_prefetch_handle", "fakechecks.prefetch:forward_order")

REQUEST_PATH_TEST = f"""
import pickle
from pathlib import Path

from checks.ranks.protocol import Patch
from reader.format.parse import load_guide
from reader.pytest_plugin.hooks import claim_request


def test_build(pytestconfig):
    guide = load_guide(Path("{GUIDE}"))
    built = [claim_request(pytestconfig, guide, claim) for claim in guide.claims]
    patch = Patch({PATCH.target!r}, {PATCH.factory!r})
    built.append(claim_request(pytestconfig, guide, guide.claims[0], patches=(patch,), fake="fail"))
    Path("built.pickle").write_bytes(pickle.dumps(built))
"""


def sent_requests(project: pytest.Pytester) -> list[CheckRequest]:
    found = []
    with (project.path / "requests.pickle").open("rb") as sent:
        while sent.peek(1):
            found.append(pickle.load(sent))
    return found


def test_claim_request_builds_the_request_the_item_sends(project: pytest.Pytester):
    """One request path: break-it tests (through `claim_request`) and claim items send the same request."""
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + LIMIT_ANCHOR + UNSHARD_ANCHOR, claims=CLAIMS))
    project.makepyfile(test_request_path=REQUEST_PATH_TEST)
    result = project.runpytest("readings", "test_request_path.py", "-k", "claim or build")
    result.assert_outcomes(passed=3, deselected=3)
    sent = sent_requests(project)
    *built, patched = pickle.loads((project.path / "built.pickle").read_bytes())
    assert [type(r) for r in sent] == [CheckRequest, CheckRequest]
    assert built == sent
    assert sent[0].trace == (
        "torch.distributed.fsdp._runtime_utils:_prefetch_handle",
        "torch.distributed.fsdp._flat_param:FlatParamHandle.unshard",
    )
    assert patched == replace(sent[0], kwargs={"fake": "fail"}, patches=(PATCH,))


def test_failed_check_points_at_the_claim_line(project: pytest.Pytester):
    write_guide(
        project,
        guide(anchors=PREFETCH_ANCHOR, claims=CLAIMS.replace('fake = "ok" }\n\n', 'fake = "fail" }\n\n', 1)),
    )
    result = project.runpytest("readings", "-k", "forward-order")
    assert result.ret == 1
    result.stdout.fnmatch_lines(
        [
            f"{GUIDE}:12: claim `forward-order` failed",
            "  statement: Forward prefetch follows the order recorded in iteration 1.",
            "  check:     fakechecks.prefetch:forward_order(fake='fail') on 2 rank(s)",
            "rank 1 raised AssertionError: prefetch order was [2, 1]",
        ]
    )


def test_a_check_that_never_runs_the_anchored_code_fails(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=CLAIMS.replace('"ok"', '"no-evidence"')))
    result = project.runpytest("readings", "-k", "claim")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "this check never ran the code its guide reads.",
            "None of these executed on any rank:",
            "  - prefetch: torch.distributed.fsdp._runtime_utils:_prefetch_handle",
        ]
    )


def test_evidence_narrows_what_counts(project: pytest.Pytester):
    claims = CLAIMS.replace('markers = ["slow"]', 'markers = ["slow"]\nevidence = ["prefetch"]')
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR, claims=claims))
    result = project.runpytest("readings", "-k", "claim")
    # The fake reports only the last traced symbol (unshard) as executed: enough for the claim without
    # `evidence`, not for the one whose evidence is `prefetch`.
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*claim `forward-order` failed", "this check never ran the code its guide reads."])


def test_pool_skips_propagate(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=CLAIMS.replace('"ok"', '"skip"')))
    result = project.runpytest("readings", "-k", "claim", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED * needs 2 CUDA devices"])


def test_removed_anchor_fails_its_claims_without_a_traceback(project: pytest.Pytester):
    anchors = PREFETCH_ANCHOR.replace("_prefetch_handle", "_prefetch_handels")
    write_guide(project, guide(anchors=anchors, claims=CLAIMS))
    result = project.runpytest("readings")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            f"{GUIDE}:12: claim `forward-order` cannot run: the guide's anchors do not resolve in this torch",
            f"  anchor `prefetch` ({GUIDE}:8) removed: "
            "torch.distributed.fsdp._runtime_utils has no `_prefetch_handels`",
            "    hint: nearest names in torch.distributed.fsdp._runtime_utils: `_prefetch_handle` (line 18)*",
        ]
    )
    assert "Traceback" not in result.stdout.str() and requests(project) == []


def test_claims_still_run_when_a_pattern_is_lost_or_an_anchor_they_do_not_name_is_removed(
    project: pytest.Pytester, installed_tree: TorchTree
):
    narrowed = PREFETCH_ANCHOR + 'pattern = "handle._prefetched = True"\n'
    removed = UNSHARD_ANCHOR.replace("FlatParamHandle.unshard", "FlatParamHandle.unshard_gone")
    claims = CLAIMS.replace("world_size = 2\n", 'world_size = 2\nevidence = ["prefetch"]\n', 1)
    write_guide(project, guide(anchors=narrowed + removed, claims=claims))
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = 1")  # the pattern is lost
    result = project.runpytest("readings", "-k", "claim")
    # Both claims run: `prefetch` is traced as its whole function, `unshard_gone` is not named or traced.
    result.assert_outcomes(passed=2)
    assert [r["trace"] for r in requests(project)] == [["torch.distributed.fsdp._runtime_utils:_prefetch_handle"]] * 2
    result = project.runpytest("readings", "-k", "anchor")
    result.assert_outcomes(failed=2)  # the gate still flags both anchors


def test_broken_guides_are_collection_errors_and_the_rest_still_run(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR))
    write_guide(
        project,
        guide("05-broken", anchors=PREFETCH_ANCHOR.replace('"prefetch"', "prefetch")),
        "readings/05-broken.md",
    )
    write_guide(project, guide(anchors=UNSHARD_ANCHOR), "readings/06-duplicate-id.md")
    write_guide(project, "# a guide-numbered file without front matter\n", "readings/07-no-front-matter.md")
    write_guide(project, "# Readings\n\nAn index page, not a guide.\n", "readings/README.md")
    assert project.runpytest("readings", "--approve=04-forward-prefetch").ret == 2  # the others are still broken
    result = project.runpytest("readings")
    assert result.ret == 2
    result.assert_outcomes(passed=1, errors=3)
    result.stdout.fnmatch_lines_random(
        [
            "*ERROR collecting readings/05-broken.md*",
            "readings/05-broken.md:9: malformed TOML front matter: Invalid value*",
            "    fix: fix the TOML near this line*",
            "readings/06-duplicate-id.md:2: duplicate guide id `04-forward-prefetch`, "
            "also used by *04-forward-prefetch.md",
            "readings/07-no-front-matter.md:1: no TOML front matter",
            "broken input (exit code 2): 3",
        ]
    )


def test_broken_python_tests_still_interrupt_the_session(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR))
    project.makepyfile(test_broken="def test_x(:\n    pass\n")
    result = project.runpytest("readings", "test_broken.py")
    result.stdout.fnmatch_lines(["*Interrupted: 1 error during collection*"])
    result.assert_outcomes(errors=1)


def test_preview_a_wheel_and_write_a_drift_report(project: pytest.Pytester, installed_tree: TorchTree, tmp_path: Path):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR + LIMIT_ANCHOR, claims=CLAIMS))
    assert project.runpytest("readings", "--approve").ret == 0
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = False")
    installed_tree.edit(RUNTIME, "_PREFETCH_LIMIT: int = 2", "_PREFETCH_LIMIT: int = 2  # tuned")
    installed_tree.set_version("2.14.0", git="f" * 40)
    wheel = installed_tree.wheel(tmp_path / "torch-2.14.0-cp311-cp311-linux_x86_64.whl")
    installed_tree.edit(RUNTIME, "handle._prefetched = False", "handle._prefetched = True")  # installed = approved
    result = project.runpytest("readings", "--torch-source", str(wheel), "--drift-report", "drift.json", "-rs")
    assert result.ret == 6
    result.assert_outcomes(passed=2, failed=1, skipped=2)
    result.stdout.fnmatch_lines_random(
        [
            "SKIPPED * --torch-source previews anchors only; claims run against the installed torch",
            f"  current:  {wheel}!/{RUNTIME}:17-29",
            "torch 2.14.0 (git ffffffffffff) · wheel at *",
            "drift report: drift.json, drift.md",
        ]
    )
    report = json.loads((project.path / "drift.json").read_text())
    assert report["torch"] == {"version": "2.14.0", "git_version": "f" * 40, "source": f"wheel at {wheel}"}
    assert report["exit_code"] == 6 and report["outcome"] == "re-read"
    anchors = {a["name"]: a for a in report["guides"][0]["anchors"]}
    assert (
        anchors["prefetch"]["drift"] == "code changed"
        and "+    handle._prefetched = False" in anchors["prefetch"]["diff"]
    )
    assert anchors["prefetch"]["approve"] == [
        f"pytest {GUIDE} --approve=04-forward-prefetch",
        "fsdp-readings approve 04-forward-prefetch",
    ]
    assert anchors["limit"]["drift"] == "cosmetic" and anchors["unshard"]["drift"] == "unchanged"
    markdown = (project.path / "drift.md").read_text()
    assert markdown.startswith("## fsdp-readings: re-read (claims did not run) · torch 2.14.0\n")
    assert "#### code changed (1): the code changed" in markdown and "  ```diff" in markdown
    assert "- `04-forward-prefetch/limit`: cosmetic" in markdown


UPGRADE_BODY = """
# Forward prefetch

```source prefetch
note "handle._prefetched = True": marks the handle.
note "if not current_handle:": nothing to prefetch.
```

```source unshard
note "self._use_unsharded_flat_param(padded_unsharded_flat_param)": switch the views.
```
"""

UPGRADE_CLAIMS = """
[[claims]]
id = "order-holds"
statement = "Forward prefetch follows the order recorded in iteration 1."
check = "fakechecks.prefetch:forward_order"
world_size = 2
evidence = ["prefetch"]
kwargs = { fake = "ok" }

[[claims]]
id = "order-breaks"
statement = "Prefetch happens in the recorded order."
check = "fakechecks.prefetch:forward_order"
world_size = 2
kwargs = { fake = "fail" }
"""


def test_the_upgrade_report_says_what_to_reread_and_what_changed_in_behaviour(
    project: pytest.Pytester, installed_tree: TorchTree
):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR, claims=UPGRADE_CLAIMS, body=UPGRADE_BODY))
    forced = "--force=both claims fail on purpose: the report shows failed claims"
    assert project.runpytest("readings", "--approve", forced).ret == 1  # approved; its failing claim still fails
    assert '"forced": "both claims fail on purpose' in (project.path / "readings" / "anchors.lock").read_text()
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = False")
    installed_tree.edit("torch/distributed/fsdp/_flat_param.py", "def unshard(self):", "def unshard(self, now=True):")
    installed_tree.set_version("2.15.0")
    assert project.runpytest("readings", "--drift-report", "gate.md").ret == 1  # a claim failed: behaviour changed
    markdown = (project.path / "gate.md").read_text()
    lines = markdown.splitlines()
    text = (project.path / GUIDE).read_text().splitlines()
    fences = [i + 1 for i, line in enumerate(text) if line.startswith("```source")]
    notes = [i + 1 for i, line in enumerate(text) if line.startswith("note ")]
    claim_line = next(i for i, line in enumerate(text) if line == 'id = "order-breaks"')  # its [[claims]]
    assert markdown.startswith("## fsdp-readings: behaviour changed · torch 2.15.0\n")
    # `prefetch`'s code changed under its note `handle._prefetched = True`: the lost note blocks its approval, so
    # it is "pattern lost", with its code change named beside it.
    assert "**2 of 2 anchors to re-read** in 1 guide: 1 pattern lost, 1 signature changed." in markdown
    assert "**2 claims failed**; 0 of 2 hold, 0 skipped." in markdown
    reread = lines[lines.index("### What to re-read") + 2]
    assert reread == (
        "- [ ] `04-forward-prefetch`: `prefetch` (pattern lost: 1 note, and code changed), `unshard` (signature "
        f"changed) — {GUIDE} lines {fences[0]}-{notes[2]}"  # two blocks a few lines apart: one passage
    )
    assert f"| `04-forward-prefetch` | `order-breaks` | {GUIDE}:{claim_line} | `prefetch-order` | " in markdown
    # The guide's section: classes by severity, each anchor with where the guide quotes it and its diff.
    section = markdown[markdown.index("### `04-forward-prefetch`") :]
    assert section.index("#### pattern lost (1)") < section.index("#### signature changed (1)")
    assert "  - approval is blocked until its lost notes are repinned; the code changed too" in section
    assert (
        f"  - the guide: quoted at {GUIDE}:{fences[0]}; notes at lines {notes[0]}-{notes[1]}; "
        "evidence for claims `order-holds`" in section
    )
    assert "  -    handle._prefetched = True\n  +    handle._prefetched = False" in section
    assert "(torch 2.13.0) → now `torch/distributed/fsdp/_runtime_utils.py:17-29`" in section
    assert f"**claim `order-breaks` failed** ({GUIDE}:{claim_line}, reason `prefetch-order`)" in section
    data = json.loads((project.path / "gate.json").read_text())
    claims = {c["id"]: c for c in data["guides"][0]["claims"]}
    assert claims["order-breaks"]["reason"] == "prefetch-order"
    assert claims["order-holds"]["reason"] == "no-runtime-evidence"
    assert data["guides"][0]["anchors"][0]["quoted_at"] == [fences[0]]


def test_guides_for_other_torch_versions_are_skipped(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=CLAIMS, torch=">=3.0"))
    result = project.runpytest("readings", "-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["SKIPPED * 04-forward-prefetch applies to torch >=3.0; this torch is 2.13.0+cpu"])


def test_approve_option_mistakes(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR))
    swallowed = project.runpytest("--approve", "readings")
    assert swallowed.ret == 2  # broken input, as in every front end
    swallowed.stderr.fnmatch_lines(["*--approve took `readings` as a guide id. Put paths before --approve*"])
    unknown = project.runpytest("readings", "--approve=04-forward-prefetc")
    assert unknown.ret == 2
    unknown.stdout.fnmatch_lines(["--approve=04-forward-prefetc: no collected guide has this id*"])
    assert not (project.path / "readings" / "anchors.lock").exists()


def test_malformed_lock_is_broken_input(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR))
    (project.path / "readings" / "anchors.lock").write_text("{ not json")
    result = project.runpytest("readings")
    assert result.ret == 2
    result.stdout.fnmatch_lines(["readings/anchors.lock:1: malformed lock: not valid JSON*"])


def test_pattern_lost_in_a_note_points_at_the_note(project: pytest.Pytester, installed_tree: TorchTree):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, body=BODY))
    assert project.runpytest("readings", "--approve").ret == 0
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, body=BODY.replace("handle._prefetched", "handle.prefetched")))
    result = project.runpytest("readings")
    assert result.ret == 6
    result.stdout.fnmatch_lines(
        [
            "*drifted: pattern lost",
            f"  {GUIDE}:15: note pattern `handle.prefetched = True` matches nowhere in `prefetch`*",
        ]
    )


PREDICT_BODY = (
    BODY
    + """
```predict rank-zero-value
question = "What does rank 0's check return?"
kind = "number"
answer = {answer}
claim = "forward-order"
observe = "."
explain = "The fake check returns its rank."
```

```predict no-observe
question = "Does the claim hold?"
kind = "choice"
choices = ["yes", "no"]
answer = "yes"
claim = "forward-order"
explain = "It does."
```
"""
)


@pytest.mark.parametrize(("answer", "passes"), [(0, True), (1, False)])
def test_a_predict_answer_is_checked_against_the_run(project: pytest.Pytester, answer: int, passes: bool):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=CLAIMS, body=PREDICT_BODY.format(answer=answer)))
    result = project.runpytest("readings", "-k", "claim or predict")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == (4 if passes else 3) and outcomes.get("failed", 0) == (0 if passes else 1)
    if not passes:
        result.stdout.fnmatch_lines(
            ["*predict `rank-zero-value`: the guide answers 1; the run of `forward-order` observed 0 at `.`*"]
        )
        # Every claim held, and yet a behaviour the guide states changed: the gate says so.
        assert result.ret == 1
        result.stdout.fnmatch_lines(["outcome: behaviour-changed (exit 1)"])
    # Two questions and the claim item share one run of forward-order.
    assert [r["target"] for r in requests(project)].count("fakechecks.prefetch:forward_order") == 2  # 2 claims


def test_a_predict_question_fails_when_its_claim_fails(project: pytest.Pytester):
    failing = PREDICT_BODY.format(answer=0)
    claims = CLAIMS.replace('kwargs = { fake = "ok" }', 'kwargs = { fake = "fail" }', 1)
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=claims, body=failing))
    result = project.runpytest("readings", "-k", "predict", "--drift-report", "gate/r.json")
    result.assert_outcomes(failed=2, deselected=3)
    result.stdout.fnmatch_lines(["*predict `no-observe`: its claim `forward-order` did not pass*"])
    assert result.ret == 1  # its claim item was deselected: the predict items' failures carry the verdict
    summary = json.loads((project.path / "gate" / "summary.json").read_text())
    assert summary["outcome"] == "behaviour-changed" and len(summary["other_failures"]) == 2


XFAIL_CLAIM = """
[[claims]]
id = "fixed-upstream"
statement = "Forward prefetch follows the order recorded in iteration 1."
check = "fakechecks.prefetch:forward_order"
world_size = 2
kwargs = {{ fake = "{mode}" }}
xfail = {{ strict = {strict}, reason = "upstream bug", issue = "https://x/1", fails_with = "{fails_with}" }}
"""

XFAIL_PREDICT = """
# Forward prefetch

```predict what-it-found
question = "What order did the failing run find?"
kind = "text"
answer = "[2, 1]"
claim = "fixed-upstream"
show = "actual"
explain = "The order the Violation reports."
```

```predict observed-order
question = "Which value comes first in the order it found?"
kind = "number"
answer = 2
claim = "fixed-upstream"
observe = "actual.0"
explain = "The Violation's details."
```
"""


def _xfail_guide(mode: str, strict: str = "true", fails_with: str = "prefetch-order", body: str = BODY) -> str:
    claim = XFAIL_CLAIM.format(mode=mode, strict=strict, fails_with=fails_with)
    return guide(anchors=PREFETCH_ANCHOR, claims=claim, body=body)


def test_an_xfail_claim_that_fails_for_its_reason_is_xfailed(project: pytest.Pytester):
    write_guide(project, _xfail_guide("fail"))
    result = project.runpytest("readings", "-k", "claim", "-rx")
    result.assert_outcomes(xfailed=1, deselected=1)
    result.stdout.fnmatch_lines(["XFAIL *claim[[]fixed-upstream[]] - upstream bug (https://x/1)"])


def test_an_xfail_claim_that_fails_for_another_reason_fails(project: pytest.Pytester):
    write_guide(project, _xfail_guide("fail", fails_with="some-other-reason"))
    result = project.runpytest("readings", "-k", "claim")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            f"{GUIDE}:12: claim `fixed-upstream` failed, but not as its xfail expects",
            "*expected to fail with `some-other-reason`: upstream bug*",
            "  failed with `prefetch-order` instead",
        ]
    )


def test_a_strict_xfail_claim_that_passes_fails_and_says_what_to_do(project: pytest.Pytester):
    write_guide(project, _xfail_guide("ok"))
    result = project.runpytest("readings", "-k", "claim")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            f"{GUIDE}:12: claim `fixed-upstream` passed unexpectedly (strict xfail)",
            "*torch may have fixed it: re-read the guide against this torch, then remove the claim's `xfail`",
        ]
    )


def test_a_lenient_xfail_claim_that_passes_is_reported_xpassed(project: pytest.Pytester):
    write_guide(project, _xfail_guide("ok", strict="false"))
    result = project.runpytest("readings", "-k", "claim")
    result.assert_outcomes(xpassed=1, deselected=1)


def test_an_xfail_claim_still_needs_runtime_evidence(project: pytest.Pytester):
    write_guide(project, _xfail_guide("no-evidence"))
    result = project.runpytest("readings", "-k", "claim")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["this check never ran the code its guide reads."])


def test_predict_questions_read_an_expected_failure_from_its_violation(project: pytest.Pytester):
    write_guide(project, _xfail_guide("fail", body=XFAIL_PREDICT))
    result = project.runpytest("readings", "-k", "predict")
    result.assert_outcomes(passed=2, deselected=2)


PROPERTY_CLAIM = """
[[claims]]
id = "holds-for-all"
statement = "Forward prefetch follows the order recorded in iteration 1."
check = "fakechecks.prefetch:forward_order"
world_size = 2
kwargs = {{ fake = "property" }}
property = {{ draw = "fakechecks.draws:numbers", examples = {examples} }}
"""


def test_a_property_claim_shrinks_a_failure_and_shows_the_example(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=PROPERTY_CLAIM.format(examples=50)))
    result = project.runpytest("readings", "-k", "claim")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            f"{GUIDE}:12: claim `holds-for-all` failed",
            "*falsifying example (shrunk; * runs in all): example =",
            "    51",
        ]
    )
    sent = [r["kwargs"] for r in requests(project)]
    assert all("example" in kwargs for kwargs in sent) and len(sent) > 2  # one request per drawn example


def test_a_property_claim_that_holds_runs_each_example_once(project: pytest.Pytester):
    # Only 0..50 can be drawn: the property holds; each example is one request, at most `examples` of them.
    (project.path / "fakechecks" / "draws.py").write_text(
        "def numbers():\n    from hypothesis import strategies as st\n\n    return st.integers(0, 50)\n"
    )
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=PROPERTY_CLAIM.format(examples=7)))
    result = project.runpytest("readings", "-k", "claim")
    result.assert_outcomes(passed=1, deselected=1)
    assert 1 <= len(requests(project)) <= 7


def test_a_claim_for_other_torch_versions_is_skipped(project: pytest.Pytester):
    claims = CLAIMS.replace('kwargs = { fake = "ok" }', 'kwargs = { fake = "ok" }\ntorch = "<2.0"', 1)
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=claims))
    result = project.runpytest("readings", "-k", "claim", "-rs")
    result.assert_outcomes(passed=1, skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*claim `forward-order` describes torch <2.0; this torch is 2.13.0*"])
    assert [r["world_size"] for r in requests(project)] == [4]  # the skipped claim sent nothing


def test_slow_claims_are_skipped_unless_asked_for(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("FSDP_READINGS_SLOW", raising=False)
    project.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p reader.plugin\n")
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=CLAIMS))
    result = project.runpytest("readings", "-k", "claim", "-rs")
    result.assert_outcomes(passed=1, skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*slow: run with --slow (or FSDP_READINGS_SLOW=1)*"])
    assert project.runpytest("readings", "-k", "claim", "--slow").parseoutcomes()["passed"] == 2
    assert project.runpytest("readings", "-k", "claim", "-m", "slow").parseoutcomes()["passed"] == 1
    monkeypatch.setenv("FSDP_READINGS_SLOW", "1")
    assert project.runpytest("readings", "-k", "claim").parseoutcomes()["passed"] == 2


def test_claim_results_are_recorded_for_list_with_the_torch_they_ran_on(
    project: pytest.Pytester, installed_tree: TorchTree, private_progress: Path
):
    """`pytest readings/` is the quick start's first command: `fsdp-readings list` right after it must show its
    claim results (in the user data directory; the suite's tests point it at a private one). A claim that is
    not judged (a preview, a slow one left out) is not recorded."""
    from reader.claims.progress import Progress

    failing = CLAIMS.replace('kwargs = { fake = "ok" }\n\n[[claims]]', 'kwargs = { fake = "fail" }\n\n[[claims]]', 1)
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=failing))
    project.runpytest("readings", "-k", "claim").assert_outcomes(passed=1, failed=1)
    recorded = Progress(private_progress / "progress.json")
    version = installed_tree.source().version
    assert recorded.claims("04-forward-prefetch", version) == {"forward-order": "failed", "no-prefetch": "passed"}
    project.runpytest("readings", "-k", "claim", "--torch-source", str(installed_tree.root))  # a preview: skipped
    assert Progress(private_progress / "progress.json").claims("04-forward-prefetch") == recorded.claims(
        "04-forward-prefetch"
    )


APPROVE_CLAIMS = """
[[claims]]
id = "holds"
statement = "Forward prefetch follows the order recorded in iteration 1."
check = "fakechecks.prefetch:forward_order"
world_size = 2
kwargs = { fake = "ok" }

[[claims]]
id = "breaks"
statement = "Prefetch happens in the recorded order."
check = "fakechecks.prefetch:forward_order"
world_size = 2
kwargs = { fake = "fail" }
"""


def lock_text(project: pytest.Pytester) -> str | None:
    lock = project.path / "readings" / "anchors.lock"
    return lock.read_text() if lock.exists() else None


def test_approval_is_refused_when_a_claim_fails_and_nothing_is_written(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR, claims=APPROVE_CLAIMS, body=BODY))
    result = project.runpytest("readings", "--approve=04-forward-prefetch")
    assert result.ret == 1
    result.assert_outcomes(passed=1, failed=3)  # the failing claim, and both drifted anchors it kept unapproved
    result.stdout.fnmatch_lines(
        [
            f"{GUIDE}:8: anchor `prefetch` (*) not approved: not yet approved",
            "  nothing of 04-forward-prefetch was recorded:",
            "    claim `breaks` failed on torch 2.13.0+cpu: `prefetch-order` rank 1: prefetch order was [2, 1]",
            '    fix the guide, scope the claim to the torch it holds for *, or approve anyway with --force "<why>"*',
        ]
    )
    result.stdout.fnmatch_lines(["not approved (nothing of these guides was recorded):", "  04-forward-prefetch: *"])
    assert lock_text(project) is None


def test_forcing_an_approval_keeps_the_reason_and_the_failed_claims(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=APPROVE_CLAIMS, body=BODY))
    reason = "breaks is a real behaviour change of this torch; the guide says so"
    result = project.runpytest("readings", "--approve=04-forward-prefetch", f"--force={reason}")
    assert result.ret == 1  # its claim still fails: the run is not clean, but the person decided
    result.stdout.fnmatch_lines([f"  04-forward-prefetch on torch 2.13.0: 1 claims held; forced over breaks: {reason}"])
    record = json.loads(lock_text(project) or "{}")["guides"]["04-forward-prefetch"]["2.13.0"]
    assert record == {"claims_failed": ["breaks"], "claims_held": 1, "forced": reason}


def test_approval_needs_every_claim_of_the_guide_to_run(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=APPROVE_CLAIMS.replace('"fail"', '"ok"'), body=BODY))
    result = project.runpytest("readings", "--approve=04-forward-prefetch", "-k", "anchor or holds")
    assert result.ret == 6  # not approved: its anchors still drift
    result.stdout.fnmatch_lines(["    claim `breaks` did not run in this session (deselected, *"])
    assert lock_text(project) is None
    assert project.runpytest("readings", "--approve=04-forward-prefetch").ret == 0
    record = json.loads(lock_text(project) or "{}")["guides"]["04-forward-prefetch"]
    assert record == {"2.13.0": {"claims_held": 2}}


def test_approval_runs_slow_claims_and_reads_anchors_after_the_claims(project: pytest.Pytester):
    project.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p reader.plugin\n")  # no --slow
    write_guide(project, guide(anchors=PREFETCH_ANCHOR, claims=CLAIMS, body=BODY))
    plain = project.runpytest("readings", "-v")
    plain.assert_outcomes(passed=1, failed=1, skipped=1)  # the slow claim is skipped without --slow
    approved = project.runpytest("readings", "--approve=04-forward-prefetch", "-v")
    assert approved.ret == 0
    approved.assert_outcomes(passed=3)
    lines = [line for line in approved.stdout.lines if line.startswith(f"{GUIDE}::")]
    assert [line.split()[0].split("::")[1] for line in lines] == ["claim[forward-order]", "claim[no-prefetch]",
                                                                   "anchor[prefetch]"]  # fmt: skip


def test_approval_options_that_cannot_record_the_truth_are_usage_errors(
    project: pytest.Pytester, installed_tree: TorchTree, tmp_path: Path
):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR))
    wheel = installed_tree.wheel(tmp_path / "torch-2.15.0-cp311-cp311-linux_x86_64.whl", version="2.15.0")
    preview = project.runpytest("readings", "--approve", "--torch-source", str(wheel))
    assert preview.ret == 2
    preview.stderr.fnmatch_lines(["*--approve records what ran on the installed torch, and with --torch-source*"])
    forced = project.runpytest("readings", "--force=a reason with no approval")
    assert forced.ret == 2
    forced.stderr.fnmatch_lines(["*--force gives the reason to approve a guide anyway: use it with --approve=<id>*"])
    terse = project.runpytest("readings", "--approve", "--force=ok")
    assert terse.ret == 2
    terse.stderr.fnmatch_lines(["*--force needs the reason a person approves anyway, in words*"])
    assert lock_text(project) is None


def test_a_bare_approve_lists_the_guides_to_approve_when_there_are_several(project: pytest.Pytester):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR))
    write_guide(project, guide("05-other", anchors=UNSHARD_ANCHOR), "readings/05-other.md")
    result = project.runpytest("readings", "--approve")
    assert result.ret == 2
    result.stdout.fnmatch_lines(
        [
            "--approve: 2 guides to approve on torch 2.13.0+cpu; approve each after re-reading it, by id *",
            "    04-forward-prefetch: prefetch (not yet approved)",
            "    05-other: unshard (not yet approved)",
        ]
    )
    assert lock_text(project) is None
    assert project.runpytest("readings", "--approve=05-other").ret == 6  # 04 still drifts
    assert project.runpytest("readings", "--approve").ret == 0  # one left: that one
    assert set(json.loads(lock_text(project) or "{}")["guides"]) == {"04-forward-prefetch", "05-other"}


RANGED_ANCHOR = """
[[anchors]]
name = "limit"
symbol = "torch.distributed.fsdp._runtime_utils:_PREFETCH_LIMIT"
torch = "<2.15"
"""

RANGED_CLAIM = """
[[claims]]
id = "order"
statement = "Prefetch follows the recorded order."
check = "fakechecks.prefetch:forward_order"
world_size = 2
kwargs = { fake = "ok", expected = { expect = "order" } }
"""

RANGED_BODY = """
```expect order pairs [torch <2.15]
root -> blocks.0
```

```expect order pairs [torch >=2.15]
root -> blocks.1
```
"""


def test_items_read_the_guide_as_it_is_on_the_installed_torch(project: pytest.Pytester, installed_tree: TorchTree):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + RANGED_ANCHOR, claims=RANGED_CLAIM, body=RANGED_BODY))
    assert project.runpytest("readings", "--approve=04-forward-prefetch").ret == 0
    assert requests(project)[-1]["kwargs"]["expected"] == ["root -> blocks.0"]
    installed_tree.set_version("2.15.0+cu132")
    installed_tree.write(RUNTIME, installed_tree.read(RUNTIME).replace("_PREFETCH_LIMIT: int = 2\n", ""))  # removed
    result = project.runpytest("readings", "-rs")
    assert result.ret == 0
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * anchor `limit` reads torch <2.15; this torch is 2.15.0+cu132"])
    assert requests(project)[-1]["kwargs"]["expected"] == ["root -> blocks.1"]


def test_approval_is_all_or_nothing_when_an_anchor_cannot_be_pinned(
    project: pytest.Pytester, installed_tree: TorchTree
):
    write_guide(project, guide(anchors=PREFETCH_ANCHOR + UNSHARD_ANCHOR))
    assert project.runpytest("readings", "--approve=04-forward-prefetch").ret == 0
    before = lock_text(project)
    installed_tree.edit(RUNTIME, "handle._prefetched = True", "handle._prefetched = 1")  # pinnable: code changed
    installed_tree.edit("torch/distributed/fsdp/_flat_param.py", "def unshard(self):", "def unshard_now(self):")
    result = project.runpytest("readings", "--approve=04-forward-prefetch")
    assert result.ret == 6  # refused: an anchor cannot be pinned; re-read, then repin
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*anchor `prefetch` (*) not approved: code changed",
            "  nothing of 04-forward-prefetch was recorded:",
            "    04-forward-prefetch/unshard: removed: *has no `FlatParamHandle.unshard`",
        ]
    )
    assert lock_text(project) == before  # the pinnable `prefetch` was not recorded alone
