"""What ``fsdp-readings estimate`` and ``estimate --recommend`` both read from their command line: the model (a
parameter count, or a module built on the meta device with its units), the links, and the error bad input is.
"""

from __future__ import annotations

import argparse
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from checks.inspect import loading
from checks.models import cost
from checks.models.cost import Link
from checks.models.zero_memory import Param
from checks.naming import ROOT, clean
from reader.format.errors import CommandProblem


class InputError(CommandProblem):
    """Bad input to ``estimate`` (its message says what to give instead): printed by the app, exit 2."""


@dataclass(frozen=True)
class Model:
    params: int | tuple[Param, ...]
    description: str
    config: Any = None  # a mini_gpt GPTConfig: its blocks, width and context are known


def unit_of(name: str, patterns: Sequence[str]) -> str:
    """The deepest module prefix of parameter ``name`` matching a pattern, component by component ('blocks.*'
    matches blocks.0, not blocks.0.attn); ROOT when none does."""
    parts = name.split(".")[:-1]
    for depth in range(len(parts), 0, -1):
        prefix = parts[:depth]
        for pattern in patterns:
            pieces = pattern.split(".")
            if len(pieces) == depth and all(fnmatch.fnmatchcase(p, q) for p, q in zip(prefix, pieces, strict=True)):
                return ".".join(prefix)
    return ROOT


def load_module(spec: str, patterns: Sequence[str] | None) -> Model:
    try:
        build, config = loading.factory(spec)
        model = loading.build_on_meta(spec, build)
    except loading.LoadError as exc:
        raise InputError(str(exc)) from None
    if config is not None and patterns is None:
        patterns = ["blocks.*"]  # a mini_gpt preset: one unit per block, as the guides wrap it
    patterns = list(patterns or [])
    named = list(model.named_parameters())  # a tied weight once, in its first owner
    params = tuple(Param(unit_of(clean(n), patterns), clean(n), tuple(p.shape)) for n, p in named)
    return Model(params, spec, config)


def model_of(args: argparse.Namespace) -> Model:
    if args.params is not None and args.model is not None:
        raise InputError("give a parameter count or --model, not both")
    if args.model is not None:
        return load_module(args.model, args.units)
    if args.params is None:
        raise InputError("give a parameter count (e.g. 7B), --model mini_gpt:grammar, or --seeds")
    count = cost.parse_count(args.params)
    return Model(count, "a parameter count")


def links(args: argparse.Namespace) -> tuple[Link, Link | None]:
    """The inter-node link (or the only one) and the intra-node one if given; an error names the option."""
    link = Link.gbps(args.bandwidth_gbps, args.latency_us, names=("--bandwidth-gbps", "--latency-us"))
    if args.intra_bandwidth_gbps is None:
        return link, None
    names = ("--intra-bandwidth-gbps", "--intra-latency-us")
    return link, Link.gbps(args.intra_bandwidth_gbps, args.intra_latency_us, names=names)


def num(value: Fraction | int) -> int | float:
    value = Fraction(value)
    return int(value) if value.denominator == 1 else float(value)
