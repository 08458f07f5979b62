"""Checks for guide 07, the pre-backward hook: on which outputs FSDP1 registers it, how often it runs and does
work, and how the root queues the final callback once per backward.

Expected values never come from FSDP. They follow from how the fan-out model below is built (which of its units'
outputs require grad, which reach the loss), and the guide states them in its expect blocks. What torch did is
observed from the code that ran (`checks.ranks.tracing`):

- every call of `_pre_backward_hook`, whatever it then does;
- the calls that get past its ``_ran_pre_backward_hook`` guard: the hook enters
  ``record_function("FullyShardedDataParallel._pre_backward_hook")`` on the line right after the guard, so a
  ``record_function.__enter__`` with that name, called from the hook's frame, marks the call as passed;
- ``FlatParamHandle.prepare_gradient_for_backward`` called from the hook: its per-handle work;
- ``_register_post_backward_final_callback`` and ``_post_backward_final_callback`` runs, with the root's
  ``_post_backward_callback_queued`` flag at each;
- ``queue_callback`` calls on autograd's engine (``Variable._execution_engine``), a C method that no trace
  function sees: a profile function (``sys.setprofile``) sees it as a ``c_call``. Backward runs on the calling
  thread for that (``set_multithreading_enabled(False)``, as the FSDP event recorder does on GPU).
"""

from __future__ import annotations

import functools
import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from checks.breakit.exercises import Exercise
from checks.breakit.patches import wrapping
from checks.naming import ROOT
from checks.ranks import tracing
from checks.ranks.codeswap import code_of
from checks.ranks.context import RankContext
from checks.ranks.symbols import code_objects
from checks.violation import require_equal
from checks.workloads.gpt import units

RU = "torch.distributed.fsdp._runtime_utils"
GUARD_PASSED = "FullyShardedDataParallel._pre_backward_hook"  # the record_function the hook enters after its guard
FEATURES = 4
UNITS = ("frozen", "pair", "mixed")  # the root's children, each its own FSDP unit, in forward order


# -- the model: one unit per kind of output ----------------------------------------------------------------------
class Frozen(nn.Module):
    """Unit ``frozen``: its parameters require no grad and it reads the data, so its one output requires none."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, FEATURES)
        self.lin.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Pair(nn.Module):
    """Unit ``pair``: two outputs, ``a(x)`` and ``b(x)``, both requiring grad."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(FEATURES, FEATURES)
        self.b = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


class Mixed(nn.Module):
    """Unit ``mixed``: four outputs ``(y, y.detach(), y.argmax(-1), z)``, ``z`` computed under ``no_grad``. Only
    ``y`` requires grad: a detached tensor, an integer tensor and a tensor made without grad mode do not."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.lin(x)
        with torch.no_grad():
            z = self.lin(x)
        return y, y.detach(), y.argmax(-1), z


class FanOut(nn.Module):
    """The root: ``f = frozen(x)``, ``a, b = pair(f)``, ``y, ... = mixed(a + b)``; it returns two tensors that
    require grad, ``(head(y), head(b))``, or without ``head`` (a root that owns no parameters) ``(2y, 3b)``. ``b``
    reaches the loss through two consumers. Each unit's outputs are kept in ``outputs`` for the checks."""

    def __init__(self, head: bool = True) -> None:
        super().__init__()
        self.frozen = Frozen()
        self.pair = Pair()
        self.mixed = Mixed()
        self.head = nn.Linear(FEATURES, FEATURES) if head else None
        self.outputs: dict[str, tuple[torch.Tensor, ...]] = {}

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.frozen(x)
        a, b = self.pair(f)
        mixed = self.mixed(a + b)
        self.outputs = {"frozen": (f,), "pair": (a, b), "mixed": mixed}
        y = mixed[0]
        if self.head is None:
            return y * 2, b * 3
        return self.head(y), self.head(b)


