"""Sabotage torch inside the ranks for one check, then put it back.

A break-it test names a torch attribute and a factory; the replacement goes wherever the original object is
reachable by name: its defining module or class, and every loaded module that imported it with
``from x import y``. Patching only the defining module would miss those copies and let a claim pass for the wrong
reason.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from checks.ranks.protocol import Patch
from checks.ranks.symbols import load, resolve


@contextmanager
def applied(patches: tuple[Patch, ...]) -> Iterator[None]:
    undo: list[tuple[Any, str, Any]] = []
    try:
        for patch in patches:
            owner, stored, attribute = resolve(patch.target)
            original = getattr(owner, attribute)
            replacement = load(patch.factory)(original, **patch.params)
            for holder, name in _holders(owner, attribute, stored, original):
                undo.append((holder, name, vars(holder)[name]))
                setattr(holder, name, replacement)
        yield
    finally:
        for holder, name, value in reversed(undo):
            setattr(holder, name, value)


def _holders(owner: Any, attribute: str, stored: Any, original: Any) -> list[tuple[Any, str]]:
    holders = [(owner, attribute)]
    if isinstance(owner, type):
        return holders  # a method is looked up through its class only
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if module is owner or not isinstance(namespace, dict):
            continue
        holders.extend((module, name) for name, value in list(namespace.items()) if value is original)
    return holders
