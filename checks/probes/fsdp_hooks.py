"""Which FSDP functions the event recorder observes, and how each frame becomes an event.

This is the module that knows torch's private FSDP internals (argument names, state attributes). Every symbol is
resolved when a recording starts; one that a new torch renamed or removed stops the recording with its name,
instead of silently recording nothing.

Source lines (only while a check is captured, `checks.ranks.capture`; otherwise no frame is looked at for them):

- an event's ``source`` is the line of the FSDP code that called the observed function, where the call is in
  progress (``_pre_forward_unshard``'s ``_unshard(...)`` for an unshard, ``_post_forward_reshard``'s
  ``_reshard(...)`` for a free, ``_post_backward_hook``'s ``_reduce_grad(...)``); decorator wrappers in between
  are skipped, as for the issuer.
- a prefetch is about the prefetch function (FSDP1 ``_prefetch_handle``, FSDP2 ``_prefetch_unshard``): ``source``
  is where the issuing unit's hook called it (``_prefetch_handle(state, handle, _PrefetchMode.FORWARD)``), and
  ``via`` the line inside it that issued the unshard.
- when the caller is not FSDP code (hooks autograd calls: FSDP1's pre- and post-backward hooks and final
  callback; anything called from user code), ``source`` is the observed function's own ``def`` line: the
  nearest Python frame there is the autograd engine's ``run_backward`` call (or the user's), which says nothing
  about FSDP.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from typing import Any

import torch

from checks.naming import ROOT, unit_name
from checks.probes import calls, clock
from checks.probes.calls import CallHook, ReturnHook
from checks.probes.recording import Recording
from checks.ranks import capture
from checks.ranks.codeswap import code_of

_FSDP1 = "torch.distributed.fsdp._runtime_utils"
_FLAT = "torch.distributed.fsdp._flat_param"
_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup"
_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState"
_COLLECTIVES2 = "torch.distributed.fsdp._fully_shard._fsdp_collectives"


def _code(symbol: str) -> types.CodeType:
    try:
        return calls.function_code(symbol)
    except (AttributeError, ImportError, KeyError, TypeError) as exc:
        raise RuntimeError(
            f"record_events cannot observe {symbol} in torch {torch.__version__}: {exc!r}. The FSDP source moved; "
            "update checks/probes/fsdp_hooks.py after reading the new code."
        ) from exc


_DECORATOR_MODULES = ("torch.utils._contextlib", "torch._dynamo", "torch._compile", "functools", "contextlib")
_WRAPPER_NAMES = frozenset({"wrapper", "_fn", "inner", "wrapped", "decorate_context"})


def _is_wrapper(frame: types.FrameType) -> bool:
    if calls.is_plumbing(frame):  # the call observer's own frames (checks.probes.calls)
        return True
    module = frame.f_globals.get("__name__", "")
    if module.startswith(_DECORATOR_MODULES):
        return True
    code = frame.f_code  # torch's own decorators (FSDP2's _dynamo_disable, _disable_functorch_if_active)
    return module.startswith("torch") and code.co_name in _WRAPPER_NAMES and "<locals>" in code.co_qualname


def _caller(frame: types.FrameType) -> types.FrameType | None:
    """The frame that called ``frame``'s function, skipping decorator wrappers (``torch.no_grad()``,
    ``_dynamo_disable``) that sit between them."""
    caller = frame.f_back
    while caller is not None and _is_wrapper(caller):
        caller = caller.f_back
    return caller


_FSDP_DIR = f"{os.sep}torch{os.sep}distributed{os.sep}fsdp{os.sep}"


def _source(frame: types.FrameType) -> str:
    """Where the event of ``frame`` was issued (the rules are in the module docstring); "" unless captured."""
    if not capture.active():
        return ""
    caller = _caller(frame)
    if caller is not None and _FSDP_DIR in caller.f_code.co_filename:
        return capture.where(caller)
    return capture.defined_at(frame)


def _prefetch_source(prefetch: types.FrameType) -> tuple[str, str]:
    """(source, via) of a prefetch whose unshard ``prefetch`` (the prefetch function's frame) is issuing."""
    return (_source(prefetch), capture.where(prefetch)) if capture.active() else ("", "")


def _name(state: Any) -> str:
    return state.name if hasattr(state, "name") else str(state)


def hook_table(rec: Recording) -> dict[types.CodeType, CallHook]:
    return {**_fsdp1(rec), **_fsdp2(rec)}


# -- FSDP1: torch/distributed/fsdp/_runtime_utils.py ---------------------------------------------------------------
def _fsdp1(rec: Recording) -> dict[types.CodeType, CallHook]:
    prefetch_code = _code(f"{_FSDP1}:_prefetch_handle")
    gathers = [0]  # FlatParamHandle._all_gather_flat_param calls so far

    def handle_fqn(handle: Any) -> str:
        return rec.unit(handle._fully_sharded_module)

    def state_of(handle: Any) -> str:
        return _name(handle._training_state)

    def root_pre_forward(frame: types.FrameType) -> ReturnHook:
        seq, iteration, source = clock.tick(), rec.iteration, _source(frame)
        state, module = frame.f_locals["state"], frame.f_locals["module"]

        def done(frame: types.FrameType, value: Any) -> None:
            if state._is_root:  # every FSDP1 instance calls it; only the root's does anything
                rec.add_root(module)
                rec.emit("root_pre_forward", ROOT, "", api="fsdp1", seq=seq, iteration=iteration, source=source)

        return done

    def unshard(frame: types.FrameType) -> ReturnHook | None:
        handle = frame.f_locals["handle"]
        if not handle:
            return None
        seq, iteration, before = clock.tick(), rec.iteration, gathers[0]
        caller = _caller(frame)
        if caller is not None and code_of(caller) is prefetch_code:
            issuer = caller.f_locals["current_handle"]
            fqn, target, state, kind = handle_fqn(issuer), handle_fqn(handle), state_of(issuer), "prefetch"
            source, via = _prefetch_source(caller)
        else:
            fqn, target, state, kind = handle_fqn(handle), None, state_of(handle), "unshard"
            source, via = _source(frame), ""

        def done(frame: types.FrameType, value: Any) -> None:
            detail = "all-gather" if gathers[0] > before else "no all-gather"
            rec.emit(
                kind, fqn, state, api="fsdp1", target=target, detail=detail, seq=seq, iteration=iteration,
                source=source, via=via,
            )  # fmt: skip

        return done

    def all_gather(frame: types.FrameType) -> None:
        gathers[0] += 1

    def reshard(frame: types.FrameType) -> None:
        handle = frame.f_locals["handle"]
        kind = "free" if frame.f_locals["free_unsharded_flat_param"] else "reshard"
        rec.emit(kind, handle_fqn(handle), state_of(handle), api="fsdp1", source=_source(frame))

    def pre_backward(frame: types.FrameType) -> None:
        handle = frame.f_locals["handle"]
        if handle and not getattr(handle, "_ran_pre_backward_hook", False):
            rec.emit("pre_backward", handle_fqn(handle), state_of(handle), api="fsdp1", source=_source(frame))

    def post_backward(detail: str) -> CallHook:
        def hook(frame: types.FrameType) -> None:
            handle = frame.f_locals["handle"]
            fqn, state = handle_fqn(handle), state_of(handle)
            rec.emit("post_backward", fqn, state, api="fsdp1", detail=detail, source=_source(frame))

        return hook

    def reduce_grad(frame: types.FrameType) -> None:
        state, handle = frame.f_locals["state"], frame.f_locals["handle"]
        hybrid = _name(handle._sharding_strategy) in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
        detail = "comm hook" if state._comm_hook is not None else "reduce-scatter" + (" + all-reduce" * hybrid)
        rec.emit("reduce_grad", handle_fqn(handle), state_of(handle), api="fsdp1", detail=detail, source=_source(frame))

    def reduce_grad_no_shard(frame: types.FrameType) -> None:
        state, handle = frame.f_locals["state"], frame.f_locals["handle"]
        detail = "comm hook" if state._comm_hook is not None else "all-reduce"
        rec.emit("reduce_grad", handle_fqn(handle), state_of(handle), api="fsdp1", detail=detail, source=_source(frame))

    def final_callback(frame: types.FrameType) -> ReturnHook:
        rec.emit("final_callback", rec.unit(frame.f_locals["module"]), "", api="fsdp1", source=_source(frame))
        return _next_iteration(rec)

    return {
        _code(f"{_FSDP1}:_root_pre_forward"): root_pre_forward,
        _code(f"{_FSDP1}:_unshard"): unshard,
        _code(f"{_FLAT}:FlatParamHandle._all_gather_flat_param"): all_gather,
        _code(f"{_FSDP1}:_reshard"): reshard,
        _code(f"{_FSDP1}:_pre_backward_hook"): pre_backward,
        _code(f"{_FSDP1}:_post_backward_hook"): post_backward(""),
        _code(f"{_FSDP1}:_post_backward_reshard_only_hook"): post_backward("reshard only"),
        _code(f"{_FSDP1}:_reduce_grad"): reduce_grad,
        _code(f"{_FSDP1}:_reduce_grad_no_shard"): reduce_grad_no_shard,
        _code(f"{_FSDP1}:_post_backward_final_callback"): final_callback,
    }


def _next_iteration(rec: Recording) -> ReturnHook:
    def done(frame: types.FrameType, value: Any) -> None:
        rec.iteration += 1

    return done


# -- FSDP2: torch/distributed/fsdp/_fully_shard/ ---------------------------------------------------------------------
def _fsdp2(rec: Recording) -> dict[types.CodeType, CallHook]:
    prefetch_code = _code(f"{_GROUP}._prefetch_unshard")
    final_code = _code(f"{_STATE}._root_post_backward_final_callback")
    gathers = [0]  # foreach_all_gather calls so far (none when the mesh has one rank)

    def group_fqn(group: Any) -> str:
        fqn = getattr(group, "_module_fqn", None)
        return unit_name(fqn) if isinstance(fqn, str) else rec.unit(group.modules[0])

    def state_fqn(state: Any) -> str:
        group = state._fsdp_param_group
        if group is not None:
            return group_fqn(group)
        return ROOT if state._is_root else rec.unit(state._modules[0])

    def issuer_of(frame: types.FrameType | None) -> tuple[str, str]:
        owner = frame.f_locals.get("self") if frame is not None else None
        if owner is None:
            return "?", ""
        is_group = hasattr(owner, "fsdp_params")
        return (group_fqn(owner) if is_group else state_fqn(owner)), _name(owner._training_state)

    def unshard(frame: types.FrameType) -> ReturnHook | None:
        group = frame.f_locals["self"]
        if group._all_gather_result is not None:
            return None  # already unsharding: a no-op
        seq, iteration, before = clock.tick(), rec.iteration, gathers[0]
        caller = _caller(frame)
        prefetched = caller is not None and code_of(caller) is prefetch_code
        issuer, issuer_state = issuer_of(_caller(caller)) if prefetched and caller is not None else ("", "")
        state = _name(group._training_state)
        source, via = _prefetch_source(caller) if prefetched and caller is not None else (_source(frame), "")

        def done(frame: types.FrameType, value: Any) -> None:
            if group._all_gather_result is None:
                return  # returned early: nothing was issued
            detail = "all-gather" if gathers[0] > before else "no all-gather"
            if prefetched:
                rec.emit(
                    "prefetch", issuer, issuer_state, api="fsdp2", target=group_fqn(group), detail=detail, seq=seq,
                    iteration=iteration, source=source, via=via,
                )  # fmt: skip
            else:
                rec.emit(
                    "unshard", group_fqn(group), state, api="fsdp2", detail=detail, seq=seq, iteration=iteration,
                    source=source,
                )  # fmt: skip

        return done

    def all_gather(frame: types.FrameType) -> None:
        gathers[0] += 1

    def wait_for_unshard(frame: types.FrameType) -> None:
        group = frame.f_locals["self"]
        if group._all_gather_result is not None:  # else there is nothing to wait for and it returns at once
            state = _name(group._training_state)
            rec.emit("wait_unshard", group_fqn(group), state, api="fsdp2", source=_source(frame))

    def to_sharded(kind: str, detail: str) -> CallHook:
        def hook(frame: types.FrameType) -> ReturnHook:
            group = frame.f_locals["self"]
            seq, iteration, source = clock.tick(), rec.iteration, _source(frame)
            before, state = group._sharded_state, _name(group._training_state)

            def done(frame: types.FrameType, value: Any) -> None:
                if group._sharded_state != before:
                    rec.emit(
                        kind, group_fqn(group), state, api="fsdp2", detail=detail, seq=seq, iteration=iteration,
                        source=source,
                    )  # fmt: skip

            return done

        return hook

    def pre_backward(frame: types.FrameType) -> None:
        group = frame.f_locals["self"]
        if _name(group._training_state) != "PRE_BACKWARD":  # a repeated call returns at once
            state = _name(group._training_state)
            rec.emit("pre_backward", group_fqn(group), state, api="fsdp2", source=_source(frame))

    def post_backward(frame: types.FrameType) -> None:
        group = frame.f_locals["self"]
        caller = _caller(frame)
        late = caller is not None and code_of(caller) is final_code
        detail = "from final callback" if late else ""
        state = _name(group._training_state)
        rec.emit("post_backward", group_fqn(group), state, api="fsdp2", detail=detail, source=_source(frame))

    def foreach_reduce(frame: types.FrameType) -> None:
        local = frame.f_locals
        caller = _caller(frame)
        group = caller.f_locals.get("self") if caller is not None else None
        parts = []
        if local.get("reduce_scatter_group") is not None:
            parts.append("reduce-scatter")
        if local.get("all_reduce_group") is not None and local.get("all_reduce_grads", True):
            parts.append("all-reduce")
        fqn = group_fqn(group) if group is not None else "?"
        state = _name(group._training_state) if group is not None else ""
        rec.emit("reduce_grad", fqn, state, api="fsdp2", detail=" + ".join(parts), source=_source(frame))

    def root_pre_forward(frame: types.FrameType) -> ReturnHook:
        state = frame.f_locals["self"]
        seq, iteration, source = clock.tick(), rec.iteration, _source(frame)
        before = state._state_ctx.iter_forward_root

        def done(frame: types.FrameType, value: Any) -> None:
            if before is None and state._state_ctx.iter_forward_root is state:
                rec.emit(
                    "root_pre_forward", state_fqn(state), "", api="fsdp2", seq=seq, iteration=iteration, source=source
                )

        return done

    def final_callback(frame: types.FrameType) -> ReturnHook:
        rec.emit("final_callback", state_fqn(frame.f_locals["self"]), "", api="fsdp2", source=_source(frame))
        return _next_iteration(rec)

    table: dict[types.CodeType, Callable[[types.FrameType], Any]] = {
        _code(f"{_STATE}._root_pre_forward"): root_pre_forward,
        _code(f"{_GROUP}.unshard"): unshard,
        _code(f"{_COLLECTIVES2}:foreach_all_gather"): all_gather,
        _code(f"{_GROUP}.wait_for_unshard"): wait_for_unshard,
        _code(f"{_GROUP}._to_sharded"): to_sharded("free", ""),
        _code(f"{_GROUP}._to_sharded_post_forward"): to_sharded("reshard", "post-forward mesh"),
        _code(f"{_GROUP}.pre_backward"): pre_backward,
        _code(f"{_GROUP}.post_backward"): post_backward,
        _code(f"{_COLLECTIVES2}:foreach_reduce"): foreach_reduce,
        final_code: final_callback,
    }
    return table
