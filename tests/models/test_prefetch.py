"""FSDP1's prefetch rules as models: forward by the recorded order, backward by the reverse post-forward order."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.prefetch import (
    backward_sequence,
    backward_sequence_of_uses,
    forward_prefetches,
    forward_sequence,
    post_forward_record,
)

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


# -- the post-forward record (guide 06) ---------------------------------------------------------------------------
FIRST_REUSED = ["blocks.0", "blocks.1", "blocks.0", "blocks.2", "root"]
OTHER_REUSED = ["blocks.0", "blocks.1", "blocks.2", "blocks.1", "root"]


def test_every_use_is_appended_and_the_unit_at_index_0_moves_to_its_second_use() -> None:
    record, index = post_forward_record(FIRST_REUSED)
    assert record == FIRST_REUSED
    assert index == {"blocks.0": 2, "blocks.1": 1, "blocks.2": 3, "root": 4}
    assert post_forward_record(FIRST_REUSED, zero_is_falsy=False)[1]["blocks.0"] == 0


def test_a_reused_unit_at_a_later_index_keeps_its_first_use() -> None:
    assert post_forward_record(OTHER_REUSED)[1] == {"blocks.0": 0, "blocks.1": 1, "blocks.2": 2, "root": 4}


def test_forwards_without_a_reset_grow_the_record_by_one_entry_per_unit() -> None:
    one = ["blocks.0", "blocks.1", "blocks.2", "root"]
    for k in range(1, 6):
        record, index = post_forward_record(one * k)
        assert len(record) == 4 * k
        assert index == {"blocks.0": 0 if k == 1 else 4, "blocks.1": 1, "blocks.2": 2, "root": 3}


def test_the_first_unit_reused_prefetches_from_its_second_use() -> None:
    assert backward_sequence_of_uses(FIRST_REUSED, "BACKWARD_PRE") == [
        "pre_backward root", "prefetch root→blocks.2", "pre_backward blocks.2", "prefetch blocks.2→blocks.0",
        "post_backward blocks.2", "pre_backward blocks.0", "prefetch blocks.0→blocks.1", "pre_backward blocks.1",
        "post_backward blocks.1", "post_backward blocks.0", "post_backward root",
    ]  # fmt: skip
    # With an `is not None` test blocks.0 keeps index 0, has no candidate, and blocks.1 is never prefetched.
    fixed = backward_sequence_of_uses(FIRST_REUSED, "BACKWARD_PRE", zero_is_falsy=False)
    assert [e for e in fixed if e.startswith("prefetch")] == ["prefetch root→blocks.2", "prefetch blocks.2→blocks.0"]


def test_another_unit_reused_prefetches_from_its_first_use() -> None:
    assert backward_sequence_of_uses(OTHER_REUSED, "BACKWARD_PRE") == [
        "pre_backward root", "prefetch root→blocks.1", "pre_backward blocks.1", "prefetch blocks.1→blocks.0",
        "pre_backward blocks.2", "post_backward blocks.2", "post_backward blocks.1", "pre_backward blocks.0",
        "post_backward blocks.0", "post_backward root",
    ]  # fmt: skip
    assert backward_sequence_of_uses(OTHER_REUSED, "BACKWARD_PRE", zero_is_falsy=False) == (
        backward_sequence_of_uses(OTHER_REUSED, "BACKWARD_PRE")
    )


def test_the_root_must_be_used_once_and_last() -> None:
    with pytest.raises(ValueError, match="used once, last"):
        backward_sequence_of_uses(["root", "0", "root"], None)
    with pytest.raises(ValueError, match="unknown backward prefetch policy"):
        backward_sequence_of_uses(["0", "root"], "BACKWARD_SOMETIMES")


POLICY = st.sampled_from(["BACKWARD_PRE", "BACKWARD_POST", None])
BLOCKS = [f"blocks.{i}" for i in range(5)]


@given(st.permutations(BLOCKS).flatmap(lambda p: st.integers(0, len(p)).map(lambda n: p[:n])), POLICY)
def test_distinct_uses_give_the_plain_backward_sequence(blocks: list[str], policy: str | None) -> None:
    order = [*blocks, "root"]
    assert backward_sequence_of_uses(order, policy) == backward_sequence(order, policy)


USES = st.lists(st.sampled_from(BLOCKS[:3]), min_size=0, max_size=8).map(lambda u: [*u, "root"])


@given(USES)
def test_the_record_keeps_every_use_and_first_indices_except_at_zero(uses: list[str]) -> None:
    record, index = post_forward_record(uses)
    assert record == uses
    positions = {u: [i for i, v in enumerate(uses) if v == u] for u in set(uses)}
    for unit, at in positions.items():
        if unit == uses[0] and len(at) > 1:
            assert index[unit] == at[1]  # index 0 is falsy: the second use records it again
        else:
            assert index[unit] == at[0]
    assert post_forward_record(uses, zero_is_falsy=False)[1] == {u: at[0] for u, at in positions.items()}


@given(USES, POLICY, st.booleans())
def test_any_forward_runs_each_hook_once_and_prefetches_ahead_of_need(
    uses: list[str], policy: str | None, zero_is_falsy: bool
) -> None:
    seq = backward_sequence_of_uses(uses, policy, zero_is_falsy=zero_is_falsy)
    units = sorted(set(uses))
    for hook in ("pre_backward", "post_backward"):
        assert sorted(e.split()[1] for e in seq if e.startswith(hook)) == units
    for unit in units:
        assert seq.index(f"pre_backward {unit}") < seq.index(f"post_backward {unit}")
    pairs = [e.split()[1].split("→") for e in seq if e.startswith("prefetch")]
    targets = [t for _, t in pairs]
    assert len(targets) == len(set(targets)) and "root" not in targets
    for (issuer, target), at in zip(pairs, [i for i, e in enumerate(seq) if e.startswith("prefetch")], strict=True):
        assert at < seq.index(f"pre_backward {target}")  # a prefetch comes before the target needs it
        hook = {"BACKWARD_PRE": "pre_backward", "BACKWARD_POST": "post_backward"}[policy]
        assert seq[at - 1] == f"{hook} {issuer}"  # issued by the issuer's own hook, right after it starts
    if policy is None:
        assert not pairs


# -- a root without parameters (no handle) ---------------------------------------------------------------------------
def test_a_root_without_parameters_has_no_hook_and_the_last_unit_is_gathered_by_its_own_pre_backward() -> None:
    # Worked by hand: no root entry in the post-forward order, so the last unit's pre-backward comes first.
    assert backward_sequence(["0", "1", "2"], "BACKWARD_PRE", root_params=False) == [
        "pre_backward 2", "prefetch 2→1", "post_backward 2",
        "pre_backward 1", "prefetch 1→0", "post_backward 1",
        "pre_backward 0", "post_backward 0",
    ]  # fmt: skip
    assert backward_sequence(["0", "1", "2"], "BACKWARD_POST", root_params=False) == [
        "pre_backward 2", "post_backward 2", "prefetch 2→1",
        "pre_backward 1", "post_backward 1", "prefetch 1→0",
        "pre_backward 0", "post_backward 0",
    ]  # fmt: skip
    assert forward_sequence("root", ["0", "1"], "FULL_SHARD", root_params=False) == [
        "root_pre_forward root", "unshard 0", "free 0", "unshard 1", "free 1",
    ]  # fmt: skip


def test_uses_without_a_root_entry_follow_the_same_record() -> None:
    uses = ["0", "1", "0"]
    seq = backward_sequence_of_uses(uses, "BACKWARD_PRE", root_params=False)
    assert seq[0] == "pre_backward 0" and "pre_backward root" not in seq and "post_backward root" not in seq
    assert backward_sequence_of_uses(["0", "1"], None, root_params=False) == backward_sequence(
        ["0", "1"], None, root_params=False
    )


def test_inputs_the_simple_models_cannot_take_are_refused() -> None:
    with pytest.raises(ValueError, match="see backward_sequence_of_uses"):
        backward_sequence(["0", "1", "0", "root"], "BACKWARD_PRE")
    with pytest.raises(ValueError, match="not 'HYBRID_SHARD'"):
        forward_sequence("root", ["0"], "HYBRID_SHARD")


NESTED = ("a.0", "a.1", "a", "b.0", "b", "root")  # a holds a.0 and a.1, b holds b.0, in post-forward order
PARENTS = {"a.0": "a", "a.1": "a", "b.0": "b"}


def test_a_parents_post_backward_waits_for_the_units_nested_in_it() -> None:
    seq = backward_sequence(NESTED, None, parents=PARENTS)
    assert seq == [
        "pre_backward root", "pre_backward b", "pre_backward b.0", "post_backward b.0", "post_backward b",
        "pre_backward a", "pre_backward a.1", "post_backward a.1", "pre_backward a.0", "post_backward a.0",
        "post_backward a", "post_backward root",
    ]  # fmt: skip
    # without the nesting, each unit's post-backward would follow its own pre-backward
    assert backward_sequence(NESTED, None)[:3] == ["pre_backward root", "pre_backward b", "post_backward b"]


def test_a_parent_finishing_late_issues_its_backward_post_prefetch_late() -> None:
    seq = backward_sequence(NESTED, "BACKWARD_POST", parents=PARENTS)
    # b.0's post-backward prefetches a (before it in post-forward order); b's candidate, b.0, is done: none
    assert seq[3:6] == ["post_backward b.0", "prefetch b.0→a", "post_backward b"]


def test_a_unit_whose_output_the_root_returns_runs_its_pre_backward_first() -> None:
    seq = backward_sequence(("0", "1", "root"), "BACKWARD_PRE", output_units=["1"])
    assert seq == [
        "pre_backward 1", "prefetch 1→0", "pre_backward root", "post_backward 1", "pre_backward 0",
        "post_backward 0", "post_backward root",
    ]  # fmt: skip
