"""The FSDP2 step-map model (guide 22): rows by rule, counted and compared with what each rule implies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.fsdp2_step_map import ROOT, row, step_rows

INNER = st.lists(st.sampled_from([f"blocks.{n}" for n in range(6)]), min_size=1, max_size=6, unique=True)


@given(INNER, st.integers(1, 3), st.booleans())
def test_counts_follow_from_the_units(inner: list[str], outputs: int, ends: bool) -> None:
    rows = step_rows(inner, root_outputs=outputs, ends_through_iteration=ends)
    n = len(inner)
    # Forward: a pre- and a post-forward per unit. Backward: a pre-backward per hooked output, a post-backward
    # Function per inner unit, one final callback.
    assert len(rows) == 2 * (n + 1) + outputs + n + n + 1
    assert sum(r.count("(all-gather)") for r in rows) == (n + 1) + n  # forward, then each block prefetched once
    assert sum(r.count("(reduce-scatter)") for r in rows) == n + 1
    assert sum("queue final callback" in r for r in rows) == 1
    assert rows[-1].endswith(f"finalize_backward ×{n + 1}")
    assert ("_end_backward_iteration" in rows[-1]) is ends


@given(INNER)
def test_each_pre_backward_prefetches_the_unit_before_it(inner: list[str]) -> None:
    rows = step_rows(inner)
    pre_backward = [r for r in rows if " pre-backward: " in r and "returns at once" not in r]
    issuers = [r.split()[1] for r in pre_backward]
    assert issuers == [ROOT, *reversed(inner)]
    targets = [r.split("_prefetch_unshard ")[1].split(",")[0] if "_prefetch_unshard" in r else None
               for r in pre_backward]  # fmt: skip
    assert targets == [*reversed(inner), None]


def test_the_first_step_adds_lazy_init_to_the_roots_pre_forward_only() -> None:
    first, second = step_rows(["a", "b"], first=True), step_rows(["a", "b"])
    assert first[1:] == second[1:]
    assert first[0] == row("forward", ROOT, "pre-forward", [
        "_root_pre_forward", "_lazy_init", "_init_fqns", "_init_shared_state", "_validate_no_duplicate_params",
        "lazy_init ×3", "pre_forward", "unshard (all-gather)", "wait_for_unshard"])  # fmt: skip


def test_an_empty_row_says_it_returned_at_once() -> None:
    assert row("backward", ROOT, "pre-backward", []) == "backward  root      pre-backward: (returns at once)"


@pytest.mark.parametrize(("inner", "outputs"), [([], 1), (["root"], 1), (["a", "a"], 1), (["a"], 0)])
def test_impossible_structures_are_refused(inner: list[str], outputs: int) -> None:
    with pytest.raises(ValueError):
        step_rows(inner, root_outputs=outputs)


@given(INNER)
def test_parameters_kept_after_forward_leave_backward_nothing_to_gather(inner: list[str]) -> None:
    default, kept = step_rows(inner), step_rows(inner, keep_after_forward=True)
    assert len(kept) == len(default)
    assert sum(r.count("(all-gather)") for r in kept) == len(inner) + 1  # the forward's only
    changed = [k for k, d in zip(kept, default, strict=True) if k != d]
    assert len(changed) == 2 * len(inner) + 1  # each block's post-forward and pre-backward, the root's pre-backward
    assert not any("reshard" in r for r in kept if " post-forward: " in r)


@given(INNER)
def test_parameters_kept_after_backward_leave_the_next_forward_nothing_to_gather(inner: list[str]) -> None:
    default, kept = step_rows(inner), step_rows(inner, keep_after_backward=True)
    assert sum(r.count("(all-gather)") for r in kept) == len(inner)  # backward's prefetches only
    assert not any("reshard" in r for r in kept if "post-backward" in r or "final callback" in r)
    changed = [k for k, d in zip(kept, default, strict=True) if k != d]
    assert len(changed) == 2 * (len(inner) + 1)  # every pre-forward, every post-backward and the final callback
    # The first step starts sharded, whatever the setting: its forward all-gathers every unit.
    assert step_rows(inner, first=True, keep_after_backward=True)[0] == step_rows(inner, first=True)[0]
