"""FSDP2's prefetch rules as a model: no implicit forward prefetch, implicit backward prefetch of the previous
post-forward entry, explicit targets exactly as given (guide 17)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.models.fsdp2_prefetch import (
    all_gathers,
    all_gathers_by_formula,
    lookahead,
    prefetches,
    reshards_after_forward,
    step_sequence,
)

BLOCKS = ["blocks.0", "blocks.1", "blocks.2"]
ROOT = "root"


def test_the_default_forward_prefetches_nothing_and_backward_walks_the_record_back() -> None:
    seq = step_sequence(BLOCKS, ROOT)
    assert prefetches(seq, phase="forward") == []
    assert prefetches(seq, phase="backward") == ["root→blocks.2", "blocks.2→blocks.1", "blocks.1→blocks.0"]
    # written out by hand from the rules: forward unshards each group for itself, the root first and freed last
    assert seq[:13] == [
        "root_pre_forward root", "unshard root", "wait_unshard root",
        "unshard blocks.0", "wait_unshard blocks.0", "free blocks.0",
        "unshard blocks.1", "wait_unshard blocks.1", "free blocks.1",
        "unshard blocks.2", "wait_unshard blocks.2", "free blocks.2", "free root",
    ]  # fmt: skip
    assert seq[-4:] == ["final_callback root", "post_backward root", "free root", "reduce_grad root"]


def test_the_default_reshard_keeps_the_root_so_backward_does_not_gather_it() -> None:
    seq = step_sequence(BLOCKS, ROOT, reshard_after_forward=None)
    assert "free root" not in seq[: seq.index("pre_backward root")]
    assert seq[seq.index("pre_backward root") + 1] == "prefetch root→blocks.2"


def test_no_reshard_after_forward_leaves_nothing_to_prefetch() -> None:
    seq = step_sequence(BLOCKS, ROOT, reshard_after_forward=False)
    assert prefetches(seq) == []
    assert all_gathers(seq) == {"forward": 4, "backward": 0}


def test_forward_lookahead_two_is_issued_by_the_first_and_absorbed_by_the_second() -> None:
    targets = lookahead(BLOCKS, ROOT, 2, "forward")
    assert targets == {"blocks.0": ["blocks.1", "blocks.2"], "blocks.1": ["blocks.2"], "blocks.2": []}
    seq = step_sequence(BLOCKS, ROOT, forward_targets=targets)
    assert prefetches(seq, phase="forward") == ["blocks.0→blocks.1", "blocks.0→blocks.2"]
    assert "unshard blocks.1" not in seq and "unshard blocks.2" not in seq


def test_backward_lookahead_two_names_the_two_units_before() -> None:
    targets = lookahead(BLOCKS, ROOT, 2, "backward")
    assert targets == {"blocks.1": ["blocks.0"], "blocks.2": ["blocks.1", "blocks.0"], ROOT: ["blocks.2", "blocks.1"]}
    seq = step_sequence(BLOCKS, ROOT, backward_targets=targets)
    assert prefetches(seq, phase="backward") == ["root→blocks.2", "root→blocks.1", "blocks.2→blocks.0"]


def test_explicit_targets_replace_the_implicit_one() -> None:
    seq = step_sequence(BLOCKS, ROOT, backward_targets={ROOT: ["blocks.0"]})
    assert prefetches(seq, phase="backward") == ["root→blocks.0", "blocks.2→blocks.1"]
    assert "unshard blocks.2" in seq[seq.index("pre_backward blocks.2") :]


def test_an_empty_target_list_is_the_implicit_path() -> None:
    assert step_sequence(BLOCKS, ROOT, backward_targets={ROOT: []}) == step_sequence(BLOCKS, ROOT)


@pytest.mark.parametrize("setting", [True, None, False])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_prefetch_moves_all_gathers_and_never_adds_one(setting: bool | None, n: int) -> None:
    blocks = [f"b{i}" for i in range(n)]
    want = all_gathers_by_formula(n, setting)
    for k in (1, 2):
        seq = step_sequence(
            blocks, ROOT, reshard_after_forward=setting, forward_targets=lookahead(blocks, ROOT, k, "forward"),
            backward_targets=lookahead(blocks, ROOT, k, "backward"),
        )  # fmt: skip
        assert all_gathers(seq) == want
    assert all_gathers(step_sequence(blocks, ROOT, reshard_after_forward=setting)) == want


def test_reshard_setting_per_unit() -> None:
    assert [reshards_after_forward(u, ROOT, None) for u in (ROOT, "b")] == [False, True]
    with pytest.raises(ValueError, match="reshard_after_forward"):
        reshards_after_forward(ROOT, ROOT, 2)  # type: ignore[arg-type]


def test_units_run_once() -> None:
    with pytest.raises(ValueError, match="once"):
        step_sequence(["a", "a"], ROOT)


@given(st.integers(1, 6), st.integers(1, 4), st.sampled_from([True, None]))
def test_every_group_is_waited_for_before_its_pre_backward_returns(n: int, k: int, setting: bool | None) -> None:
    blocks = [f"b{i}" for i in range(n)]
    seq = step_sequence(blocks, ROOT, reshard_after_forward=setting, backward_targets=lookahead(blocks, ROOT, k,
                        "backward"))  # fmt: skip
    start = seq.index(f"pre_backward {ROOT}")
    gathered = [e.split("→")[-1].split()[-1] for e in seq[start:] if e.startswith(("unshard ", "prefetch "))]
    assert len(gathered) == len(set(gathered)) == all_gathers_by_formula(n, setting)["backward"]
    for unit in blocks:
        assert seq.index(f"pre_backward {unit}") < seq.index(f"post_backward {unit}")


def test_a_unit_fed_the_models_input_is_reduced_in_the_final_callback_after_the_root() -> None:
    seq = step_sequence(["0", "1"], ROOT, no_input_grad=["0"])
    assert seq[seq.index("final_callback root") :] == [
        "final_callback root", "post_backward root", "free root", "reduce_grad root",
        "post_backward 0", "free 0", "reduce_grad 0",
    ]  # fmt: skip
    assert prefetches(seq, phase="backward") == ["root→1", "1→0"]


# -- a setting per unit, and ints ----------------------------------------------------------------------------------
def test_each_unit_applies_its_own_setting() -> None:
    blocks = ["a", "b", "c"]
    settings = {ROOT: None, "a": True, "b": False, "c": 2}
    seq = step_sequence(blocks, ROOT, reshard_after_forward=settings, world_size=4)
    forward = seq[: seq.index(f"pre_backward {ROOT}")]
    # a freed, b kept, c resharded to 2 ranks; the root (None) kept.
    assert [e for e in forward if e.startswith(("free", "reshard"))] == ["free a", "reshard c"]
    # Backward all-gathers what forward did not keep: c (from its 2 ranks) by the root's prefetch, a by b's.
    assert prefetches(seq, phase="backward") == [f"{ROOT}→c", "b→a"]
    assert all_gathers(seq) == {"forward": 4, "backward": 2}


def test_an_int_reshards_unless_it_is_1_or_n() -> None:
    blocks = ["a", "b"]
    as_true = step_sequence(blocks, ROOT, reshard_after_forward=True, world_size=4)
    assert step_sequence(blocks, ROOT, reshard_after_forward=4, world_size=4) == as_true  # k = N is True
    as_false = step_sequence(blocks, ROOT, reshard_after_forward=False, world_size=4)
    assert step_sequence(blocks, ROOT, reshard_after_forward=1, world_size=4) == as_false  # k = 1 is False
    two = step_sequence(blocks, ROOT, reshard_after_forward=2, world_size=4)
    # True's sequence, its post-forward frees (the root's too: an explicit int applies to it) now reshards to
    # 2 ranks; backward all-gathers the same groups and frees them as True does.
    split = as_true.index(f"pre_backward {ROOT}")
    assert two == [e.replace("free ", "reshard ") for e in as_true[:split]] + as_true[split:]
    assert [e for e in two[:split] if e.startswith("reshard ")] == ["reshard a", "reshard b", f"reshard {ROOT}"]


def test_settings_the_model_cannot_take_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="needs the world size"):
        step_sequence(["a"], ROOT, reshard_after_forward=2)
    with pytest.raises(ValueError, match=r"names no setting for \['a'\]"):
        step_sequence(["a"], ROOT, reshard_after_forward={ROOT: True})
    with pytest.raises(ValueError, match=r"unknown units \['z'\]"):
        step_sequence(["a"], ROOT, reshard_after_forward={ROOT: True, "a": True, "z": False})
    with pytest.raises(ValueError, match="must be a factor of 4, not 3"):
        step_sequence(["a"], ROOT, reshard_after_forward=3, world_size=4)
    with pytest.raises(ValueError, match="a bool, an int or None, not 'yes'"):
        step_sequence(["a"], ROOT, reshard_after_forward="yes")  # type: ignore[arg-type]


def test_a_root_without_parameters_has_no_group_and_its_last_unit_queues_the_callback() -> None:
    seq = step_sequence(["a", "b"], ROOT, root_params=False)
    assert [e for e in seq if e.endswith(f" {ROOT}")] == [f"root_pre_forward {ROOT}"]
    assert "final_callback b" in seq and prefetches(seq, phase="backward") == ["b→a"]
    assert all_gathers(seq) == {"forward": 2, "backward": 2}  # a and b, freed after forward (True)
    with_root = step_sequence(["a", "b"], ROOT, root_params=False, callback_state=ROOT)
    assert "final_callback root" in with_root
    with pytest.raises(ValueError, match="has no group to prefetch"):
        step_sequence(["a", "b"], ROOT, root_params=False, backward_targets={ROOT: ["b"]})
    with pytest.raises(ValueError, match="unknown callback state 'z'"):
        step_sequence(["a"], ROOT, callback_state="z")


# -- several forwards before backward ------------------------------------------------------------------------------
def test_two_forwards_one_backward_worked_by_hand() -> None:
    # Root kept (the default), one unit "a". Post-forward order a, root, a, root: root's indices 1 and 3, a's 0, 2.
    seq = step_sequence(["a"], ROOT, reshard_after_forward=None, forwards=2)
    assert seq == [
        "root_pre_forward root", "unshard root", "wait_unshard root", "unshard a", "wait_unshard a", "free a",
        "root_pre_forward root", "unshard a", "wait_unshard a", "free a",
        # the second forward's uses first; the root pops 3 and prefetches entry 2, a
        "pre_backward root", "prefetch root→a",
        # a pops 2 (entry 1 is the kept root: nothing to issue); no gradient yet, so freed and not reduced
        "pre_backward a", "wait_unshard a", "post_backward a", "free a",
        # the root's second hook returns at once; a's second use gathers again, pops 0, and reduces
        "pre_backward a", "unshard a", "wait_unshard a", "post_backward a", "free a", "reduce_grad a",
        "final_callback root", "post_backward root", "free root", "reduce_grad root",
    ]  # fmt: skip


def test_one_backward_per_forward_each_reduces_and_the_last_one_clears_the_indices() -> None:
    seq = step_sequence(["a"], ROOT, reshard_after_forward=None, forwards=2, backwards=[[2], [1]])
    second = seq[seq.index("final_callback root") + 4 :]
    assert second == [
        # the first backward freed the root (post-backward) and cleared every index: nothing to prefetch
        "pre_backward root", "unshard root", "wait_unshard root",
        "pre_backward a", "unshard a", "wait_unshard a", "post_backward a", "free a", "reduce_grad a",
        "final_callback root", "post_backward root", "free root", "reduce_grad root",
    ]  # fmt: skip
    kept = step_sequence(["a"], ROOT, reshard_after_forward=None, forwards=2, backwards=[[2], [1]],
                         last_backward=[False, True])  # fmt: skip
    assert prefetches(kept[kept.index("final_callback root") :]) == ["root→a"]


def test_a_unit_whose_inputs_need_no_gradient_is_reduced_once_from_the_final_callback() -> None:
    seq = step_sequence(["a", "b"], ROOT, reshard_after_forward=None, no_input_grad=["a"], forwards=2)
    assert seq.count("pre_backward a") == 1  # its second hook finds it in pre-backward
    assert seq.count("reduce_grad a") == 1 and seq.count("post_backward a") == 1
    assert seq[-7:] == [
        "final_callback root", "post_backward root", "free root", "reduce_grad root",
        "post_backward a", "free a", "reduce_grad a",
    ]  # fmt: skip


def test_no_reshard_after_forward_still_gathers_in_backward_after_two_forwards() -> None:
    seq = step_sequence(BLOCKS, ROOT, reshard_after_forward=False, forwards=2)
    assert all_gathers(seq) == {"forward": 4, "backward": 3}
    assert prefetches(seq, phase="backward") == ["blocks.2→blocks.1", "blocks.1→blocks.0"]


@given(
    n=st.integers(1, 4),
    forwards=st.integers(1, 3),
    setting=st.sampled_from([True, None, False]),
    split=st.booleans(),
)
def test_every_unit_is_reduced_once_per_backward(n: int, forwards: int, setting: bool | None, split: bool) -> None:
    blocks = [f"b{i}" for i in range(n)]
    backwards = [[f] for f in range(forwards, 0, -1)] if split else None
    seq = step_sequence(blocks, ROOT, reshard_after_forward=setting, forwards=forwards, backwards=backwards)
    calls = forwards if split else 1
    for unit in (ROOT, *blocks):
        assert seq.count(f"reduce_grad {unit}") == calls
    resharded = {True: n + 1, None: n, False: 0}[setting]
    assert all_gathers(seq)["forward"] == n + 1 + (forwards - 1) * resharded
    assert seq.count("root_pre_forward root") == forwards and seq.count("final_callback root") == calls


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"forwards": 0}, "positive int"),
        ({"forwards": 2, "backwards": [[1]]}, "cover forwards 1..2 once each"),
        ({"forwards": 2, "backwards": [[1, 2], [2]]}, "retain_graph"),
        ({"forwards": 2, "backwards": [[1], []]}, "every backward at least one"),
        ({"forwards": 2, "backwards": [[2], [1]], "last_backward": [True]}, "names 1 backwards, backwards 2"),
    ],
)
def test_a_backward_plan_the_model_cannot_take_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        step_sequence(BLOCKS, ROOT, **kwargs)


def test_a_unit_whose_output_the_root_returns_runs_its_pre_backward_before_the_roots() -> None:
    from checks.models.fsdp2_prefetch import prefetches, step_sequence

    seq = step_sequence(["0", "1"], "root", output_units=["1"])
    backward = seq[seq.index("pre_backward 1") :]
    assert backward[:5] == ["pre_backward 1", "unshard 1", "wait_unshard 1", "prefetch 1→0", "pre_backward root"]
    assert backward.index("post_backward 1") > backward.index("pre_backward root")
    # the root's candidate, unit 1, is unsharded already: the only backward prefetch is 1's
    assert prefetches(seq, phase="backward") == ["1→0"]
    assert prefetches(step_sequence(["0", "1"], "root"), phase="backward") == ["root→1", "1→0"]
