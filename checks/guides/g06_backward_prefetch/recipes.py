"""Guide 06's behaviour bent on purpose: the break-it recipes `tests/break_it/test_06_backward_prefetch.py` applies
(prefetches issued late, from the wrong hook, before the free, to the wrong unit, or never; records that grow
otherwise), and `EXERCISES`, some of them as puzzles (``fsdp-readings exercise 06-backward-prefetch``)."""

from __future__ import annotations

from typing import Any

from torch.distributed.fsdp import BackwardPrefetch

from checks.breakit.exercises import Exercise
from checks.breakit.patches import returning, wrapping

_EOU = "torch.distributed.fsdp._exec_order_utils:_ExecOrderData"

_HELD: list[tuple[Any, Any, Any, Any]] = []


def hold_pre_backward_prefetch(original: Any, state: Any, current_handle: Any, prefetch_mode: Any) -> Any:
    """``_prefetch_handle`` that holds back the prefetch a pre-backward hook asks for; `issue_held_prefetch`
    issues it when the issuer's post-backward hook starts, after its gradient computation."""
    from torch.distributed.fsdp._common_utils import HandleTrainingState

    if current_handle and current_handle._training_state == HandleTrainingState.BACKWARD_PRE:
        _HELD.append((original, state, current_handle, prefetch_mode))
        return None
    return original(state, current_handle, prefetch_mode)


def issue_held_prefetch(original: Any, state: Any, handle: Any, *args: Any) -> Any:
    """``_post_backward_hook`` that first issues the prefetch its unit's pre-backward hook held back (the unit is
    still in BACKWARD_PRE there), then runs as usual."""
    for held in [h for h in _HELD if h[2] is handle]:
        _HELD.remove(held)
        prefetch, unit_state, issuer, mode = held
        prefetch(unit_state, issuer, mode)
    return original(state, handle, *args)


