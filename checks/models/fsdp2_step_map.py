"""FSDP2's step map as rules (guide 22): which hooks run in one training step of ``fully_shard`` units, and which
of FSDP's functions each calls that does something. Torch-free.

The units: a root that holds parameters of its own (mini_gpt's embeddings and head) and whose forward inputs need
no gradient (token ids), and inner units run once each, in ``forward`` order, each taking a tensor that needs a
gradient. One parameter group per unit, ``reshard_after_forward`` at its default (True, but the root keeps its
parameters), no explicit prefetch targets, one backward that is the step's last.

Forward. The root's pre-forward claims the iteration (``_root_pre_forward``), chooses the root and initialises
every state on the first step only (``_lazy_init``: the FQNs, the shared state, the duplicate check, then each
group's ``lazy_init``), then unshards and waits for its group. Each inner pre-forward unshards, waits, and wraps
its inputs in the post-backward Function (``_register_post_backward_hook``); the root's has no input to wrap.
Each inner post-forward reshards, records its place in the post-forward order and hooks its output; the root's
post-forward comes last, keeps its parameters and hooks each of its outputs (``root_outputs``).

``reshard_after_forward=False`` on every unit (``keep_after_forward``): no post-forward reshards, and in backward
no group is sharded, so each prefetch finds its target unsharded and issues nothing, and no pre-backward has an
all-gather to wait for.

``reshard_after_backward=False`` on every unit (``keep_after_backward``), from a step whose backward already
kept them: no post-backward reshards, and the forward finds every group unsharded, so no pre-forward unshards or
waits; the blocks' post-forwards still reshard (that is ``reshard_after_forward``), and backward all-gathers them.

Backward. The root's output hooks fire first: the first queues the final callback, runs the group's
``pre_backward`` (nothing to unshard: it kept them) and prefetches the last inner unit; each further root output's
hook returns at once. Then, for each inner unit in reverse: its pre-backward waits for the prefetched all-gather
and prefetches the unit before it in the post-forward order (none for the first); its post-backward Function
reshards and reduce-scatters. The final callback runs the root's post-backward (no Function covered its inputs),
then finalises every group: directly before torch 2.15, through ``wait_for_gradient_reduction`` and
``_end_backward_iteration`` from 2.15 (``ends_through_iteration``).
"""

from __future__ import annotations

from collections.abc import Sequence

ROOT = "root"
FIRST_STEP_INIT = ("_lazy_init", "_init_fqns", "_init_shared_state", "_validate_no_duplicate_params")


def row(phase: str, unit: str, hook: str, did: Sequence[str]) -> str:
    """A row as guide 22 writes it (`checks.guides.g22_fsdp2_step_map.calls.rows` writes the observed ones)."""
    return f"{phase:<9} {unit:<9} {hook}: {', '.join(did) or '(returns at once)'}"


def step_rows(
    inner: Sequence[str],
    *,
    first: bool = False,
    root_outputs: int = 1,
    ends_through_iteration: bool = False,
    keep_after_forward: bool = False,
    keep_after_backward: bool = False,
) -> list[str]:
    """The rows of one step of a root and the ``inner`` units (in forward order). ``keep_after_forward``: every
    unit keeps its parameters after forward (``reshard_after_forward=False``): no post-forward reshards, and
    backward finds every group unsharded, so its prefetches and waits do nothing. ``keep_after_backward``: every
    unit keeps its parameters after backward (``reshard_after_backward=False``), this step's and the one before:
    no post-backward reshards, and the forward finds every group unsharded, so it unshards and waits for
    nothing."""
    if not inner or ROOT in inner or len(set(inner)) != len(inner):
        raise ValueError(f"inner units are distinct, at least one, and none is the root: {list(inner)!r}")
    if root_outputs < 1:
        raise ValueError(f"the root returns at least one tensor that needs a gradient, not {root_outputs}")
    groups = len(inner) + 1
    init = [*FIRST_STEP_INIT, f"lazy_init ×{groups}"] if first else []
    own = (
        ["pre_forward"]
        if keep_after_backward and not first
        else ["pre_forward", "unshard (all-gather)", "wait_for_unshard"]
    )
    rows = [row("forward", ROOT, "pre-forward", ["_root_pre_forward", *init, *own])]
    after = ["post_forward", "reshard", "_record_post_forward", "_register_pre_backward_hook (1 output)"]
    if keep_after_forward:
        after.remove("reshard")
    for unit in inner:
        rows.append(row("forward", unit, "pre-forward", [*own, "_register_post_backward_hook"]))
        rows.append(row("forward", unit, "post-forward", after))
    outputs = f"{root_outputs} output{'s' if root_outputs != 1 else ''}"
    rows.append(row("forward", ROOT, "post-forward",
                    ["post_forward", "_record_post_forward", f"_register_pre_backward_hook ({outputs})"]))  # fmt: skip
    gathers = not keep_after_forward
    rows.append(row("backward", ROOT, "pre-backward",
                    ["queue final callback", "pre_backward", *_prefetch(inner[-1], gathers)]))  # fmt: skip
    rows += [row("backward", ROOT, "pre-backward", [])] * (root_outputs - 1)
    reduce = ["post_backward", "foreach_reduce (reduce-scatter)"] if keep_after_backward else [
        "post_backward", "reshard", "foreach_reduce (reduce-scatter)"]  # fmt: skip
    for at in range(len(inner) - 1, -1, -1):
        ahead = _prefetch(inner[at - 1], gathers) if at > 0 else []
        wait = ["wait_for_unshard"] if gathers else []
        rows.append(row("backward", inner[at], "pre-backward", ["pre_backward", *wait, *ahead]))
        rows.append(row("backward", inner[at], "post-backward", reduce))
    end = ["wait_for_gradient_reduction", "_end_backward_iteration"] if ends_through_iteration else []
    rows.append(row("backward", ROOT, "final callback", [*reduce, *end, f"finalize_backward ×{groups}"]))
    return rows


def _prefetch(unit: str, gathers: bool = True) -> list[str]:
    """A pre-backward's implicit prefetch of ``unit``: the call, and the all-gather it issues when ``unit`` is
    sharded (``gathers``)."""
    issued = [f"unshard {unit} (all-gather)"] if gathers else []
    return ["_backward_prefetch", f"_prefetch_unshard {unit}", *issued]
