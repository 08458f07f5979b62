"""A path through the guides and the views on it, as a learner meets them in process: where to start, guides by
number and prefix, what to read next, search and the glossary, exercise feedback that shows the patch and says
why, a check table with sentences and what was measured, and a timeline with what is held, bytes and labels."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from checks.ranks.manager import PoolManager
from reader.commands import app
from tests.study.test_commands import GUIDE, READINGS, run
from tests.study.test_study_fixes import fits


def test_no_command_shows_where_to_start_and_the_tracks_in_order() -> None:
    console = app.make_console(record=True, width=80, color_system=None, force_terminal=False)
    assert app.main(["--readings", str(READINGS)], console) == 0
    out = console.export_text()
    # The start and the tracks are path.toml's, read here as its file says (nothing else names the start).
    written = tomllib.loads((READINGS / "path.toml").read_text(encoding="utf-8"))
    assert written["start"] == "22-fsdp2-step-map" == written["tracks"][0]["guides"][0]  # the path starts at FSDP2
    assert f"Start here: fsdp-readings show {written['start']}" in out
    tracks = [line for line in out.splitlines() if re.match(r"^\d\. ", line)]
    assert tracks == [f"{n}. {track['name']}" for n, track in enumerate(written["tracks"], start=1)]
    assert tracks[:2] == ["1. FSDP2", "2. The FSDP1 step"]
    step = out.index("2. The FSDP1 step")
    assert out.index("01-step-map", step) < out.index("03-unshard-reshard", step) < out.index("11-final", step)
    fits(out, 80)


@pytest.mark.parametrize("given", ["6", "06", "06-back"])
def test_a_guide_by_its_number_or_a_unique_prefix(given: str) -> None:
    code, out = run(["show", given])
    assert code == 0 and "Backward prefetch" in out


def test_a_typo_names_the_close_guides_and_an_ambiguous_prefix_is_not_guessed() -> None:
    code, out = run(["show", "backward-prefech"])
    assert code == 2 and "unknown guide id: backward-prefech (did you mean 06-backward-prefetch" in out
    code, out = run(["show", "0"])  # 00-format is "0", but "0" is also the prefix of ten guides: a number wins
    assert code == 0 and "How a reading guide is written" in out
    code, out = run(["show", "1"])
    assert code == 0 and "The step map" in out
    from reader.study.session import guide_named

    assert guide_named("1", ["10-a", "11-b", "01-c"]) == "01-c"  # a number names its guide, not a prefix
    assert guide_named("1", ["10-a", "11-b"]) == []  # no guide 01: nothing is guessed
    assert guide_named("ab", ["abc", "abd"]) == ["abc", "abd"]  # an ambiguous prefix: both suggested, none taken


def test_show_ends_with_the_next_guide_on_the_path() -> None:
    code, out = run(["show", "06-backward-prefetch"])
    assert code == 0
    tail = " ".join(out.split()[-14:])
    assert "next: 07-pre-backward (The FSDP1 step, 5 of 8) fsdp-readings show 07-pre-backward" in tail
    code, out = run(["show", "11-final-callback-and-hybrid-shard"])  # the end of a track: the next track
    assert "next: 20-auto-wrap (Around the step, 1 of 4)" in " ".join(out.split())


def test_check_ends_with_the_next_guide_and_predict_with_reading_its_own(pool: PoolManager, data_dir: Path,
                                                                         tmp_path: Path) -> None:  # fmt: skip
    code, out = run(["check", GUIDE, "only-outermost-is-root"], pool)
    assert code == 0 and "next: 05-mixed-precision (Around the step, 3 of 4)" in " ".join(out.split())
    answers = tmp_path / "a.toml"
    answers.write_text('is-root-at-construction = "b"\nmismatch-surfaces = "b"\nroot-all-gather-at-4 = "1"\n')
    code, out = run(["predict", GUIDE, "--no-run", "--answers", str(answers)], pool)
    tail = " ".join(out.split()[-14:])
    assert code == 0 and f"next: read {GUIDE}, whose answers you just predicted fsdp-readings show {GUIDE}" in tail
    assert "05-mixed-precision" not in tail  # not past the guide just predicted


def test_search_finds_guides_claims_notes_anchors_and_terms_but_no_hidden_answer() -> None:
    code, out = run(["search", "post-forward", "order"], width=100)
    assert code == 0
    kinds = set(re.findall(r"^(guide|prose|claim|note|anchor|question|term)\s", out, re.M))
    assert {"claim", "note", "term"} <= kinds
    assert "fsdp-readings check 06-backward-prefetch pre-prefetches-reverse-post-forward" in out
    code, out = run(["search", "_post_backward_hook"], width=100)
    assert code == 0 and "anchor" in out and "08-post-backward-reduce-scatter" in out
    # An answer and its explanation stay hidden: guide 02's "None on all four" is only in its predict block.
    code, out = run(["search", "Construction decides nothing"])
    assert code == 1 and "nothing mentions" in out


def test_the_glossary_defines_the_seeds_and_names_the_guide_that_shows_them() -> None:
    code, out = run(["glossary", "seeds"])
    assert code == 0 and "The course documents this suite serves" in out
    assert "see: fsdp-readings show 13-zero-stages" in out
    code, out = run(["glossary", "flat paramter"])
    assert code == 2 and "did you mean `flat parameter`?" in out


def test_an_exercise_shows_its_patch_and_explains_the_claim_picked(pool: PoolManager, data_dir, tmp_path) -> None:
    path = tmp_path / "exercise.toml"
    path.write_text('two-back = "a"\n')  # a) pre-prefetches-reverse-post-forward: the exercise's own claim
    code, out = run(["exercise", "06-backward-prefetch", "two-back", "--answers", str(path)], pool, width=100)
    assert code == 0, out
    assert "def prefetch_two_back(" in out  # the recipe's own code, not its name only
    flat = " ".join(out.split())
    assert "pre-prefetches-reverse-post-forward: reason `prefetch-order`" in flat
    assert "differs from the expectation:" not in flat or "expected" in flat.split("differs from the expectation:")[1]


def test_the_check_table_gives_sentences_what_was_measured_and_the_pool_start_apart(
    pool: PoolManager, data_dir: Path
) -> None:
    code, out = run(["check", GUIDE, "only-outermost-is-root"], pool)
    assert code == 0
    flat = " ".join(out.split())
    from reader.format.parse import load_guide

    sentence = load_guide(READINGS / f"{GUIDE}.md").claim("only-outermost-is-root").statement
    assert " ".join(sentence.split()) in flat  # the claim's sentence, whole
    assert "measured: {'before':" in flat
    assert re.search(r"\d+\.\d s in all: \d+\.\d s in the claims' checks \(the times above\), \d+\.\d s starting", flat)


def test_the_timeline_says_what_is_held_and_sizes_in_bytes(pool: PoolManager) -> None:
    argv = ["timeline", "04-forward-prefetch", "follows-iteration-1-order", "--iteration", "2"]
    code, out = run(argv, pool, width=120)
    assert code == 0, out
    # In iteration 2's backward, blocks.1's prefetch of blocks.0 leaves the root and all three blocks unsharded.
    assert re.search(r"prefetch blocks\.1 -> blocks\.0\s+root\+2\+1\+0", out)
    code, out = run(["timeline", "15-communication-volume", "full-shard"], pool, width=120)
    assert code == 0
    assert re.search(r"all_gather 16,020 fp32 \(64,080 B\)", out)
    assert "outside backward" in out  # DDP's and FSDP's forward collectives are not put under backward


def test_recordings_are_labelled_and_chosen_and_a_missing_iteration_says_where_to_look(pool: PoolManager) -> None:
    claim = ["timeline", "17-fsdp2-prefetch", "order-of-this-step"]
    code, out = run([*claim, "--recording", "2"], pool, width=120)
    assert code == 0 and "recording 2: implicit, step 2, blocks [2, 1, 0]" in out
    assert "recording 1:" not in out
    code, out = run([*claim, "--iteration", "2"], pool, width=120)
    assert code == 2 and "--recording N draws one" in " ".join(out.split())


def test_compare_draws_two_modes_side_by_side(pool: PoolManager) -> None:
    argv = ["timeline", "06-backward-prefetch", "pre-prefetches-reverse-post-forward"]
    code, out = run([*argv, "--compare", "post-prefetches-after-free"], pool, width=170)
    assert code == 0
    titles = next(line for line in out.splitlines() if "post-prefetches-after-free" in line)
    assert "pre-prefetches-reverse-post-forward" in titles  # both titles on one line: side by side
    code, out = run([*argv, "--compare", "post-prefetches-after-free"], pool, width=80)
    assert code == 0 and out.index("pre-prefetches-reverse-post-forward") < out.index("post-prefetches-after-free")
    code, out = run([*argv, "--compare", "no_such_kwarg=1"], pool)
    assert code == 2 and "takes no kwarg `no_such_kwarg`" in out


def test_readme_starts_where_the_path_starts_and_names_the_path_command() -> None:
    readme = (READINGS.parent / "README.md").read_text(encoding="utf-8")
    start = tomllib.loads((READINGS / "path.toml").read_text(encoding="utf-8"))["start"]
    commands = re.findall(r"^fsdp-readings (\w+) ?(\S*)", readme, re.M)
    assert commands[0] == ("path", "")
    first_guides = [guide for command, guide in commands if command in ("show", "predict", "check")]
    assert first_guides[:3] == [start] * 3


def test_show_ends_with_the_command_that_runs_its_claims_from_anywhere() -> None:
    code, out = run(["show", "06-backward-prefetch"])
    assert code == 0 and "run them: fsdp-readings check 06-backward-prefetch" in out
    assert "pytest readings/" not in out.split("Claims of 06-backward-prefetch")[-1]


@pytest.mark.parametrize("guide", ["07-pre-backward", "11-final-callback-and-hybrid-shard"])
def test_claim_statements_show_their_code_without_backticks(guide: str) -> None:
    code, out = run(["show", guide])
    claims = out.split(f"Claims of {guide}")[-1]
    assert code == 0 and ("_pre_backward_hook" in claims or "_finalize_params" in claims)
    assert "`" not in claims
