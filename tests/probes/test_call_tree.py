"""The call-tree recorder (`checks.probes.call_tree`): observed calls nested as they called each other, what
``look`` read at entry, a call that raised popped as it unwound, and an optional symbol this code lacks left
out."""

from __future__ import annotations

import contextlib
import types

import pytest

from checks.probes.call_tree import Call, record_call_tree

HERE = "tests.probes.test_call_tree"


def leaf(n: int) -> int:
    return n + 1


def middle(n: int) -> int:
    return leaf(n) + leaf(n + 1)


def failing(n: int) -> int:
    leaf(n)
    raise ValueError(n)


def outer(n: int) -> int:
    with contextlib.suppress(ValueError):
        failing(n)
    return middle(n)


def shape(calls: list[Call]) -> list[tuple[str, dict, list]]:
    return [(c.name, c.seen, shape(c.calls)) for c in calls]


def look(name: str, frame: types.FrameType) -> dict[str, object]:
    return {"n": frame.f_locals["n"]}


def test_calls_nest_as_they_ran_and_a_raise_unwinds() -> None:
    symbols = [f"{HERE}:{name}" for name in ("outer", "middle", "leaf", "failing")]
    with record_call_tree(symbols, look, optional=[f"{HERE}:not_here"]) as roots:
        outer(1)
        leaf(7)
    assert shape(roots) == [
        ("outer", {"n": 1}, [
            ("failing", {"n": 1}, [("leaf", {"n": 1}, [])]),
            ("middle", {"n": 1}, [("leaf", {"n": 1}, []), ("leaf", {"n": 2}, [])]),
        ]),
        ("leaf", {"n": 7}, []),
    ]  # fmt: skip
    assert roots[0].made("leaf") and not roots[1].made("leaf")
    assert [c.name for c in roots[0].walk()] == ["outer", "failing", "leaf", "middle", "leaf", "leaf"]


def test_nothing_is_recorded_outside_the_block_and_a_missing_symbol_fails() -> None:
    with record_call_tree([f"{HERE}:leaf"]) as roots:
        pass
    leaf(1)
    assert roots == []
    with pytest.raises(AttributeError), record_call_tree([f"{HERE}:not_here"]):
        pass
