"""Resolve ``"module:qualname"`` strings to live objects, rank-side (where importing torch is the point)."""

from __future__ import annotations

import importlib
import inspect
import types
from typing import Any

from checks.ranks import codeswap


def split(symbol: str) -> tuple[str, str]:
    module, sep, qualname = symbol.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"{symbol!r} is not of the form 'package.module:Qualified.name'")
    return module, qualname


def resolve(symbol: str) -> tuple[Any, Any, str]:
    """Return ``(owner, value, attribute)`` so that ``getattr(owner, attribute) is value``."""
    module_name, qualname = split(symbol)
    owner: Any = importlib.import_module(module_name)
    *path, attribute = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    # Read through the class __dict__ so staticmethod/classmethod/property wrappers come back as they are stored.
    value = (
        vars(owner)[attribute] if isinstance(owner, type) and attribute in vars(owner) else getattr(owner, attribute)
    )
    return owner, value, attribute


def load(symbol: str) -> Any:
    """The object a symbol names, as attribute access would give it (e.g. a check function)."""
    owner, _, attribute = resolve(symbol)
    return getattr(owner, attribute)


def functions(symbol: str) -> list[types.FunctionType]:
    """Every Python function whose running counts as "this symbol ran": the function itself, a class's methods, a
    property's accessors; decorators are unwrapped. Module-level data and builtins have none."""
    _, value, _ = resolve(symbol)
    return _functions_of(value, set())


def code_objects(symbol: str) -> list[types.CodeType]:
    """The code objects of `functions` (each function's own, while runtime evidence runs a marked copy of it)."""
    return [codeswap.original(function.__code__) for function in functions(symbol)]


def _functions_of(value: Any, seen: set[int]) -> list[types.FunctionType]:
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, staticmethod | classmethod):
        return _functions_of(value.__func__, seen)
    if isinstance(value, property):
        return [f for a in (value.fget, value.fset, value.fdel) if a is not None for f in _functions_of(a, seen)]
    if isinstance(value, type):
        return [f for member in vars(value).values() for f in _functions_of(member, seen)]
    if callable(value):
        function = inspect.unwrap(value)
        if isinstance(function, types.MethodType):
            function = function.__func__
        return [function] if isinstance(function, types.FunctionType) else []
    return []
