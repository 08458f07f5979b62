"""The autograd-order model: without forward prefetch it gives the backward the prefetch rule model gives (guide
06); with it, autograd reaches blocks.1 before blocks.2's post-backward hook, and the root and all three blocks are
unsharded at once (guide 04)."""

from __future__ import annotations

from checks.models.autograd_order import COMPUTE, VIEWS, Created, backward_hooks, backward_with_prefetch
from checks.models.autograd_order import mini_gpt_forward as forward
from checks.models.prefetch import backward_sequence

BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
POST_FORWARD = (*BLOCKS, "root")


def test_without_forward_prefetch_the_backward_is_the_prefetch_models() -> None:
    made = forward("root", BLOCKS, forward_prefetch=False)
    sequence, _ = backward_with_prefetch(made, POST_FORWARD, kept=["root"])
    assert sequence == backward_sequence(POST_FORWARD, "BACKWARD_PRE")


def test_forward_prefetch_creates_the_next_units_views_before_the_current_compute() -> None:
    made = forward("root", BLOCKS, forward_prefetch=True)
    assert [(n.kind, n.unit) for n in made] == [
        (VIEWS, "root"), (VIEWS, "blocks.0"), (COMPUTE, "root"), (VIEWS, "blocks.1"), (COMPUTE, "blocks.0"),
        (VIEWS, "blocks.2"), (COMPUTE, "blocks.1"), (COMPUTE, "blocks.2"), (COMPUTE, "root"),
    ]  # fmt: skip


def test_with_forward_prefetch_each_pre_backward_comes_before_the_previous_post_backward() -> None:
    hooks = backward_hooks(forward("root", BLOCKS, forward_prefetch=True))
    assert hooks == [
        "pre_backward root", "pre_backward blocks.2", "pre_backward blocks.1", "post_backward blocks.2",
        "pre_backward blocks.0", "post_backward blocks.1", "post_backward blocks.0", "post_backward root",
    ]  # fmt: skip


def test_with_forward_prefetch_four_units_are_unsharded_at_blocks_1() -> None:
    _, moments = backward_with_prefetch(forward("root", BLOCKS, True), POST_FORWARD, kept=["root"])
    assert moments == [
        ("compute root", 2), ("compute blocks.2", 3), ("compute blocks.1", 4), ("post-backward blocks.2", 3),
        ("compute blocks.0", 3), ("post-backward blocks.1", 2), ("post-backward blocks.0", 1),
        ("post-backward root", 0),
    ]  # fmt: skip
    _, without = backward_with_prefetch(forward("root", BLOCKS, False), POST_FORWARD, kept=["root"])
    assert max(count for _, count in without) == 3


def test_the_ready_node_created_last_runs_first() -> None:
    # Two units whose views were both created before either computed: the later unit's views still wait for its
    # compute, and the earlier unit's compute runs before the later unit's views, created before it.
    made = [Created(VIEWS, "a"), Created(VIEWS, "b"), Created(COMPUTE, "a"), Created(COMPUTE, "b")]
    assert backward_hooks(made) == ["pre_backward b", "pre_backward a", "post_backward b", "post_backward a"]


def test_a_single_unit() -> None:
    assert backward_hooks([Created(VIEWS, "u"), Created(COMPUTE, "u")]) == ["pre_backward u", "post_backward u"]
