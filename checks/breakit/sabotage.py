"""Factories for `Patch`: how break-it tests bend torch. Each takes the original and returns its replacement."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from checks.ranks.symbols import load


def returns(original: Callable[..., Any], value: Any = None) -> Callable[..., Any]:
    """Skip the original entirely and return ``value``."""

    @functools.wraps(original)
    def replacement(*args: Any, **kwargs: Any) -> Any:
        return value

    return replacement


def noop(original: Callable[..., Any]) -> Callable[..., None]:
    """Skip the original (for functions called for their side effects)."""
    return returns(original, None)


def raises(original: Callable[..., Any], message: str = "sabotaged") -> Callable[..., Any]:
    @functools.wraps(original)
    def replacement(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(message)

    return replacement


def replaced_by(original: Any, symbol: str) -> Any:
    """Use the object another symbol names (a value, an enum member, a function)."""
    return load(symbol)


def wrapped_by(original: Callable[..., Any], wrapper: str, **params: Any) -> Callable[..., Any]:
    """``wrapper(original, *args, **kwargs)`` decides what to do with each call (``params`` bound as kwargs)."""
    around = load(wrapper)

    @functools.wraps(original)
    def replacement(*args: Any, **kwargs: Any) -> Any:
        return around(original, *args, **params, **kwargs)

    return replacement


def value(original: Any, value: Any) -> Any:
    """Replace a module-level value (a constant, a tuple of strategies) with ``value``."""
    return value
