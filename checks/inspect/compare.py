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
    """FSDP's and DDP's reduced gradients against the values they may take: every element one of the fp32 sums of
    the ranks' own gradients (in any order and grouping) over N (`checks.inspect.measure.gradients_against_ddp`).
    On two ranks there is one such sum, so FSDP's gradient is DDP's, bitwise; on four, the two reductions may add
    in other orders, and the note says how far apart they are."""
    if measured["missing"]:
        return [Row("gradients", "parameters with a gradient", "the same on every side",
                    f"not on every side: {', '.join(measured['missing'])}")]  # fmt: skip
    sums = measured["sums"]
    scope = f"{measured['elements']:,} elements, {sums} possible sum{'s' * (sums != 1)} each"
    total, bitwise, worst = measured["parameters"], measured["bitwise"], measured["worst_ulps"]
    apart = f"{bitwise} of {total} parameters bitwise equal to DDP's" + (
        f"; worst {worst} ulps, in {measured['worst_parameter']}" if worst else "")  # fmt: skip
    rows = [Row("gradients", f"{name}: elements not a sum of the ranks' gradients / N", 0, measured["outside"][label],
                scope if label == "fsdp" or world_size == 2 else f"{scope}; {apart}")
            for label, name in (("fsdp", "FSDP"), ("ddp", "DDP"))]  # fmt: skip
    if world_size == 2:  # one sum: FSDP's gradient is DDP's, bitwise
        rows.append(Row("gradients", "parameters bitwise equal to DDP's", total, bitwise))
    return rows
