"""``predict``, ``exercise`` and ``check`` as a learner types at them, in a real pseudo-terminal (pexpect): a
refused answer is asked again, keys typed while a claim runs are thrown away, and Ctrl-C prints one line, keeps
what finished, exits 130 and leaves no rank process behind.

The tests hold however pytest was started: a shell starts a background job with SIGINT ignored, and an ignored
signal stays ignored across exec, so the command is started with SIGINT back at its default (as a terminal's
foreground job has it). A test that fails leaves nothing running: its command and every process carrying its tag
are killed at teardown."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pexpect
import psutil
import pytest

from tests.study.test_commands import GUIDE, READINGS, REPO

PROMPT = "your answer: "


@pytest.fixture
def terminal_env(data_dir: Path) -> dict[str, str]:
    """The command's environment, with a tag its rank processes inherit, so that leftovers can be found."""
    return {**os.environ, "FSDP_READINGS_TERMINAL_TEST": uuid.uuid4().hex, "COLUMNS": "100", "NO_COLOR": "1"}


def _as_a_foreground_job() -> None:
    """In the child before exec: SIGINT at its default, whatever the test process inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


Spawn = Callable[[list[str]], pexpect.spawn]


@pytest.fixture
def spawn(terminal_env: dict[str, str]) -> Iterator[Spawn]:
    """``spawn(argv)``: ``fsdp-readings argv`` in a pseudo-terminal, killed at teardown with every process of
    its tag if the test left it running."""
    children: list[pexpect.spawn] = []

    def start(argv: list[str]) -> pexpect.spawn:
        command = [sys.executable, "-m", "reader", "--readings", str(READINGS), *argv]
        child = pexpect.spawn(
            command[0],
            command[1:],
            cwd=REPO,
            env=terminal_env,
            encoding="utf-8",
            dimensions=(50, 100),
            timeout=240,
            preexec_fn=_as_a_foreground_job,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.isalive():
            child.terminate(force=True)
    for proc in tagged(terminal_env["FSDP_READINGS_TERMINAL_TEST"]):
        proc.kill()


def ranks_of(tag: str) -> list[psutil.Process]:
    """The rank processes started for this test: children of a zygote that carry its tag."""
    found = []
    for proc in psutil.process_iter():
        try:
            parent = proc.parent()
            if (
                proc.environ().get("FSDP_READINGS_TERMINAL_TEST") == tag
                and parent is not None
                and "checks.ranks.zygote" in " ".join(parent.cmdline())
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_for_ranks(tag: str, count: int) -> None:
    """Until ``count`` ranks of this test's command have been started (a claim is starting or running)."""
    deadline = time.monotonic() + 120
    while len(ranks_of(tag)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} ranks started"
        time.sleep(0.05)


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes started for this test: they carry its tag."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("FSDP_READINGS_TERMINAL_TEST") == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def leftovers(tag: str) -> list[psutil.Process]:
    """`tagged` processes still alive after a grace period for their exit."""
    deadline = time.monotonic() + 15
    while (found := tagged(tag)) and time.monotonic() <= deadline:
        time.sleep(0.5)
    return found


def ended(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def test_predict_asks_again_discards_typeahead_and_stops_on_ctrl_c(spawn, terminal_env, data_dir: Path) -> None:
    child = spawn(["predict", GUIDE])
    child.expect_exact(PROMPT)
    child.sendline("z")  # not one of the choices
    child.expect_exact("one of the letters a, b, c, or a choice's text; try again")
    child.expect_exact(PROMPT)
    child.sendline("b")
    child.sendline("c")  # typed while the claim runs: must not become the next answer
    child.expect_exact("2/3 · mismatch-surfaces")
    child.expect_exact(PROMPT)
    with pytest.raises(pexpect.TIMEOUT):  # "c" was discarded: nothing is answered until a key is typed now
        child.expect_exact("you ", timeout=3)
    child.sendline("a")
    child.expect_exact("3/3 · root-all-gather-at-4")
    child.expect_exact(PROMPT)
    child.sendintr()  # Ctrl-C at the prompt
    child.expect_exact("interrupted: 2 of 3 questions answered; their scores are kept")
    transcript = child.before or ""
    assert ended(child) == 130
    assert "Traceback" not in transcript and "KeyboardInterrupt" not in transcript
    saved = json.loads((data_dir / "progress.json").read_text())["predict"][GUIDE]
    assert {q: a["answer"] for q, a in saved.items()} == {"is-root-at-construction": "b", "mismatch-surfaces": "a"}
    assert saved["is-root-at-construction"]["honest"] is True and saved["mismatch-surfaces"]["honest"] is False
    assert leftovers(terminal_env["FSDP_READINGS_TERMINAL_TEST"]) == []


def test_an_exercise_is_not_used_up_by_an_answer_that_is_not_a_choice(spawn, data_dir: Path) -> None:
    child = spawn(["exercise", "04-forward-prefetch", "two-ahead"])
    child.expect_exact(PROMPT)
    child.sendline("z")
    child.expect_exact("try again")
    child.expect_exact(PROMPT)
    child.sendintr()
    child.expect_exact("interrupted: 0 of 1 exercises done; their results are kept")
    assert ended(child) == 130
    assert not (data_dir / "progress.json").exists() or "exercises" not in json.loads(
        (data_dir / "progress.json").read_text()
    )


def test_ctrl_c_while_check_runs_a_claim_leaves_no_rank_behind(spawn, terminal_env, data_dir: Path) -> None:
    child = spawn(["check", GUIDE, "only-outermost-is-root", "padded-size-after-first-forward-at-4"])
    child.expect("padded-size-after-first-forward-at-4")  # the progress line: the 4-rank claim is starting
    wait_for_ranks(terminal_env["FSDP_READINGS_TERMINAL_TEST"], 2 + 4)  # its pool is starting or running
    child.sendintr()
    child.expect_exact("interrupted: 1 of 2 claims ran; their results are kept")
    assert ended(child) == 130
    saved = json.loads((data_dir / "progress.json").read_text())["claims"][GUIDE]
    assert list(saved) == ["only-outermost-is-root"]
    assert leftovers(terminal_env["FSDP_READINGS_TERMINAL_TEST"]) == []
