"""``fsdp-readings check`` and ``predict`` as a learner meets them: driven in-process on the session's rank pool
(the same code path as the command line), and once through a real subprocess without a terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from checks.breakit.patches import set_to, wrapping
from checks.guides.g09_no_shard_is_ddp.recipes import reduce_also_over_replicas
from checks.ranks.manager import PoolManager
from reader.commands.app import build_parser, make_console
from reader.format.parse import load_guide

REPO = Path(__file__).resolve().parents[2]
READINGS = REPO / "readings"
ANSI = re.compile(r"\x1b\[")
GUIDE = "02-root-and-lazy-init"


def run(argv: list[str], pool: PoolManager | None = None, patches: tuple = (), width: int = 80) -> tuple[int, str]:
    args = build_parser().parse_args(["--readings", str(READINGS), *argv])
    args.manager, args.patches = pool, patches
    console = make_console(record=True, width=width, force_terminal=False, color_system=None)
    code = args.run(args, console)
    return code, console.export_text()


def answers(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "answers.toml"
    path.write_text(text)
    return path


RIGHT = 'is-root-at-construction = "b"\nmismatch-surfaces = "at the first forward"\nroot-all-gather-at-4 = "3,528"\n'


def test_predict_scores_and_reveals_what_the_run_observed(pool, data_dir, tmp_path) -> None:
    wrong = RIGHT.replace('"b"', '"a"')
    code, out = run(["predict", GUIDE, "--answers", str(answers(tmp_path, wrong))], pool)
    assert code == 0, out
    assert "score: 2/3 on 02-root-and-lazy-init" in out
    # The reveals come from the runs: the _is_root map before the first forward, the ValueError's message, and
    # the root's all-gather size.
    assert "{'root': None, 'blocks.0': None, 'blocks.1': None, 'blocks.2': None}" in out
    assert "Expects one homogeneous value for limit_all_gathers" in out
    assert re.search(r"observed\s+3528", out)
    saved = json.loads((data_dir / "progress.json").read_text())["predict"][GUIDE]
    assert saved["is-root-at-construction"]["correct"] is False and saved["root-all-gather-at-4"]["correct"] is True
    assert saved["root-all-gather-at-4"]["observed"] == 3528


def test_a_broken_torch_changes_what_is_revealed(pool, data_dir, tmp_path) -> None:
    # Without the homogeneity check the mismatched unit raises nothing: the claim fails and the reveal says so.
    broken = set_to("torch.distributed.fsdp._runtime_utils:HOMOGENEOUS_ATTR_NAMES", ())
    code, out = run(["predict", GUIDE, "--answers", str(answers(tmp_path, RIGHT))], pool, patches=(broken,))
    assert code == 1
    assert "claim mismatched-limit-all-gathers-raises FAILED" in out
    assert "Expects one homogeneous value" not in out


def test_progress_lands_outside_the_repository(pool, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("FSDP_READINGS_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    code, out = run(["predict", GUIDE, "--no-run", "--answers", str(answers(tmp_path, RIGHT))], pool)
    assert code == 0, out
    saved = tmp_path / "xdg" / "fsdp-readings" / "progress.json"
    assert saved.exists() and REPO not in saved.resolve().parents
    assert not list(REPO.rglob("progress.json"))


def test_check_runs_claims_and_names_a_failure(pool) -> None:
    code, out = run(["check", GUIDE, "non-roots-share-root-state", "mismatched-limit-all-gathers-raises"], pool)
    assert code == 0 and "2 passed, 0 failed" in out
    broken = set_to("torch.distributed.fsdp._runtime_utils:HOMOGENEOUS_ATTR_NAMES", ())
    code, out = run(["check", GUIDE, "mismatched-limit-all-gathers-raises"], pool, patches=(broken,))
    assert code == 1 and "0 passed, 1 failed" in out
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())  # the panel wraps the report
    assert "units with different limit_all_gathers ran their first forward without an error" in flat


def test_check_reports_an_expected_failure_and_the_day_it_is_fixed(pool) -> None:
    # HYBRID_SHARD's default groups on CPU never sync replicas (pytorch#154888): a strict xfail, which holds today.
    xfail = ["check", "11-final-callback-and-hybrid-shard", "hybrid-default-groups-average"]
    code, out = run(xfail, pool, width=200)
    assert code == 0 and "0 passed, 1 xfailed, 0 failed" in out, out
    # A torch that all-reduces over the replicas too, as a fix would: the check passes and the claim fails.
    fixed = wrapping("torch.distributed.fsdp._runtime_utils:_reduce_grad_no_shard", reduce_also_over_replicas)
    code, out = run(xfail, pool, patches=(fixed,), width=200)
    assert code == 1 and "0 passed, 1 failed" in out, out
    assert "passed unexpectedly (strict xfail)" in out and "remove the claim's `xfail`" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["check", "99-nope"], "unknown guide id: 99-nope"),
        (["check", GUIDE, "no-such-claim"], "has no claim no-such-claim"),
        (["predict", "00-format"], "has no predict questions"),
    ],
)
def test_bad_input_exits_2_and_lists_what_exists(argv: list[str], says: str) -> None:
    code, out = run(argv)
    assert code == 2 and says in out
    assert "02-root-and-lazy-init" in out or "only-outermost-is-root" in out or "predict" in out


def test_an_answer_file_that_does_not_match_the_questions(data_dir, tmp_path) -> None:
    code, out = run(["predict", GUIDE, "--answers", str(answers(tmp_path, 'made-up = "1"\n'))])
    assert code == 2 and "unknown question(s) made-up" in out and "is-root-at-construction" in out
    code, out = run(["predict", GUIDE, "--answers", str(tmp_path / "missing.toml")])
    assert code == 2 and "cannot read answers" in out


def test_every_line_fits_80_columns(pool, data_dir, tmp_path) -> None:
    _, out = run(["predict", GUIDE, "--no-run", "--answers", str(answers(tmp_path, RIGHT))], pool, width=80)
    assert max(len(line) for line in out.splitlines()) <= 80


def test_the_command_line_without_a_terminal(tmp_path) -> None:
    env = {**os.environ, "FSDP_READINGS_DATA_DIR": str(tmp_path), "COLUMNS": "80"}
    helped = subprocess.run(
        [sys.executable, "-m", "reader", "predict", "--help"], capture_output=True, text=True, env=env, check=False
    )
    assert helped.returncode == 0 and "examples:" in helped.stdout and "--answers" in helped.stdout
    done = subprocess.run(
        [sys.executable, "-m", "reader", "--readings", str(READINGS), "check", GUIDE, "non-roots-share-root-state"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 0 failed" in done.stdout and not ANSI.search(done.stdout)


def test_no_color_on_a_terminal_too() -> None:
    console = Console(force_terminal=True, record=True, width=80)
    assert console.color_system is not None  # the baseline: a terminal gets colour...
    os.environ["NO_COLOR"] = "1"
    try:
        assert make_console(force_terminal=True).no_color  # ...unless NO_COLOR is set
    finally:
        del os.environ["NO_COLOR"]


def test_an_exercise_reveals_the_failure_its_break_it_test_asserts(pool, data_dir, tmp_path) -> None:
    path = tmp_path / "exercise.toml"
    path.write_text('two-ahead = "b"\n')  # b) follows-iteration-1-order
    code, out = run(["exercise", "04-forward-prefetch", "two-ahead", "--answers", str(path)], pool)
    assert code == 0, out
    flat = " ".join(out.split())
    assert "you b right" in flat and "follows-iteration-1-order: reason `prefetch-order`" in flat
    assert "this attempt: 1/1" in flat and "exercises: 1/1 on 04-forward-prefetch" in flat
    failing = re.search(r"failing (.*?) why", flat)
    assert failing is not None and "follows-iteration-1-order" in failing.group(1)
    saved = json.loads((data_dir / "progress.json").read_text())["exercises"]["04-forward-prefetch"]
    assert saved["two-ahead"]["correct"] is True


def test_an_unknown_exercise_lists_the_guides_exercises(data_dir) -> None:
    code, out = run(["exercise", "04-forward-prefetch", "no-such-one"])
    assert code == 2 and "two-ahead" in out and "record-every-iteration" in out


def test_list_shows_drift_claim_results_and_scores(pool, data_dir, tmp_path) -> None:
    run(["check", GUIDE, "non-roots-share-root-state"], pool)
    run(["predict", GUIDE, "--no-run", "--answers", str(answers(tmp_path, RIGHT))], pool)
    code, out = run(["list"], width=100)
    assert code == 0
    row = next(line for line in out.splitlines() if GUIDE in line)
    cells = [cell.strip() for cell in row.split("│") if cell.strip()]
    guide = load_guide(READINGS / f"{GUIDE}.md")
    # one claim run: the others are "not run", never read as failures
    not_run = len(guide.claims) - 1
    assert cells[1:] == [f"{len(guide.anchors)} ok", f"1/{len(guide.claims)} ({not_run} not run)", "3/3", "none"], cells
