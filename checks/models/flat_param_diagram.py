"""A text picture of one flat parameter across ranks: parameters, alignment padding, world-size padding, shards.

Two functions, both torch-free. :func:`layout_fields` turns what a ``FlatParameter`` carries (``_fqns``,
``_shapes``, ``_numels_with_padding``, ``_is_padding_mask``, ``_sharded_size``, the group's size) into plain
data: the segments of the unsharded flat parameter, each with its kind, offset and length, and each rank's shard
range. A check reads those fields off a real ``FlatParameter`` in a rank and returns the dict (key ``layout``);
:func:`fields_from_spec` makes the same dict from the spec (`checks.models.flat_param`). :func:`diagram_lines`
draws the dict in at most ``width`` columns: a bar with one letter per parameter, ``.`` for alignment padding,
``~`` for world-size padding inside the flat parameter and ``_`` for the padding sharding adds beyond it
(``use_orig_params=False``), a ruler with each rank's shard, and one table row per segment with the pieces of it
each rank holds.

Segment kinds: ``param``, ``align`` (padding before a parameter), ``tail`` (a padding segment after the last
parameter: the world-size padding ``use_orig_params=True`` builds in) and ``shard-pad`` (elements past the end of
the flat parameter as built, up to the padded unsharded size: the zeros `_get_shard` appends).
"""

from __future__ import annotations

import string
import textwrap
from collections.abc import Sequence
from typing import Any

from checks.models.flat_param import FlatParamSpec

FILL = {"align": ".", "tail": "~", "shard-pad": "_"}
LABELS = string.ascii_uppercase + string.ascii_lowercase + string.digits
SHORT = {"align": "alignment", "tail": "world-size padding", "shard-pad": "shard padding"}
WHAT = {"align": "alignment padding", "tail": "world-size padding", "shard-pad": "shard padding (added by sharding)"}


def layout_fields(
    *,
    fqns: Sequence[str],
    shapes: Sequence[Sequence[int]],
    numels_with_padding: Sequence[int],
    is_padding_mask: Sequence[bool],
    world_size: int,
    shard_numel: int,
    sharded: bool = True,
    shared: Sequence[tuple[str, str]] = (),
    title: str = "",
) -> dict[str, Any]:
    """The layout as plain data, from the fields a ``FlatParameter`` carries (``shard_numel``: ``_sharded_size``;
    ``shared``: ``(fqn, primary fqn)`` of each tied parameter, from ``_shared_param_infos``)."""
    if len(numels_with_padding) != len(is_padding_mask):
        raise ValueError("numels_with_padding and is_padding_mask differ in length")
    if sum(not pad for pad in is_padding_mask) != len(fqns) or len(fqns) != len(shapes):
        raise ValueError("one fqn and one shape per non-padding segment")
    last_param = max((i for i, pad in enumerate(is_padding_mask) if not pad), default=-1)
    segments: list[dict[str, Any]] = []
    offset = index = 0
    for i, (numel, pad) in enumerate(zip(numels_with_padding, is_padding_mask, strict=True)):
        if pad:
            segments.append({"kind": "tail" if i > last_param else "align", "offset": offset, "numel": int(numel)})
        else:
            segment = {"kind": "param", "fqn": fqns[index], "shape": [int(d) for d in shapes[index]]}
            segments.append({**segment, "offset": offset, "numel": int(numel), "label": LABELS[index % len(LABELS)]})
            index += 1
        offset += int(numel)
    flat_numel = offset
    padded = shard_numel * world_size if sharded else flat_numel
    if padded > flat_numel:
        segments.append({"kind": "shard-pad", "offset": flat_numel, "numel": padded - flat_numel})
    ranks = [
        {"rank": r, "start": r * shard_numel if sharded else 0, "end": (r + 1) * shard_numel if sharded else flat_numel}
        for r in range(world_size)
    ]
    return {
        "title": title,
        "world_size": world_size,
        "sharded": sharded,
        "flat_numel": flat_numel,
        "padded_numel": padded,
        "shard_numel": shard_numel,
        "segments": segments,
        "ranks": ranks,
        "shared": [{"fqn": fqn, "to": prim} for fqn, prim in shared],
    }


def fields_from_spec(spec: FlatParamSpec, title: str = "") -> dict[str, Any]:
    """The same dict, from the spec instead of a real ``FlatParameter``."""
    return layout_fields(
        fqns=spec.fqns,
        shapes=spec.shapes,
        numels_with_padding=spec.numels_with_padding,
        is_padding_mask=spec.is_padding_mask,
        world_size=spec.world_size,
        shard_numel=spec.shard_numel,
        sharded=spec.sharded,
        shared=[(t.fqn, t.prim_fqn) for t in spec.shared],
        title=title,
    )


