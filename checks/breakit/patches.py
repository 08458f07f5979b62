"""Build `Patch` requests for break-it tests from Python objects rather than strings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from checks.ranks.protocol import Patch

SABOTAGE = "checks.breakit.sabotage"


def symbol_of(function: Callable[..., Any]) -> str:
    """``module:qualname`` of a module-level function, the form the ranks resolve."""
    qualname = function.__qualname__
    if "<locals>" in qualname:
        raise ValueError(f"{qualname} is local to a function; the ranks can only import module-level recipes")
    return f"{function.__module__}:{qualname}"


def wrapping(target: str, recipe: Callable[..., Any], **params: Any) -> Patch:
    """Wrap the torch attribute ``target``: each call becomes ``recipe(original, *args, **params, **kwargs)``."""
    return Patch(target, f"{SABOTAGE}:wrapped_by", {"wrapper": symbol_of(recipe), **params})


def replacing(target: str, factory: Callable[..., Any], **params: Any) -> Patch:
    """Replace ``target`` by ``factory(original, **params)`` (a recipe that builds the replacement itself)."""
    return Patch(target, symbol_of(factory), params)


def skipping(target: str) -> Patch:
    """Calls of ``target`` do nothing."""
    return Patch(target, f"{SABOTAGE}:noop")


def returning(target: str, value: Any) -> Patch:
    """Calls of ``target`` return ``value`` without running it."""
    return Patch(target, f"{SABOTAGE}:returns", {"value": value})


def set_to(target: str, value: Any) -> Patch:
    """The module-level value ``target`` (a constant, a tuple of strategies) becomes ``value``."""
    return Patch(target, f"{SABOTAGE}:value", {"value": value})
