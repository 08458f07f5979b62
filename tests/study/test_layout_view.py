"""``fsdp-readings layout``: the flat parameter the ranks read, drawn by the renderer the guide is checked with."""

from __future__ import annotations

from checks.breakit.patches import returning
from checks.ranks.manager import PoolManager
from reader.format.parse import load_guide
from tests.study.test_commands import ANSI, READINGS, run

GUIDE = "12-flat-parameter"
CLAIM = "layout-at-4"


def test_layout_draws_what_rank_read(pool: PoolManager) -> None:
    code, out = run(["layout", GUIDE, CLAIM, "--rank", "3"], pool, width=100)
    assert code == 0, out
    assert not ANSI.search(out) and max(len(line) for line in out.splitlines()) <= 100
    # The guide's diagram is the claim's expected value: the view shows the same picture, from the run. Its
    # columns (bar, ruler, one row per segment) are the same lines; its title and legend, words that the
    # diagram breaks at its width (78 cells in the guide, 100 here), the same words in the same order.
    diagram = load_guide(READINGS / f"{GUIDE}.md").expect_blocks()[CLAIM].items
    shown = [line.rstrip() for line in out.splitlines()]
    bar = next(i for i, line in enumerate(diagram) if set(line) <= set("ABCDE.~"))
    columns = [
        diagram[bar],
        diagram[bar + 1],
        *diagram[next(i for i, r in enumerate(diagram) if r.startswith("id ")) :],
    ]
    assert all(line in shown for line in columns), out
    words, seen = " ".join(diagram).split(), " ".join(shown).split()
    assert any(seen[i : i + len(words)] == words for i in range(len(seen))), out
    assert f"{GUIDE} · {CLAIM} · as rank 3 read it" in out


def test_layout_shows_a_torch_that_lays_out_differently(pool: PoolManager) -> None:
    # 32-byte alignment (8 fp32 elements): the ranks read, and the view draws, another layout; the claim fails.
    wider = returning("torch.distributed.fsdp._flat_param:_get_aligned_numel", 8)
    code, out = run(["layout", GUIDE, CLAIM], pool, patches=(wider,), width=100)
    assert code == 1, out
    assert "the claim failed" in out and "diagram-differs" not in out.split("the claim failed")[0]
    assert "the unit: 64 elements = 49 in 5 parameters + 12 alignment + 3 world-size padding" in out


def test_a_claim_without_a_layout_is_refused_at_once_with_the_claims_that_have_one() -> None:
    code, out = run(["layout", GUIDE, "offload-params-needs-accelerator"])  # no pool: refused before a run
    flat = " ".join(out.split())
    assert code == 2 and "offload-params-needs-accelerator has no layout to draw" in flat and "layout-at-4" in flat


def test_unknown_claims_and_ranks_are_broken_input(pool: PoolManager) -> None:
    assert run(["layout", GUIDE, "no-such-claim"])[0] == 2
    code, out = run(["layout", GUIDE, CLAIM, "--rank", "7"], pool)
    assert code == 2 and "no rank 7" in out


def test_check_leaves_slow_claims_to_slow(pool: PoolManager) -> None:
    code, out = run(["check", GUIDE, "layout-at-4", "every-property-200-at-2", "--timeout", "600"][:3], pool)
    assert code == 0 and "1 passed" in out
    code, out = run(["check", GUIDE], pool, width=200)
    assert "not running 2 slow claim(s) (every-property-200-at-2, every-property-200-at-4): --slow runs them" in out