def _pieces(segment: dict[str, Any], ranks: list[dict[str, Any]]) -> str:
    """Where each rank holds part of ``segment``: ``r0 12+2`` = rank 0, 2 elements from shard offset 12."""
    lo, hi = segment["offset"], segment["offset"] + segment["numel"]
    if lo == hi:  # torch's test over inclusive ends puts a zero-size parameter only where it is strictly inside
        inside = [f"r{r['rank']}" for r in ranks if r["start"] < lo < r["end"]]
        return f"{' '.join(inside)} in shard, 0 elements" if inside else "in no shard"
    out = []
    for rank in ranks:
        first, stop = max(lo, rank["start"]), min(hi, rank["end"])
        if first < stop:
            out.append(f"r{rank['rank']} {first - rank['start']}+{stop - first}")
    return "  ".join(out)


def _bar(fields: dict[str, Any], columns: int) -> tuple[str, str]:
    """The bar and its ruler, ``columns`` characters each (the ruler marks shard starts with ``|``)."""
    total = fields["padded_numel"]
    scale = max(1, -(-total // columns))  # elements per character, rounded up so the bar fits

    def col(element: int) -> int:
        return element // scale

    bar = [" "] * (col(total - 1) + 1 if total else 0)
    for seg in fields["segments"]:
        fill = seg.get("label") or FILL[seg["kind"]]
        for c in range(col(seg["offset"]), col(seg["offset"] + seg["numel"] - 1) + 1 if seg["numel"] else 0):
            if bar[c] == " " or seg["kind"] == "param":
                bar[c] = fill
    ruler = [" "] * len(bar)
    if fields["sharded"]:
        for rank in fields["ranks"]:
            label = f"|r{rank['rank']}"
            start = col(rank["start"])
            for k, ch in enumerate(label):
                if start + k < len(ruler) and (k == 0 or ruler[start + k] == " "):
                    ruler[start + k] = ch
    return "".join(bar), "".join(ruler)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _wrapped(text: str, width: int) -> list[str]:
    """A line of words (the title, the legend) broken at spaces into rows of at most ``width``: it holds no
    columns, and cropping it would drop what a reader needs (a padding count, the ``|rN`` key)."""
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def diagram_lines(fields: dict[str, Any], width: int = 100) -> list[str]:
    """The picture, every line at most ``width`` columns."""
    if width < 40:
        raise ValueError("a diagram needs at least 40 columns")
    segs = fields["segments"]
    params = [s for s in segs if s["kind"] == "param"]
    counts = {kind: sum(s["numel"] for s in segs if s["kind"] == kind) for kind in ("param", *FILL)}
    n, ws = fields["world_size"], fields["shard_numel"]
    head = f"{fields['padded_numel']} elements = {counts['param']} in {len(params)} parameters"
    head += "".join(f" + {counts[k]} {SHORT[k]}" for k in FILL if counts[k])
    head += f"; {n} ranks x {ws}" if fields["sharded"] else f"; NO_SHARD on {n} ranks"
    lines = _wrapped(f"{fields['title']}: {head}" if fields["title"] else head, width)
    total = fields["padded_numel"]
    # No line starts with a blank: a guide's expect block keeps each line from its first visible character, so
    # the bar and the ruler both start at column 0, the ruler's `|` right above the first element of a shard.
    scale = max(1, -(-total // width))
    bar, ruler = _bar(fields, width)
    lines.append(bar)
    lines.append(ruler.rstrip())
    lines += _wrapped(f"1 char = {scale} element{'s' if scale > 1 else ''}  " + _legend(segs), width)
    name_width = min(28, max([len(_name(s)) for s in segs] + [4]))
    lines.append(_clip(f"{'id':2} {'offset':>6} {'numel':>6}  {'segment':<{name_width}}  pieces per rank", width))
    for seg in segs:
        mark = seg.get("label") or FILL[seg["kind"]]
        row = f"{mark:2} {seg['offset']:>6} {seg['numel']:>6}  {_clip(_name(seg), name_width):<{name_width}}  "
        lines.append(_clip((row + _pieces(seg, fields["ranks"])).rstrip(), width))
    for tie in fields.get("shared", []):
        lines.append(_clip(f"{'=':2} {'':>6} {'':>6}  {tie['fqn']} is {tie['to']} (tied): not flattened again", width))
    return lines


def _name(segment: dict[str, Any]) -> str:
    if segment["kind"] == "param":
        return f"{segment['fqn']} {'x'.join(map(str, segment['shape'])) or 'scalar'}"
    return WHAT[segment["kind"]].split(" (")[0]


def _legend(segments: list[dict[str, Any]]) -> str:
    kinds = [k for k in FILL if any(s["kind"] == k for s in segments)]
    parts = ["A.. parameters"] + [f"{FILL[k]} {WHAT[k].split(' (')[0]}" for k in kinds]
    return "  ".join(parts) + "  |rN rank N's shard"
