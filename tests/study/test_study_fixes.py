"""Self-study without stumbles, in process: GPU claims skipped as pytest skips them, answers graded fairly and
validated, honest scores, Ctrl-C, help that is right, guides found from anywhere, and output that fits 60, 80
and 100 columns, piped and without colour. (`test_terminal.py` drives the same in a real pseudo-terminal.)"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from checks.ranks.manager import PoolManager
from reader.commands import app
from reader.format import parse
from reader.format.parse import load_all
from reader.source.checkref import CheckFinder
from tests.study.test_commands import GUIDE, READINGS, REPO, RIGHT, answers, run

WIDTHS = (60, 80, 100)
GUIDES, _ = load_all([READINGS], CheckFinder(extra_paths=[REPO]))
GPU_CLAIM = ("12-flat-parameter", "offload-params-on-gpu")


def fits(out: str, width: int, *whole: str) -> None:
    """Every line within ``width``, nothing cut with an ellipsis, no escape codes, and every name in ``whole``
    printed whole on one line (an id folded across lines is a name no one can paste)."""
    lines = out.splitlines()
    assert max(map(len, lines), default=0) <= width, max(lines, key=len)
    assert "…" not in out and "\x1b[" not in out
    missing = [name for name in whole if not any(name in line for line in lines)]
    assert not missing, missing


# -- GPU claims -------------------------------------------------------------------------------------------------


def test_a_gpu_claim_is_skipped_with_pytests_reason_not_run_on_cpu(pool: PoolManager, data_dir: Path) -> None:
    guide, claim = GPU_CLAIM
    code, out = run(["check", guide, claim], pool)
    assert code == 0, out
    flat = " ".join(out.split())
    assert "skipped 2 ranks" in flat and "needs 2 CUDA device(s) for nccl (one per rank); 0 here" in flat
    assert "FAILED" not in out
    saved = json.loads((data_dir / "progress.json").read_text())["claims"][guide][claim]
    assert saved["result"] == "skipped"
    for view in (["timeline", guide, claim], ["memory", guide, claim], ["layout", guide, claim]):
        code, out = run(view, pool)
        assert code == 0 and f"{claim} skipped" in out and "0 here" in out, out


def test_with_enough_gpus_the_claim_is_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The skip depends on the devices, not on the marker alone: with two CUDA devices it runs."""
    from checks.ranks import backend
    from reader.claims.verdict import gpu_skip
    from reader.format.parse import load_guide

    claim = load_guide(READINGS / f"{GPU_CLAIM[0]}.md").claim(GPU_CLAIM[1])
    monkeypatch.setattr(backend, "cuda_device_count", lambda: 2)
    assert gpu_skip(claim) is None
    monkeypatch.setattr(backend, "cuda_device_count", lambda: 1)
    assert gpu_skip(claim) == f"claim `{GPU_CLAIM[1]}` needs 2 CUDA device(s) for nccl (one per rank); 1 here"


# -- grading ------------------------------------------------------------------------------------------------------


def test_answers_in_any_arrow_case_separator_or_unit_are_graded_right(pool: PoolManager, data_dir: Path, tmp_path):
    fair = (
        'is-root-at-construction = "B)"\nmismatch-surfaces = "AT THE FIRST FORWARD"\nroot-all-gather-at-4 = "3 528"\n'
    )
    code, out = run(["predict", GUIDE, "--no-run", "--answers", str(answers(tmp_path, fair))], pool)
    assert code == 0, out
    assert "score: 3/3 on 02-root-and-lazy-init" in out


@pytest.mark.parametrize(
    ("answer", "says"),
    [("lots", "a number, such as 3528"), ("3528 apples", "a number, such as 3528")],
)
def test_an_answer_file_with_an_answer_that_does_not_fit_is_broken_input(data_dir, tmp_path, answer, says) -> None:
    wrong = RIGHT.replace('"3,528"', f'"{answer}"')
    code, out = run(["predict", GUIDE, "--no-run", "--answers", str(answers(tmp_path, wrong))])
    flat = " ".join(out.split())
    assert code == 2 and f"question `root-all-gather-at-4`: '{answer}' does not fit: {says}" in flat, out
    assert not (data_dir / "progress.json").exists()  # nothing was scored


