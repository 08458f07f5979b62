"""In which order autograd reaches FSDP1's backward hooks, from when forward created each unit's views (guide 04).

Autograd's engine runs, among the nodes whose inputs are ready, the one created last in forward first: its ready
queue is ordered by each node's sequence number, taken from a per-thread counter when the forward op ran
(``torch/include/torch/csrc/autograd/engine.h``, ``ReadyQueue::CompareNodeTaskTime``; ``node.h``'s NOTE
[ Sequence Number ]). The model keeps just enough of the graph to see what that means for FSDP1's hooks:

- A unit's *views* node: under ``use_orig_params=True`` every original parameter is, in forward, a tensor view
  of the unit's flat parameter, created when the unit is unsharded (by its own pre-forward, or earlier by a
  prefetch). Their gradients meet there; once it runs, the flat parameter's gradient is accumulated and the
  unit's post-backward hook fires (AccumulateGrad nodes have the highest priority of all).
- A unit's *compute* nodes: the forward ops of its own layers, one chain in forward order. The gradient of a
  segment's output flows to the segment before it, and to the unit's views node, which is ready only when every
  compute segment of its unit has run. The unit's pre-backward hook fires when autograd first reaches one of its
  segments (the hook sits on the unit's outputs).

mini_gpt's root computes twice: its embeddings before the blocks and its head after them (`mini_gpt_forward`).

From that graph `backward_hooks` gives the hook order, and `backward_with_prefetch` adds BACKWARD_PRE's
prefetches (each pre-backward hook prefetches the unit before it in post-forward order, if that unit has neither
run its pre-backward hook nor been prefetched) and counts the units holding unsharded parameters: the root is
kept from forward (guide 03), a prefetch or a unit's own pre-backward hook unshards, a post-backward hook frees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

VIEWS, COMPUTE = "views", "compute"


@dataclass(frozen=True)
class Created:
    """One node forward created, in creation order: a unit's views, or one compute segment of a unit."""

    kind: str  # VIEWS | COMPUTE
    unit: str


def mini_gpt_forward(root: str, blocks: Sequence[str], forward_prefetch: bool) -> list[Created]:
    """What mini_gpt's forward creates, in order. The root unshards itself, computes its embeddings, then each
    block runs, then the root's head. Without prefetch each block's views are created by its own pre-forward,
    right before its compute. With forward prefetch (iteration 2 on, guide 04) each unit's pre-forward first
    prefetches the next unit of the recorded order: the root's prefetches ``blocks[0]`` before the embeddings,
    each block's the following block before its own compute."""
    made = [Created(VIEWS, root)]
    if forward_prefetch and blocks:
        made.append(Created(VIEWS, blocks[0]))
    made.append(Created(COMPUTE, root))
    for i, block in enumerate(blocks):
        if not forward_prefetch:
            made.append(Created(VIEWS, block))
        elif i + 1 < len(blocks):
            made.append(Created(VIEWS, blocks[i + 1]))
        made.append(Created(COMPUTE, block))
    made.append(Created(COMPUTE, root))
    return made


def backward_hooks(made: Sequence[Created]) -> list[str]:
    """``pre_backward U`` and ``post_backward U`` in the order autograd reaches them: start at the last compute
    segment, always run the ready node created last."""
    computes = [i for i, node in enumerate(made) if node.kind == COMPUTE]
    views = {node.unit: i for i, node in enumerate(made) if node.kind == VIEWS}
    segments_left = {unit: sum(1 for i in computes if made[i].unit == unit) for unit in views}
    ready, seen, out = {computes[-1]}, set(), []
    while ready:
        index = max(ready)
        ready.remove(index)
        node = made[index]
        if node.kind == VIEWS:
            out.append(f"post_backward {node.unit}")
            continue
        if node.unit not in seen:
            seen.add(node.unit)
            out.append(f"pre_backward {node.unit}")
        position = computes.index(index)
        if position > 0:
            ready.add(computes[position - 1])
        segments_left[node.unit] -= 1
        if segments_left[node.unit] == 0:
            ready.add(views[node.unit])
    return out


def backward_with_prefetch(
    made: Sequence[Created], post_forward: Sequence[str], kept: Sequence[str]
) -> tuple[list[str], list[tuple[str, int]]]:
    """The BACKWARD_PRE backward: the hook order of `backward_hooks` with each pre-backward hook's prefetch
    (``prefetch U→T``) after it, and the units holding unsharded parameters at each moment, as (moment, count):
    ``compute U`` once U's pre-backward hook (and its prefetch) returned, ``post-backward U`` once U freed.
    ``kept`` are the units still unsharded when backward starts (FULL_SHARD: the root)."""
    alive, unsharded_for_backward = set(kept), set()
    sequence: list[str] = []
    moments: list[tuple[str, int]] = []
    for line in backward_hooks(made):
        kind, unit = line.split()
        sequence.append(line)
        if kind == "pre_backward":
            unsharded_for_backward.add(unit)
            alive.add(unit)
            i = list(post_forward).index(unit)
            target = post_forward[i - 1] if i > 0 else None
            if target is not None and target not in unsharded_for_backward:
                unsharded_for_backward.add(target)
                alive.add(target)
                sequence.append(f"prefetch {unit}→{target}")
            moments.append((f"compute {unit}", len(alive)))
        else:
            alive.discard(unit)
            moments.append((f"post-backward {unit}", len(alive)))
    return sequence, moments
