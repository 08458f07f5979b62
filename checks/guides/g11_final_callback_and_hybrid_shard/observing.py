"""The torch functions guide 11's checks observe (and its break-it tests bend), by symbol, and the observer that
watches them run unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from checks.probes import calls
from checks.workloads.gpt import units

RU = "torch.distributed.fsdp._runtime_utils"
FINAL_CALLBACK = f"{RU}:_post_backward_final_callback"
CATCH_ALL = f"{RU}:_catch_all_reshard"
FINALIZE = f"{RU}:_finalize_params"


@contextmanager
def observing(hooks: dict[str, calls.CallHook]) -> Iterator[None]:
    """Observe torch functions by symbol (their code runs unchanged); a hook that failed fails the check."""
    with calls.subscribed({calls.function_code(symbol): hook for symbol, hook in hooks.items()}) as subscription:
        yield
    if subscription.errors:
        raise RuntimeError(f"the observer failed: {subscription.errors[0]!r}")


def unit_names(model: nn.Module) -> dict[int, str]:
    return {id(unit): name for name, unit in units(model).items()}
