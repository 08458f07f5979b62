"""Prediction against measurement, one row per thing compared: `checks.inspect.predict` on one side, what
`checks.inspect.measure` recorded on the ranks on the other. A row that differs is a finding, about torch or
about the models; the report shows it, never drops it. Torch-free."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checks.inspect.predict import DDP, label, prefetch_hooks, with_ready_order
from checks.models import ddp_buckets as db
from checks.naming import ROOT

MEMORY = ("params", "grads", "optim")


# What a differing row says is wrong, where the tool can tell. A model's prediction against torch's run cannot
# tell which of the two is wrong; a gradient against DDP's values, measured independently, can.
PREDICTION_OR_TORCH = "prediction or torch"  # the torch-free model and the measured run disagree
STRATEGY = "strategy"  # the strategy's training differs from DDP's (gradients, which parameters have one)
MEASUREMENT = "measurement"  # the tool's own reference (DDP against the ranks' local gradients) is off
CULPRITS = {
    PREDICTION_OR_TORCH: "the model's prediction and torch's run disagree: a finding about either",
    STRATEGY: "the strategy trains differently from DDP: a finding about torch or the model under it",
    MEASUREMENT: "the comparison's own reference is off: a finding about how inspect measured",
}


@dataclass(frozen=True)
class Row:
    section: str
    item: str
    predicted: Any
    measured: Any
    note: str = ""
    culprit: str = PREDICTION_OR_TORCH  # what differs when the row does (`CULPRITS`)

    @property
    def agrees(self) -> bool:
        return self.predicted == self.measured

    def as_json(self) -> dict[str, Any]:
        return {"section": self.section, "item": self.item, "predicted": self.predicted, "measured": self.measured,
                "agrees": self.agrees, "note": self.note,
                **({} if self.agrees else {"differs": self.culprit})}  # fmt: skip


def report(
    prediction: Mapping[str, Any],
    measured: Sequence[Mapping[str, Any]],
    *,
    strategy: str,
    world_size: int,
    shapes: Mapping[str, tuple[int, ...]],
    buffers: Sequence[db.Param],
) -> list[Row]:
    """Every row of a run's report: `checks.inspect.predict.predict`'s ``prediction`` against each rank's
    measurements (``measured``, rank 0 first), section by section; ``buffers``: the model's, as DDP broadcasts
    them. Torch's own orders are inputs where a model
    takes them: the post-forward order (FSDP's prefetches) and the gradient-ready order (DDP's buckets)."""
    first = measured[0]
    if strategy in DDP:
        prediction = with_ready_order(dict(prediction), shapes, buffers, first["ready"])

    def repredict(order: list[str], mode: str) -> list[str]:
        return prefetch_hooks(strategy, order, None if mode == "None" else mode, prediction["root_params"],
                              parents=prediction.get("parents"),
                              output_units=prediction.get("output_units", ()))  # fmt: skip

    sizes = dict(zip(prediction.get("parameters", ()), prediction.get("sizes", ()), strict=True))
    return [
        *units(prediction["units"], first["units"]),
        *layout(prediction["layout"], first["layout"]),
        *(buckets(prediction, first) if strategy in DDP else []),
        *(partition(prediction["partition"], first["partition"], sizes) if strategy == "torch-zero" else []),
        *memory(prediction["memory"], [m["memory"] for m in measured], sum(b.nbytes for b in buffers)),
        *collectives(prediction["collectives"], first["collectives"]),
        *prefetch(prediction, first["prefetch"], repredict),
        *gradients(first["gradients"], world_size, None if strategy == "ddp" else label(strategy)),
    ]


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
            key = (op["op"], "the optimizer's step" if op["phase"] == "step" else op["phase"])
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
    return (op["op"], op["numel"], op["phase"])


def prefetch(predicted: Mapping[str, Any], measured: Mapping[str, Mapping[str, Any]],
             repredict: Callable[[list[str], str], list[str]]) -> list[Row]:  # fmt: skip
    """Torch's post-forward order against the assumed one, then each mode's backward hooks (FSDP2: its implicit
    prefetches). When torch ran the units in another order, each mode is also predicted from torch's order
    (``repredict``), so that an order the model did not know is not mistaken for a prefetch rule it got wrong."""
    if not predicted["modes"]:  # DDP: no units, nothing to prefetch
        return []
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


SAME = "DDP's values, up to the order of fp32 sums"
SHRINK = 2.0**-20  # float64 rounding is 2^-29 of fp32's: a summation-order difference shrinks at least this much


def gradients(measured: Mapping[str, Any], world_size: int, sharded: str | None = "FSDP") -> list[Row]:
    """The reduced gradients of DDP and of the strategy inspected (``sharded``: FSDP, or DDP +
    ZeroRedundancyOptimizer; None when it is DDP) against what they may be
    (`checks.inspect.measure.gradients_against_ddp`). DDP's: every element one of the fp32 sums of the ranks' own
    gradients (in any order and grouping) over N. The strategy's: DDP's values, bit for bit or up to the order
    of fp32 additions. It is when every element is one of those sums, or when the rerun in float64 brings the two
    at least 2^20 times closer (the rounding of float64 is 2^29 times smaller; different values do not move).
    The note gives how far apart they are: elements, largest absolute and relative difference, ulps."""
    if measured["missing"]:
        return [Row("gradients", "parameters with a gradient", "the same on every side",
                    f"not on every side: {', '.join(measured['missing'])}", culprit=STRATEGY)]  # fmt: skip
    sums = measured["sums"]
    scope = f"{measured['elements']:,} elements, {sums} possible sum{'s' * (sums != 1)} each"
    rows = [Row("gradients", "DDP: elements not a sum of the ranks' gradients / N", 0, measured["outside"]["ddp"],
                scope, culprit=MEASUREMENT)]  # fmt: skip
    if sharded:
        verdict, note = _against_ddp(measured)
        rows.append(Row("gradients", f"{sharded} against DDP", SAME, verdict, note, culprit=STRATEGY))
    return rows


def _against_ddp(measured: Mapping[str, Any]) -> tuple[str, str]:
    """The strategy's gradient against DDP's: `SAME` or ``different values``, and a note saying how far apart."""
    apart = measured["apart"]
    total, bitwise = measured["parameters"], measured["bitwise"]
    if not apart["elements"]:
        return SAME, f"bitwise: all {total} parameters"
    size = (f"{apart['elements']:,} elements differ, in {total - bitwise} of {total} parameters; largest "
            f"{apart['max_abs']:.2g}, in {apart['parameter']}; at most {apart['max_rel']:.2g} of a parameter's "
            f"largest gradient (about {apart['ulps']:.3g} ulps of it)")  # fmt: skip
    if measured["outside"]["sharded"] == 0:
        return SAME, f"{size}; each one of the fp32 sums of the ranks' gradients / N"
    in64 = apart["float64"]
    if in64 is not None and in64 <= apart["max_abs"] * SHRINK:
        return SAME, f"{size}; {in64:.2g} in float64: summation order"
    where = "no float64 rerun" if in64 is None else f"{in64:.2g} in float64, as far apart"
    return "different values", f"{size}; {where}"


def buckets(predicted: Mapping[str, Any], measured: Mapping[str, Any]) -> list[Row]:
    """The reducer's buckets from the second step on, against the bucket model's over the gradient-ready order
    torch recorded in the first step (an input, as FSDP's post-forward order is: `checks.inspect.predict`):
    elements and parameters per bucket, and which parameters, in order."""
    sizes, note = predicted["sizes"], "over torch's gradient-ready order"

    def held(bucket: Sequence[int] | None) -> str:
        if bucket is None:
            return "no such bucket"
        count = len(bucket)
        return f"{sum(sizes[i] for i in bucket):,} elements in {count} parameter{'s' * (count != 1)}"

    want, got = predicted["buckets"], measured["buckets"]
    rows = []
    for index in range(max(len(want), len(got))):
        p = want[index] if index < len(want) else None
        m = got[index] if index < len(got) else None
        rows.append(Row("buckets", f"bucket {index}", held(p), held(m), note if index == 0 else ""))
    same = [list(b) for b in want] == [list(b) for b in got]
    rows.append(Row("buckets", "parameters in each bucket, in order", "the model's", "the model's" if same
                    else "other parameters"))  # fmt: skip
    return rows


def partition(predicted: Sequence[Sequence[str]], measured: Sequence[Sequence[str]],
              sizes: Mapping[str, int]) -> list[Row]:  # fmt: skip
    """ZeroRedundancyOptimizer's parameters per rank: how many and their elements (the state each rank keeps),
    and whether they are the greedy rule's."""

    def held(names: Sequence[str]) -> str:
        return f"{sum(sizes[n] for n in names):,} elements in {len(names)} parameter{'s' * (len(names) != 1)}"

    rows = [Row("partition", f"rank {rank} updates", held(want), held(got))
            for rank, (want, got) in enumerate(zip(predicted, measured, strict=True))]  # fmt: skip
    same = [sorted(r) for r in predicted] == [sorted(r) for r in measured]
    rows.append(Row("partition", "which parameters", "the greedy rule's", "the greedy rule's" if same else "others"))
    return rows
