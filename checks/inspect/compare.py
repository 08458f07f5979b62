"""Prediction against measurement, one row per thing compared: `checks.inspect.predict` on one side, what
`checks.inspect.measure` recorded on the ranks on the other. A row that differs is a finding, about torch or
about the models; the report shows it, never drops it. Torch-free."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checks.naming import ROOT

MEMORY = ("params", "grads", "optim")


@dataclass(frozen=True)
class Row:
    section: str
    item: str
    predicted: Any
    measured: Any
    note: str = ""

    @property
    def agrees(self) -> bool:
        return self.predicted == self.measured

    def as_json(self) -> dict[str, Any]:
        return {"section": self.section, "item": self.item, "predicted": self.predicted, "measured": self.measured,
                "agrees": self.agrees, "note": self.note}  # fmt: skip


def units(predicted: Sequence[Mapping[str, Any]], measured: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    """Each unit's flattened parameters (name, elements), in flattening order; a unit on one side only too."""
    want = {u["name"]: u for u in predicted}
    names = [*want, *(n for n in measured if n not in want)]

    def held(unit: Mapping[str, Any] | None) -> str:
        if unit is None:
            return "no such unit"
        params = [tuple(p) for p in unit["params"]]
        return f"{unit['type']}: {sum(n for _, n in params):,} in {len(params)} parameter{'s' * (len(params) != 1)}"

    rows = []
    for name in names:
        p, m = want.get(name), measured.get(name)
        same = p is not None and m is not None and [tuple(x) for x in p["params"]] == [tuple(x) for x in m["params"]]
        rows.append(Row("units", name, held(p), held(m) if same or m is None else f"{held(m)} (other parameters)"))
    return rows


def layout(predicted: Mapping[str, Mapping[str, int]], measured: Mapping[str, Mapping[str, int]]) -> list[Row]:
    """Each flat parameter's padded size, shard and padding, in elements."""

    def text(entry: Mapping[str, int] | None) -> str:
        if entry is None:
            return "no flat parameter"
        return f"{entry['padded']:,} = {entry['numel']:,} + {entry['padding']:,} padding; shard {entry['shard']:,}"

    names = [*predicted, *(n for n in measured if n not in predicted)]
    return [Row("layout", name, text(predicted.get(name)), text(measured.get(name))) for name in names]


def memory(predicted: Sequence[Mapping[str, int]], measured: Sequence[Mapping[str, int]], buffers: int) -> list[Row]:
    """Bytes each rank holds after a step, gradients kept: the model's categories, no unsharded parameters, and
    every buffer whole on every rank (FSDP1 does not shard buffers)."""
    rows = []
    for rank, (want, seen) in enumerate(zip(predicted, measured, strict=True)):
        for category in MEMORY:
            rows.append(Row("memory", f"rank {rank} {category}", want[category], seen[category]))
        rows.append(Row("memory", f"rank {rank} unsharded", 0, seen["unsharded"]))
        rows.append(Row("memory", f"rank {rank} buffers", buffers, seen["buffers"]))
    return rows


def collectives(predicted: Sequence[Mapping[str, Any]], measured: Sequence[Mapping[str, Any]]) -> list[Row]:
    """A steady step's collectives by kind and phase: how many, and their elements in all."""

    def tally(ops: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[int, int]]:
        count: Counter[tuple[str, str]] = Counter()
        numel: Counter[tuple[str, str]] = Counter()
        for op in ops:
            key = (op["op"], "backward" if op["backward"] else "forward")
            count[key] += 1
            numel[key] += op["numel"]
        return {key: (count[key], numel[key]) for key in count}

    want, seen = tally(predicted), tally(measured)
    keys = [*want, *(k for k in seen if k not in want)]
    rows = []
    for key in keys:
        (c_want, n_want), (c_seen, n_seen) = want.get(key, (0, 0)), seen.get(key, (0, 0))
        rows.append(Row("collectives", f"{key[0]} in {key[1]}", f"{c_want}, {n_want:,} elements",
                        f"{c_seen}, {n_seen:,} elements"))  # fmt: skip
    sizes = Row(
        "collectives",
        "every payload (op, elements, phase)",
        "the model's",
        "the model's"
        if Counter(_key(o) for o in predicted) == Counter(_key(o) for o in measured)
        else "other payloads",
    )
    return [*rows, sizes]


def _key(op: Mapping[str, Any]) -> tuple[str, int, bool]:
    return (op["op"], op["numel"], bool(op["backward"]))


def prefetch(predicted: Mapping[str, Any], measured: Mapping[str, Mapping[str, Any]],
             repredict: Callable[[list[str], str], list[str]]) -> list[Row]:  # fmt: skip
    """Torch's post-forward order against the assumed one, then each mode's backward hooks (FSDP2: its implicit
    prefetches). When torch ran the units in another order, each mode is also predicted from torch's order
    (``repredict``), so that an order the model did not know is not mistaken for a prefetch rule it got wrong."""
    assumed = list(predicted["post_forward"])
    first = measured[predicted["modes"][0]]
    rows = [Row("prefetch", "post-forward order", " ".join(assumed),
                " ".join(u for u in first["post_forward"] if u != ROOT))]  # fmt: skip
    for mode in predicted["modes"]:
        seen = measured[mode]
        order = [u for u in seen["post_forward"] if u != ROOT]
        want, note = predicted["prefetch"][mode], ""
        if order != assumed:
            want, note = repredict(order, mode), f"torch ran the units in another order: {' '.join(order)}"
        rows.append(Row("prefetch", f"{mode} prefetches", _pairs(want), _pairs(seen["hooks"]), note))
        rows.append(Row("prefetch", f"{mode} hooks in order", "the model's", "the model's" if want == seen["hooks"]
                        else "other hooks"))  # fmt: skip
    return rows


def _pairs(hooks: Sequence[str]) -> str:
    found = [h.removeprefix("prefetch ") for h in hooks if h.startswith("prefetch ")]
    return " ".join(found) if found else "none"


def gradients(measured: Mapping[str, Any], world_size: int) -> list[Row]:
    """FSDP1's reduced gradients against DDP's. On two ranks each element is a sum of two terms, and FSDP1's
    pre- and post-division by powers of two are exact: bitwise. On more ranks the two reductions may add in
    other orders, so the prediction is DDP's up to summation order, and the row says by how many ulps."""
    total, bitwise = measured["parameters"], measured["bitwise"]
    seen = "bitwise" if bitwise == total and not measured["missing"] else f"{bitwise} of {total} bitwise"
    if measured["missing"]:
        seen += f"; missing on one side: {', '.join(measured['missing'])}"
    if world_size == 2:
        return [Row("gradients", f"{total} parameters against DDP", "bitwise", seen)]
    worst = measured["worst_ulps"]
    note = (f"worst {worst} ulps, in {measured['worst_parameter']}; largest difference {measured['largest_abs']:.3g} "
            "(ulps are many where a value is near zero)" if worst else "")  # fmt: skip
    want = "bitwise, or DDP's up to summation order"
    return [Row("gradients", f"{total} parameters against DDP", want, want if not measured["missing"] else seen, note)]
