"""Resolve ``"module:qualname"`` strings to live objects, rank-side (where importing torch is the point)."""

from __future__ import annotations

import importlib
import inspect
import types
from typing import Any


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


def code_objects(symbol: str) -> list[types.CodeType]:
    """Every code object that counts as "this symbol ran": the function's, a class's methods', a property's
    accessors'; decorators are unwrapped. Module-level data has none."""
    _, value, _ = resolve(symbol)
    return _codes_of(value, set())


def _codes_of(value: Any, seen: set[int]) -> list[types.CodeType]:
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, staticmethod | classmethod):
        return _codes_of(value.__func__, seen)
    if isinstance(value, property):
        return [c for f in (value.fget, value.fset, value.fdel) if f is not None for c in _codes_of(f, seen)]
    if isinstance(value, type):
        return [c for member in vars(value).values() for c in _codes_of(member, seen)]
    if callable(value):
        func = inspect.unwrap(value)
        code = getattr(func, "__code__", None)
        return [code] if isinstance(code, types.CodeType) else []
    return []
