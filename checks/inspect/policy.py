"""``--wrap`` text to a policy description (the ``{"kind": ...}`` dicts guide 20's claims use), which
`checks.models.wrap` reads as its model of the policy and ``checks.workloads.wrap_policies.torch_policy`` builds as
torch's. Torch-free.

- ``none``: no policy, the whole model one unit;
- ``size`` or ``size:N`` or a bare count (``1M``, ``100000``): ``size_based_auto_wrap_policy`` with
  ``min_num_params`` N (torch's default, 1e8, for ``size``);
- ``module:A,B`` or bare class names ``A,B``: ``ModuleWrapPolicy({A, B})``;
- ``transformer:A,B``: ``transformer_auto_wrap_policy`` with ``transformer_layer_cls={A, B}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from checks.models.cost import parse_count
from checks.models.wrap import DEFAULT_MIN_NUM_PARAMS

KINDS = ("none", "size", "module", "transformer")
_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_wrap(text: str) -> dict[str, Any] | None:
    """The description ``text`` names (see the module docstring); a ValueError says what is accepted."""
    text = text.strip()
    kind, _, rest = text.partition(":")
    if text == "none":
        return None
    if kind == "size":
        count = parse_count(rest) if rest else DEFAULT_MIN_NUM_PARAMS
        return {"kind": "size", "min_num_params": int(count)}
    if kind in ("module", "transformer"):
        return {"kind": kind, "classes": _classes(rest, text)}
    if text and text[0].isdigit():
        return {"kind": "size", "min_num_params": int(parse_count(text))}
    return {"kind": "module", "classes": _classes(text, text)}


def _classes(names: str, text: str) -> list[str]:
    classes = [name.strip() for name in names.split(",") if name.strip()]
    if not classes or not all(_CLASS.fullmatch(name) for name in classes):
        raise ValueError(
            f"--wrap {text!r}: give none, size[:N], a count (1M), module:CLASS[,CLASS] or transformer:CLASS[,CLASS]"
        )
    return classes


def unknown_classes(spec: dict[str, Any] | None, available: Iterable[str]) -> list[str]:
    """The class names ``spec`` asks for that no module of the model is (by its class or a base class)."""
    if spec is None or "classes" not in spec:
        return []
    have = set(available)
    return [name for name in spec["classes"] if name not in have]


def describe(spec: dict[str, Any] | None) -> str:
    """The policy as the user would write it in torch."""
    if spec is None:
        return "no auto_wrap_policy (one unit)"
    if spec["kind"] == "size":
        return f"size_based_auto_wrap_policy(min_num_params={spec['min_num_params']:,})"
    classes = ", ".join(spec["classes"])
    if spec["kind"] == "module":
        return f"ModuleWrapPolicy({{{classes}}})"
    return f"transformer_auto_wrap_policy(transformer_layer_cls={{{classes}}})"
