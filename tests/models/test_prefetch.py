"""FSDP1's prefetch rules as models: forward by the recorded order, backward by the reverse post-forward order."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.prefetch import backward_sequence, forward_prefetches, forward_sequence

UNITS = ["root", "blocks.0", "blocks.1", "blocks.2"]


def test_a_static_order_prefetches_each_next_unit() -> None:
    assert forward_prefetches(UNITS, UNITS) == [f"{a} -> {b}" for a, b in pairwise(UNITS)]


def test_a_reversed_forward_still_follows_the_recorded_order() -> None:
    # Guide 04's stale-order scenario: root runs, prefetches blocks.0; blocks.2 then blocks.1 target units already
    # done or already prefetched; blocks.0's next (blocks.1) already ran.
    used = ["root", "blocks.2", "blocks.1", "blocks.0"]
    assert forward_prefetches(UNITS, used) == ["root -> blocks.0"]


@given(st.permutations(UNITS))
def test_forward_prefetch_targets_are_distinct_and_never_done(used: list[str]) -> None:
    pairs = [p.split(" -> ") for p in forward_prefetches(UNITS, used)]
    targets = [t for _, t in pairs]
    assert len(targets) == len(set(targets))
    for issuer, target in pairs:
        assert UNITS.index(target) == UNITS.index(issuer) + 1
        assert used.index(target) > used.index(issuer)


POST_FORWARD = ["0", "1", "root"]


def test_backward_pre_prefetches_from_pre_backward_hooks() -> None:
    assert backward_sequence(POST_FORWARD, "BACKWARD_PRE") == [
        "pre_backward root", "prefetch root→1", "pre_backward 1", "prefetch 1→0", "post_backward 1",
        "pre_backward 0", "post_backward 0", "post_backward root",
    ]  # fmt: skip


def test_backward_post_prefetches_from_post_backward_hooks_and_the_root_prefetches_nothing() -> None:
    assert backward_sequence(POST_FORWARD, "BACKWARD_POST") == [
        "pre_backward root", "pre_backward 1", "post_backward 1", "prefetch 1→0", "pre_backward 0",
        "post_backward 0", "post_backward root",
    ]  # fmt: skip


@given(st.integers(1, 8), st.sampled_from(["BACKWARD_PRE", "BACKWARD_POST", None]))
def test_every_unit_runs_each_hook_once_and_is_prefetched_at_most_once(blocks: int, policy: str | None) -> None:
    order = [*(f"blocks.{i}" for i in range(blocks)), "root"]
    seq = backward_sequence(order, policy)
    for hook in ("pre_backward", "post_backward"):
        assert sorted(e.split()[1] for e in seq if e.startswith(hook)) == sorted(order)
    targets = [e.split("→")[1] for e in seq if e.startswith("prefetch")]
    assert len(targets) == len(set(targets)) and "root" not in targets
    # BACKWARD_PRE prefetches every block (the root's pre-backward prefetches the last one). BACKWARD_POST
    # prefetches every block but the last: the root's post-backward comes at the very end, when the last block
    # has long been unsharded by its own pre-backward.
    assert len(targets) == {"BACKWARD_PRE": blocks, "BACKWARD_POST": blocks - 1, None: 0}[policy]


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backward prefetch policy"):
        backward_sequence(POST_FORWARD, "BACKWARD_SOMETIMES")


def test_forward_sequence_by_strategy() -> None:
    assert forward_sequence("root", ["0"], "FULL_SHARD") == ["root_pre_forward root", "unshard root", "unshard 0",
                                                             "free 0", "reshard root"]  # fmt: skip
    assert "reshard 0" in forward_sequence("root", ["0"], "SHARD_GRAD_OP")