def test_an_exercise_answer_that_is_not_a_choice_is_broken_input(data_dir, tmp_path) -> None:
    path = tmp_path / "exercise.toml"
    path.write_text('two-ahead = "z"\n')
    code, out = run(["exercise", "04-forward-prefetch", "two-ahead", "--answers", str(path)])
    assert code == 2 and "exercise `two-ahead`: 'z' does not fit: one of the letters a," in " ".join(out.split())
    assert not (data_dir / "progress.json").exists()  # the exercise was not used up


def test_revealing_answers_then_retaking_cannot_raise_the_score(pool: PoolManager, data_dir: Path, tmp_path) -> None:
    wrong = 'is-root-at-construction = "a"\nmismatch-surfaces = "never"\nroot-all-gather-at-4 = "1"\n'
    code, out = run(["predict", GUIDE, "--no-run", "--answers", str(answers(tmp_path, wrong))], pool)
    assert "score: 0/3" in out
    code, out = run(["predict", GUIDE, "--no-run", "--answers", str(answers(tmp_path, RIGHT))], pool)
    assert code == 0 and "score: 0/3" in out and "you        b  right" in out  # right, but a retake
    assert "this attempt: 3/3" in out  # the retake's own result, beside the score it cannot raise
    saved = json.loads((data_dir / "progress.json").read_text())["predict"][GUIDE]
    assert saved["is-root-at-construction"]["correct"] is True and saved["is-root-at-construction"]["honest"] is False


def test_show_answers_reveals_them_so_a_first_answer_after_it_does_not_score(data_dir, tmp_path) -> None:
    assert run(["show", GUIDE, "--answers"])[0] == 0
    code, out = run(["predict", GUIDE, "--no-run", "--answers", str(answers(tmp_path, RIGHT))])
    assert code == 0 and "score: 0/3" in out


# -- Ctrl-C ---------------------------------------------------------------------------------------------------------