def prefetch_two_back(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_backward_prefetch`` with a limit of 2: the unit two before the issuer."""
    eod._backward_prefetch_limit = 2
    try:
        return original(eod, current_handle)
    finally:
        eod._backward_prefetch_limit = 1


def prefetch_forward_neighbour(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_backward_prefetch`` that looks the wrong way: the unit *after* the issuer in post-forward
    order."""
    index = current_handle._post_forward_index
    order = eod.handles_post_forward_order
    return order[index + 1] if index is not None and index + 1 < len(order) else None


def prefetch_before_free(original: Any, state: Any, handle: Any, *unused: Any) -> None:
    """``_post_backward_reshard`` that prefetches first and frees the unit's own parameters after."""
    from torch.distributed.fsdp import _runtime_utils as ru

    ru._prefetch_handle(state, handle, ru._PrefetchMode.BACKWARD)
    ru._reshard(state, handle, ru._should_free_in_backward(state, handle))


def keep_then_prefetch(original: Any, state: Any, handle: Any, *unused: Any) -> None:
    """``_post_backward_reshard`` that reshards without freeing, then prefetches: no free precedes the prefetch."""
    from torch.distributed.fsdp import _runtime_utils as ru

    ru._reshard(state, handle, False)
    ru._prefetch_handle(state, handle, ru._PrefetchMode.BACKWARD)


def candidate_always_needed(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_backward_prefetch`` whose candidate always counts as still needing its pre-backward
    unshard: under BACKWARD_POST the root's post-backward then unshards blocks.2 again at the end of backward."""
    candidate = original(eod, current_handle)
    if candidate is not None:
        candidate._needs_pre_backward_unshard = True
    return candidate


def wrap_around_to_last(original: Any, eod: Any, current_handle: Any) -> Any:
    """``get_handle_to_backward_prefetch`` that wraps around: the unit at index 0 reads the record as if it came
    after the last entry, so its candidate is the last unit recorded (the root)."""
    if current_handle._post_forward_index != 0:
        return original(eod, current_handle)
    current_handle._post_forward_index = len(eod.handles_post_forward_order)
    try:
        return original(eod, current_handle)
    finally:
        current_handle._post_forward_index = 0


def wrap_around_needed(original: Any, eod: Any, current_handle: Any) -> Any:
    """`wrap_around_to_last`, and the root it offers counts as still needing its unshard: blocks.0's hook prefetches
    the root, which is still unsharded from forward."""
    candidate = wrap_around_to_last(original, eod, current_handle)
    if candidate is not None and current_handle._post_forward_index == 0:
        candidate._needs_pre_backward_unshard = True
    return candidate


def reshard_without_prefetch(original: Any, state: Any, handle: Any, *unused: Any) -> None:
    """``_post_backward_reshard`` that reshards and never prefetches."""
    from torch.distributed.fsdp import _runtime_utils as ru

    ru._reshard(state, handle, ru._should_free_in_backward(state, handle))


def pre_even_with_none(original: Any, state: Any, backward_prefetch: Any, forward_prefetch: bool) -> Any:
    """``_init_prefetching_state`` that turns ``backward_prefetch=None`` into BACKWARD_PRE."""
    return original(state, backward_prefetch or BackwardPrefetch.BACKWARD_PRE, forward_prefetch)


def post_prefetch_after_reduce(original: Any, state: Any, handle: Any, *args: Any) -> Any:
    """``_post_backward_hook`` whose prefetch is issued after the gradient's reduce-scatter instead of before."""
    from torch.distributed.fsdp import _runtime_utils as ru

    prefetch = ru._prefetch_handle
    ru._prefetch_handle = lambda *a, **k: None
    try:
        result = original(state, handle, *args)
    finally:
        ru._prefetch_handle = prefetch
    prefetch(state, handle, ru._PrefetchMode.BACKWARD)
    return result


def record_with_is_not_none(original: Any, eod: Any, handle: Any) -> None:
    """``record_post_forward`` with ``is not None`` for the truth test: index 0 counts as recorded."""
    if not handle:
        return
    if handle._post_forward_index is None:
        handle._post_forward_index = len(eod.handles_post_forward_order)
    eod.handles_post_forward_order.append(handle)


def record_first_use_only(original: Any, eod: Any, handle: Any) -> None:
    """``record_post_forward`` that does what its comment says: only a unit's first use is recorded."""
    if handle and handle._post_forward_index is not None:
        return
    original(eod, handle)


def next_iter_keeping_order(original: Any, eod: Any) -> None:
    """``next_iter`` that no longer clears the post-forward record."""
    kept = list(eod.handles_post_forward_order)
    original(eod)
    eod.handles_post_forward_order.extend(kept)


# -- exercises: recipes above as puzzles (fsdp-readings exercise 06-backward-prefetch) ---------------------------
_RU = "torch.distributed.fsdp._runtime_utils"

EXERCISES = (
    Exercise(
        "two-back",
        claim="pre-prefetches-reverse-post-forward",
        patches=(wrapping(f"{_EOU}.get_handle_to_backward_prefetch", prefetch_two_back),),
        puzzle="`get_handle_to_backward_prefetch` looks two units back in the post-forward record instead of one.",
        reason="prefetch-order",
    ),
    Exercise(
        "prefetch-then-free",
        claim="post-prefetches-after-free",
        patches=(wrapping(f"{_RU}:_post_backward_reshard", prefetch_before_free),),
        puzzle="`_post_backward_reshard` prefetches the next unit before it frees the current one.",
        reason="prefetch-before-free",
    ),
    Exercise(
        "no-candidates",
        claim="model-predicts-toy",
        patches=(returning(f"{_EOU}.get_handle_to_backward_prefetch", None),),
        puzzle="`get_handle_to_backward_prefetch` never finds a candidate. What does the rule model then miss?",
        reason="sequence-differs",
    ),
)