def fan_out(ctx: RankContext, *, head: bool = True, seed: int = 0, **fsdp_kwargs: Any) -> FSDP:
    """The fan-out model with each child its own FSDP1 unit and the model the root (``use_orig_params=True``)."""
    fsdp_kwargs.setdefault("use_orig_params", True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = FanOut(head).to(ctx.device)
    for name in UNITS:
        setattr(model, name, FSDP(getattr(model, name), device_id=ctx.device, **fsdp_kwargs))
    return FSDP(model, device_id=ctx.device, **fsdp_kwargs)


def fan_out_batch(ctx: RankContext, step: int = 0, rows: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(97 * step + ctx.rank)
    return torch.randn(rows, FEATURES, generator=generator).to(ctx.device)


def _loss(outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return sum(o.sum() for o in outputs)  # type: ignore[return-value]


# -- observing backward --------------------------------------------------------------------------------------------
@dataclass
class HookCall:
    """One call of `_pre_backward_hook`: for which unit, whether it got past the guard, whether it prepared the
    handle's gradient."""

    unit: str
    passed: bool = False
    prepared: bool = False


@dataclass
class BackwardLog:
    calls: list[HookCall] = field(default_factory=list)
    registrations: list[dict[str, Any]] = field(default_factory=list)  # queued flag at entry and at return
    final_callbacks: list[bool | None] = field(default_factory=list)  # queued flag as each run starts
    queue_callbacks: int = 0

    def per_unit(self, attribute: str) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for call in self.calls:
            out.setdefault(call.unit, []).append(getattr(call, attribute))
        return out


def _code(symbol: str) -> types.CodeType:
    [code] = code_objects(symbol)
    return code


@contextmanager
def observe_backward(model: nn.Module) -> Iterator[BackwardLog]:
    """Record the pre-backward calls, the callback registrations and runs, and ``queue_callback`` calls."""
    from torch.distributed.fsdp import _runtime_utils

    log = BackwardLog()
    names = {id(unit): name for name, unit in units(model).items()}
    hook_code = _code(f"{RU}:_pre_backward_hook")
    open_calls: list[HookCall] = []

    def from_hook(frame: types.FrameType) -> bool:
        return bool(open_calls) and frame.f_back is not None and code_of(frame.f_back) is hook_code

    def on_hook(frame: types.FrameType) -> tracing.ReturnHook:
        call = HookCall(names.get(id(frame.f_locals["state"]), "?"))
        log.calls.append(call)
        open_calls.append(call)
        return lambda frame, value: open_calls.pop()

    def on_record_function(frame: types.FrameType) -> None:
        if from_hook(frame) and frame.f_locals["self"].name == GUARD_PASSED:
            open_calls[-1].passed = True

    def on_prepare(frame: types.FrameType) -> None:
        if from_hook(frame):
            open_calls[-1].prepared = True

    def on_register(frame: types.FrameType) -> tracing.ReturnHook:
        state = frame.f_locals["state"]
        entry = {"unit": names.get(id(state), "?"), "before": getattr(state, "_post_backward_callback_queued", None)}

        def done(frame: types.FrameType, value: Any) -> None:
            entry["after"] = getattr(state, "_post_backward_callback_queued", None)
            log.registrations.append(entry)

        return done

    def on_final(frame: types.FrameType) -> None:
        log.final_callbacks.append(getattr(frame.f_locals["state"], "_post_backward_callback_queued", None))

    engine = _runtime_utils.Variable._execution_engine
    previous = sys.getprofile()

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if previous is not None:
            previous(frame, event, arg)
        if event == "c_call" and getattr(arg, "__self__", None) is engine and arg.__name__ == "queue_callback":
            log.queue_callbacks += 1

    hooks = {
        hook_code: on_hook,
        _code("torch.autograd.profiler:record_function.__enter__"): on_record_function,
        _code("torch.distributed.fsdp._flat_param:FlatParamHandle.prepare_gradient_for_backward"): on_prepare,
        _code(f"{RU}:_register_post_backward_final_callback"): on_register,
        _code(f"{RU}:_post_backward_final_callback"): on_final,
    }
    with tracing.subscribed(hooks) as subscription, torch.autograd.set_multithreading_enabled(False):
        sys.setprofile(profile)
        try:
            yield log
        finally:
            sys.setprofile(previous)
    if subscription.errors:
        raise RuntimeError(f"the pre-backward observer failed: {subscription.errors[0]!r}")


# -- claim: once per handle per backward ---------------------------------------------------------------------------
_COUNTS = re.compile(r"^(\S+)\s+(\d+) calls?, (\d+) past the guard$")


def _parse_counts(lines: list[str]) -> dict[str, tuple[int, int]]:
    counts = {}
    for line in lines:
        match = _COUNTS.match(line.strip())
        if match is None:
            raise ValueError(f"expect line {line!r} is not '<unit> <n> calls, <m> past the guard'")
        counts[match[1]] = (int(match[2]), int(match[3]))
    return counts


def hook_works_once_per_backward(ctx: RankContext, expected: list[str], iterations: int = 2) -> dict[str, Any]:
    """In each of ``iterations`` forward/backward steps, autograd calls each unit's `_pre_backward_hook` once per
    output tensor that requires grad and reaches the loss (``expected``: the guide's counts, from the model's
    structure, its rows in the order of the calls); only the unit's first call gets past the
    ``_ran_pre_backward_hook`` guard, and that call prepares the handle's gradient."""
    want = _parse_counts(expected)
    want_calls = {unit: calls for unit, (calls, _) in want.items()}
    want_passed = {unit: [True] * passed + [False] * (calls - passed) for unit, (calls, passed) in want.items()}
    model = fan_out(ctx)
    seen: dict[str, Any] = {}
    for step in range(iterations):
        loss = _loss(model(fan_out_batch(ctx, step)))
        with observe_backward(model) as log:
            loss.backward()
        label = f"iteration {step + 1}"
        passed, prepared = log.per_unit("passed"), log.per_unit("prepared")
        calls = {unit: len(passed.get(unit, [])) for unit in want}
        require_equal(
            calls, want_calls, reason="pre-backward-calls", what=f"{label}: `_pre_backward_hook` calls per unit"
        )
        got_passed = {unit: passed.get(unit, []) for unit in want}
        require_equal(
            got_passed,
            want_passed,
            reason="pre-backward-work",
            what=f"{label}: which calls got past the `_ran_pre_backward_hook` guard, per unit",
        )
        require_equal(
            {unit: prepared.get(unit, []) for unit in want},
            got_passed,
            reason="per-handle-work",
            what=f"{label}: which calls prepared the handle's gradient, per unit",
        )
        # The block's rows are in call order: autograd runs the ready node created last first, so the root's
        # outputs come first, then `mixed`'s, then `pair`'s (whose `b` also feeds `mixed`).
        want_order = [unit for unit, (n, _) in want.items() for _ in range(n)]
        order = [call.unit for call in log.calls]
        what = f"{label}: `_pre_backward_hook` calls in order"
        require_equal(order, want_order, reason="pre-backward-order", what=what)
        seen.setdefault("calls", calls)
        seen.setdefault("past_guard", {unit: sum(flags) for unit, flags in got_passed.items()})
        seen.setdefault("order", order)
    seen["iterations"] = iterations
    return seen


# -- claim: registered on the outputs that require grad --------------------------------------------------------------
def _hook_marks(tensor: torch.Tensor, unit: FSDP, all_units: dict[str, FSDP]) -> str:
    """``hooked`` when the tensor carries exactly one `_pre_backward_hook`, bound to ``unit`` and its handle;
    ``none`` without one; otherwise what it carries."""
    hooks = [
        h
        for h in (tensor._backward_hooks or {}).values()
        if isinstance(h, functools.partial) and getattr(h.func, "__name__", "") == "_pre_backward_hook"
    ]
    if not hooks:
        return "none"
    owners = sorted({next((n for n, u in all_units.items() if u is h.args[0]), "?") for h in hooks})
    own = all(h.args[0] is unit and h.args[2] is unit._handle for h in hooks)
    if len(hooks) == 1 and own:
        return "hooked"
    return f"hooked {len(hooks)}× by {', '.join(owners)}"


def hooks_on_grad_outputs(ctx: RankContext, expected: list[str]) -> dict[str, Any]:
    """After forward, exactly the unit outputs that require grad carry one pre-backward hook bound to their unit
    (``expected``: per unit, per output, ``hooked`` or ``none``, from the model's structure); a unit with none
    such has ``_needs_pre_backward_unshard`` False and gets no pre-backward call in backward."""
    want = {line.split()[0]: line.split()[1:] for line in expected}
    model = fan_out(ctx)
    all_units = units(model)
    outputs = model(fan_out_batch(ctx))
    produced = {**model.module.outputs, ROOT: outputs}
    hooked = {unit: [_hook_marks(t, all_units[unit], all_units) for t in produced[unit]] for unit in want}
    requires_grad = {unit: [t.requires_grad for t in produced[unit]] for unit in want}
    require_equal(hooked, want, reason="hooked-outputs", what="pre-backward hooks on each unit's outputs")
    follows_rule = {unit: [mark == "hooked" for mark in marks] for unit, marks in hooked.items()}
    require_equal(
        follows_rule, requires_grad, reason="hooked-not-requires-grad", what="hooked outputs vs requires_grad"
    )
    needs = {unit: all_units[unit]._handle._needs_pre_backward_unshard for unit in want}
    want_needs = {unit: "hooked" in marks for unit, marks in want.items()}
    require_equal(needs, want_needs, reason="needs-unshard-flag", what="`_needs_pre_backward_unshard` after forward")
    with observe_backward(model) as log:
        _loss(outputs).backward()
    called = sorted({call.unit for call in log.calls})
    want_called = sorted(unit for unit, marks in want.items() if "hooked" in marks)
    require_equal(called, want_called, reason="pre-backward-units", what="units whose pre-backward hook ran")
    return {
        "hooked": hooked,
        "requires_grad": requires_grad,
        "needs_pre_backward_unshard": needs,
        "units_with_pre_backward": called,
    }


# -- claim: the root queues the final callback once ------------------------------------------------------------------
ROOT_OUTPUTS = 2  # FanOut returns two tensors that require grad, both in the loss


def final_callback_queued_once(ctx: RankContext) -> dict[str, Any]:
    """For a root with parameters and one without: its pre-backward hook runs once per output (two), yet autograd's
    ``queue_callback`` is called once and the final callback runs once; the root's ``_post_backward_callback_queued``
    is False after forward, True when the callback starts and False again after backward; only the root has it."""
    seen: dict[str, Any] = {}
    for label, head in (("with parameters", True), ("without parameters", False)):
        model = fan_out(ctx, head=head)
        require_equal(model._handle is not None, head, reason="root-handle", what=f"root {label}: has a handle")
        loss = _loss(model(fan_out_batch(ctx)))
        after_forward = model._post_backward_callback_queued
        on_non_root = sorted(
            u for u, m in units(model).items() if u != ROOT and hasattr(m, "_post_backward_callback_queued")
        )
        with observe_backward(model) as log:
            loss.backward()
        after_backward = model._post_backward_callback_queued
        root_calls = [call for call in log.calls if call.unit == ROOT]
        observed = {
            "root_calls": len(root_calls),
            "past_guard": sum(call.passed for call in root_calls),
            "queue_callback": log.queue_callbacks,
            "final_callback_runs": len(log.final_callbacks),
            "registrations": [(r["before"], r["after"]) for r in log.registrations],
            "flag": {
                "after forward": after_forward,
                "in callback": log.final_callbacks,
                "after backward": after_backward,
            },
        }
        what = f"root {label}"
        require_equal(
            observed["root_calls"],
            ROOT_OUTPUTS,
            reason="root-pre-backward-calls",
            what=f"{what}: the root's `_pre_backward_hook` calls",
            variant=label,
        )
        require_equal(
            log.queue_callbacks,
            1,
            reason="queue-callback-calls",
            what=f"{what}: `queue_callback` calls in one backward",
            variant=label,
            final_callback_runs=len(log.final_callbacks),
        )
        require_equal(
            len(log.final_callbacks),
            1,
            reason="final-callback-runs",
            what=f"{what}: final callback runs",
            variant=label,
            queue_callback=log.queue_callbacks,
        )
        require_equal(
            observed["registrations"],
            [(False, True)],
            reason="registrations",
            what=f"{what}: `_register_post_backward_final_callback` calls, (flag on entry, flag on return)",
            variant=label,
        )
        require_equal(
            observed["flag"],
            {"after forward": False, "in callback": [True], "after backward": False},
            reason="queued-flag",
            what=f"{what}: `_post_backward_callback_queued`",
            variant=label,
        )
        require_equal(on_non_root, [], reason="flag-off-root", what=f"{what}: non-root units with the flag")
        seen[label] = observed
    return seen


def no_callback_without_root_output(ctx: RankContext) -> dict[str, Any]:
    """A backward from ``pair``'s second output alone reaches none of the root's outputs: only ``pair``'s hook runs
    (once: its first output is not in the loss), ``queue_callback`` is never called, no final callback runs, and
    ``pair`` is left in ``FORWARD_BACKWARD`` with nothing to reset it."""
    model = fan_out(ctx)
    model(fan_out_batch(ctx))
    b = model.module.outputs["pair"][1]
    with observe_backward(model) as log:
        b.sum().backward()
    all_units = units(model)
    passed = log.per_unit("passed")
    calls = {unit: len(passed.get(unit, [])) for unit in all_units}
    want_calls = {unit: int(unit == "pair") for unit in all_units}
    require_equal(calls, want_calls, reason="pre-backward-calls", what="`_pre_backward_hook` calls per unit")
    require_equal(
        log.queue_callbacks,
        0,
        reason="queue-callback-calls",
        what="`queue_callback` calls in a backward that reaches no root output",
        final_callback_runs=len(log.final_callbacks),
    )
    require_equal(len(log.final_callbacks), 0, reason="final-callback-runs", what="final callback runs")
    left = {unit: m.training_state.name for unit, m in all_units.items()}
    want_left = {unit: "FORWARD_BACKWARD" if unit == "pair" else "IDLE" for unit in all_units}
    require_equal(left, want_left, reason="left-in-backward", what="training states after backward")
    return {
        "calls": calls,
        "queue_callback": log.queue_callbacks,
        "final_callback_runs": len(log.final_callbacks),
        "training_state": left,
    }


# -- break-it recipes: this guide's behaviour bent on purpose (tests/break_it/ applies them) ------------------------
def hook_twice(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` run twice on the same outputs: every tensor carries two hooks."""
    return original(state, module, original(state, module, outputs, handle), handle)


def hook_every_float_output(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` that ignores ``requires_grad``: every floating-point output is made to
    require grad (torch refuses a hook on a tensor that does not) and gets the hook. Integer tensors cannot."""
    from torch.distributed.utils import _apply_to_tensors

    def force(t: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and not t.requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        return t

    return original(state, module, _apply_to_tensors(force, outputs), handle)


def hook_first_output_only(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` that hooks only the first element of a tuple of outputs."""
    if isinstance(outputs, tuple) and outputs:
        return (original(state, module, outputs[0], handle), *outputs[1:])
    return original(state, module, outputs, handle)


def mark_every_unit_for_unshard(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` that marks the handle as needing a pre-backward unshard even when no
    output was hooked."""
    outputs = original(state, module, outputs, handle)
    if handle and torch.is_grad_enabled():
        handle._needs_pre_backward_unshard = True
    return outputs


def without_guard(original: Any, state: Any, module: Any, handle: Any, *args: Any) -> Any:
    """``_pre_backward_hook`` with its ``_ran_pre_backward_hook`` guard dropped: every call finds it False. The
    state check behind it then refuses the second call (``expected to be in states [IDLE]``)."""
    if handle:
        handle._ran_pre_backward_hook = False
    return original(state, module, handle, *args)


def without_guard_or_state_check(original: Any, state: Any, module: Any, handle: Any, *args: Any) -> Any:
    """``_pre_backward_hook`` with the guard dropped and the unit's training state put back to IDLE before every
    call, so the state check passes too and each call does the work again."""
    from torch.distributed.fsdp._common_utils import TrainingState

    if handle:
        handle._ran_pre_backward_hook = False
        state.training_state = TrainingState.IDLE
    return original(state, module, handle, *args)


def queue_twice(original: Any, state: Any, module: Any) -> None:
    """``_register_post_backward_final_callback`` that forgets it queued and queues a second time."""
    original(state, module)
    state._post_backward_callback_queued = False
    original(state, module)


def root_forgets_it_queued(
    original: Any, state: Any, module: Any, handle: Any, *args: Any, without_handle_only: bool = False
) -> Any:
    """``_pre_backward_hook`` with the root's ``_post_backward_callback_queued`` cleared before every call (only
    for a root without a handle, with ``without_handle_only``)."""
    if state._is_root and not (without_handle_only and handle):
        state._post_backward_callback_queued = False
    return original(state, module, handle, *args)


_ROOT: list[tuple[Any, Any]] = []  # (state, module) of the root whose hooks `remember_root` saw registered last


def remember_root(original: Any, state: Any, module: Any, outputs: Any, handle: Any) -> Any:
    """``_register_pre_backward_hooks`` unchanged, except that it remembers the root for `any_unit_queues`."""
    if state._is_root:
        _ROOT[:] = [(state, module)]
    return original(state, module, outputs, handle)


def any_unit_queues(original: Any, state: Any, module: Any, handle: Any, *args: Any) -> Any:
    """``_pre_backward_hook`` that queues the root's final callback from whichever unit's hook runs first."""
    from torch.distributed.fsdp import _runtime_utils

    if not state._is_root and _ROOT:
        root_state, root_module = _ROOT[0]
        if not root_state._post_backward_callback_queued:
            _runtime_utils._register_post_backward_final_callback(root_state, root_module)
    return original(state, module, handle, *args)


# -- exercises: recipes above as puzzles (fsdp-readings exercise 07-pre-backward) ------------------------------------
EXERCISES = (
    Exercise(
        "hook-every-output",
        claim="hooked-where-grad-is-required",
        patches=(wrapping(f"{RU}:_register_pre_backward_hooks", hook_every_float_output),),
        puzzle="Every floating-point output is made to require grad and gets the pre-backward hook.",
        reason="hooked-outputs",
    ),
    Exercise(
        "no-guard-no-state-check",
        claim="once-per-handle-per-backward",
        patches=(wrapping(f"{RU}:_pre_backward_hook", without_guard_or_state_check),),
        puzzle="Each call of `_pre_backward_hook` finds the guard open and its unit IDLE. Nothing raises.",
        reason="pre-backward-work",
    ),
    Exercise(
        "a-child-queues",
        claim="no-callback-without-root-output",
        patches=(
            wrapping(f"{RU}:_register_pre_backward_hooks", remember_root),
            wrapping(f"{RU}:_pre_backward_hook", any_unit_queues),
        ),
        puzzle="Whichever unit's pre-backward hook runs first queues the root's final callback, not only the root's.",
        reason="queue-callback-calls",
    ),
)