class InterruptedPool:
    """A pool that runs the first request and is interrupted (Ctrl-C) during the second."""

    def __init__(self, inner: PoolManager) -> None:
        self.inner, self.calls = inner, 0

    def run(self, request: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt
        return self.inner.run(request)


def test_ctrl_c_in_check_prints_one_line_keeps_what_finished_and_exits_130(pool: PoolManager, data_dir) -> None:
    claims = ["only-outermost-is-root", "non-roots-share-root-state", "mismatched-limit-all-gathers-raises"]
    code, out = run(["check", GUIDE, *claims], InterruptedPool(pool))  # type: ignore[arg-type]
    assert code == 130, out
    assert "interrupted: 1 of 3 claims ran; their results are kept" in " ".join(out.split())
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    saved = json.loads((data_dir / "progress.json").read_text())["claims"][GUIDE]
    assert list(saved) == ["only-outermost-is-root"] and saved["only-outermost-is-root"]["result"] == "passed"


# -- help, guides found from anywhere -------------------------------------------------------------------------


EXAMPLE = re.compile(r"^\s+(?:\S+=\S+ )?fsdp-readings (?:--readings \S+ )?(\w[\w-]*)(?P<words>(?: \w[\w.-]*)*)", re.M)


def _help(command: str) -> str:
    parser = app.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return sub.format_help()


@pytest.mark.parametrize("command", [c.name for c in app.COMMANDS])
def test_every_example_in_help_names_a_guide_claim_or_exercise_that_exists(command: str) -> None:
    from checks.breakit.exercises import exercises_of

    text = _help(command)
    assert "examples:" in text, text
    guides = {g.id: g for g in GUIDES}
    for found in EXAMPLE.finditer(text):
        if found.group(1) != command:
            continue
        words = found.group("words").split()  # the positionals: the pattern stops at the first option
        for word in words:
            if word in guides or not re.fullmatch(r"\d\d-[\w-]+", word):
                continue
            pytest.fail(f"`{command} --help` names guide {word}, which does not exist")
        if command in ("check", "timeline", "memory", "layout") and len(words) > 1 and words[0] in guides:
            assert words[1] in {c.id for c in guides[words[0]].claims}, (command, words)
        if command == "exercise" and len(words) > 1 and words[0] in guides:
            modules = {c.check.split(":")[0] for c in guides[words[0]].claims}
            assert words[1] in {e.id for m in modules for e in exercises_of(m)}, words


def test_show_says_it_needs_a_guide_and_takes_readings_after_the_command(tmp_path) -> None:
    assert "(default: all)" not in _help("show")
    code, out = run(["show", "00-format", "--readings", str(READINGS)])
    assert code == 0 and "How a reading guide is written" in out
    missing = tmp_path / "missing"
    code, out = run(["show", "00-format", "--readings", str(missing)])  # the later --readings wins
    assert code == 2 and f"no readings directory at {missing}" in out


def test_the_guides_are_found_from_another_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no ./readings here: the checkout's own, beside the reader package
    args = app.build_parser().parse_args(["list"])
    assert parse.find_readings(args.readings) == parse.CHECKOUT_READINGS
    assert app.main(["list"], app.make_console(record=True, width=100)) == 0
    monkeypatch.setattr(parse, "CHECKOUT_READINGS", tmp_path / "no-checkout")
    console = app.make_console(record=True, width=100)
    assert app.main(["list"], console) == 2
    said = " ".join(console.export_text().split())
    assert "pass --readings DIR" in said and "a wheel install ships no guides" in said


# -- fits any terminal ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
def test_list_fits_every_width_with_ids_whole_and_words_for_every_state(width: int, data_dir: Path) -> None:
    code, out = run(["list"], width=width)
    assert code == 0
    fits(out, width, *(g.id for g in GUIDES))
    assert "not run" in out and "not tried" in out and "none" in out  # distinct words, not "0/N" and "-"
    assert "0/" not in out


@pytest.mark.parametrize("width", WIDTHS)
def test_check_fits_every_width(width: int, pool: PoolManager, data_dir: Path) -> None:
    claims = ["non-roots-share-root-state", "mismatched-limit-all-gathers-raises"]
    code, out = run(["check", GUIDE, *claims], pool, width=width)
    assert code == 0, out
    fits(out, width, GUIDE, *claims)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("argv", [["7B", "-n", "8"], ["--model", "mini_gpt:grammar", "-n", "4"], ["--seeds"]])
def test_estimate_fits_every_width(width: int, argv: list[str]) -> None:
    code, out = run(["estimate", *argv], width=width)
    assert code == 0
    strategies = ["fsdp2-no-reshard", "shard-grad-op"] if "--seeds" not in argv else ["ZeRO-2", "Pos+g+p"]
    fits(out, width, *strategies)
    if "--seeds" not in argv:
        for value in ("38.5 GB", "3.5 GB", "73.5 GB"):  # values whole, never "3.5 …"
            assert value in out or "--model" in argv, value


@pytest.mark.parametrize("width", WIDTHS)
def test_timeline_fits_every_width_with_source_locations_whole(width: int, pool: PoolManager) -> None:
    code, out = run(["timeline", "17-fsdp2-prefetch", "order-of-this-step", "--iteration", "1"], pool, width=width)
    assert code == 0, out
    fits(out, width)
    locations = re.findall(r"_fully_shard/_fsdp_\w+\.py:\d+", out)
    assert locations, out
    # A location split across lines leaves a fragment ending in ":" or a line starting with digits only.
    assert not re.search(r"\.py:\s*$", out, re.M) and not re.search(r"^\s*\d+\s*$", out, re.M)


def test_a_wrong_list_answer_says_what_is_missing_and_what_is_extra(data_dir: Path, tmp_path: Path) -> None:
    text = (
        'reversed-order = "root → blocks.2"\n'
        'held-during-blocks-1 = "ROOT blocks.2 blocks.1"\n'  # a set: its items in another order, space-separated
        'eval-loop-prefetch = "root->blocks.0, blocks.0->blocks.1, blocks.1->blocks.2"\n'
        'alive-at-blocks-1-backward = "1"\n'
    )
    code, out = run(["predict", "04-forward-prefetch", "--no-run", "--answers", str(answers(tmp_path, text))])
    assert code == 0, out
    flat = " ".join(out.split())
    assert "missing: root -> blocks.0; not in the answer: root -> blocks.2" in flat
    assert "in another order" not in flat  # the sets ask for no order
    assert "score: 2/4 on 04-forward-prefetch" in flat  # the second and third, in their own spacing, are right


def test_an_order_answer_in_another_order_is_told_so() -> None:
    from rich.console import Console

    from reader.format.predict import PredictQuestion
    from reader.study.predict import Reveal, _revealed

    question = PredictQuestion("w", "Local shapes on ranks 0-3?", "order", ["3x2", "3x2", "0x2"], "c", None, None,
                               "Rank 3 holds none.", (), 0.0, 1, 2)  # fmt: skip
    console = Console(record=True, width=80, force_terminal=False, color_system=None)
    console.print(_revealed(Reveal(question, "0x2 3x2 3x2", False, ["3x2", "3x2", "0x2"], None)))
    assert "the same items, in another order" in console.export_text()
