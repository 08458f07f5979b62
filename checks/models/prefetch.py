"""Which unit FSDP1 unshards ahead of time, as rules over unit names (guides 04 and, for backward, the probes).

Forward (``forward_prefetch=True``, guide 04): iteration 1 records the order units run their pre-forward; from
then on, when unit U runs its pre-forward it prefetches the unit after U in the *recorded* order, unless that unit
already ran its pre-forward or was already prefetched this iteration.

Backward (from the post-forward order): pre-backward hooks fire in reverse post-forward order; a unit's
post-backward follows its own gradient computation, and the root's comes last when the root produces the
output. A prefetch targets the unit before the issuer in post-forward order, if that unit has not been unsharded
for backward yet: BACKWARD_PRE issues it from the pre-backward hook, BACKWARD_POST from the post-backward hook,
None never.
"""

from __future__ import annotations

from collections.abc import Sequence

POLICIES = ("BACKWARD_PRE", "BACKWARD_POST", None)


def forward_prefetches(recorded: Sequence[str], used: Sequence[str]) -> list[str]:
    """``issuer -> target`` for an iteration whose units run their pre-forward in ``used`` order, when the order
    recorded in iteration 1 was ``recorded``."""
    done: set[str] = set()
    prefetched: set[str] = set()
    out = []
    for current in used:
        done.add(current)
        position = list(recorded).index(current)
        if position + 1 < len(recorded):
            target = recorded[position + 1]
            if target not in done and target not in prefetched:
                prefetched.add(target)
                out.append(f"{current} -> {target}")
    return out


def backward_sequence(post_forward: Sequence[str], policy: str | None) -> list[str]:
    """The backward's hooks and prefetches, as ``pre_backward U``, ``post_backward U`` and ``prefetch U→T``,
    for units listed in post-forward order with the root (which produces the output) last."""
    if policy not in POLICIES:
        raise ValueError(f"unknown backward prefetch policy {policy!r}; one of {POLICIES}")
    *inner, root = post_forward
    done: set[str] = set()
    seq: list[str] = []

    def prefetch(issuer: str) -> None:
        i = post_forward.index(issuer)
        if i > 0 and post_forward[i - 1] not in done:
            done.add(post_forward[i - 1])
            seq.append(f"prefetch {issuer}→{post_forward[i - 1]}")

    for unit in (root, *reversed(inner)):
        seq.append(f"pre_backward {unit}")
        done.add(unit)
        if policy == "BACKWARD_PRE":
            prefetch(unit)
        if unit != root:
            seq.append(f"post_backward {unit}")
            if policy == "BACKWARD_POST":
                prefetch(unit)
    seq.append(f"post_backward {root}")
    if policy == "BACKWARD_POST":
        prefetch(root)
    return seq


def forward_sequence(root: str, inner: Sequence[str], strategy: str) -> list[str]:
    """One forward's unshards and reshards: the root's pre-forward unshards the root; each inner unit is unsharded
    before and resharded after its forward; FULL_SHARD frees the inner units but keeps the root (it is needed first
    in backward); SHARD_GRAD_OP frees nothing."""
    keep_inner = strategy != "FULL_SHARD"
    seq = [f"root_pre_forward {root}", f"unshard {root}"]
    for unit in inner:
        seq += [f"unshard {unit}", f"{'reshard' if keep_inner else 'free'} {unit}"]
    return [*seq, f"reshard {root}"]
