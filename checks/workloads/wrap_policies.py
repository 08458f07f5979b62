"""A wrap policy described as plain data (``{"kind": "size", "min_num_params": 288}``, the descriptions guide 20's
claims and ``fsdp-readings inspect --wrap`` write), read two ways: `model_policy` as the torch-free wrap model's
(`checks.models.wrap`), `torch_policy` as torch's own policy object, so the model and FSDP1 are given one policy.

Kinds: ``module`` and ``transformer`` (``classes``), ``lambda`` (a rule: ``types``, ``paths``,
``except_paths``), ``size`` (``min_num_params``), ``custom`` (``rules``, each a rule with optional ``kwargs``)
and ``or`` (``policies``). Class names are those of `known_classes`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from torch import nn

from checks.models import wrap as wm
from checks.workloads.edge import EdgeBlock
from mini_gpt.model import Block


def known_classes() -> dict[str, type[nn.Module]]:
    """The module classes a policy description may name."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return {
        "Block": Block,
        "EdgeBlock": EdgeBlock,
        "Linear": nn.Linear,
        "BatchNorm1d": nn.BatchNorm1d,
        "_BatchNorm": _BatchNorm,
        "LayerNorm": nn.LayerNorm,
        "MultiheadAttention": nn.MultiheadAttention,
        "ModuleList": nn.ModuleList,
        "TransformerEncoderLayer": nn.TransformerEncoderLayer,
        "TransformerDecoderLayer": nn.TransformerDecoderLayer,
    }


def _match(spec: Mapping[str, Any]) -> wm.Match:
    return wm.Match(tuple(spec.get("types", ())), tuple(spec.get("paths", ())), tuple(spec.get("except_paths", ())))


def model_policy(spec: Mapping[str, Any] | None) -> wm.Policy | None:
    """The wrap model's policy for a claim's description (``{kind = "size", min_num_params = 288}``, ...)."""
    if spec is None:
        return None
    kind = spec["kind"]
    if kind == "module":
        return wm.ModuleWrap(tuple(spec["classes"]))
    if kind == "transformer":
        return wm.Transformer(tuple(spec["classes"]))
    if kind == "lambda":
        return wm.Lambda(_match(spec))
    if kind == "size":
        return wm.SizeBased(spec.get("min_num_params", wm.DEFAULT_MIN_NUM_PARAMS))
    if kind == "custom":
        rules = tuple((_match(rule), tuple(sorted(rule["kwargs"].items())) if "kwargs" in rule else True)
                      for rule in spec["rules"])  # fmt: skip
        return wm.Custom(rules)
    if kind == "or":
        return wm.Or(tuple(model_policy(p) for p in spec["policies"]))  # type: ignore[misc]
    raise ValueError(f"unknown policy kind {kind!r}")


def torch_policy(spec: Mapping[str, Any] | None, paths: Mapping[int, str],
                 classes: Mapping[str, type[nn.Module]] | None = None) -> Any:  # fmt: skip
    """The same description as torch's policy object; ``paths`` names each module of the unwrapped model,
    ``classes`` the classes it may name (`known_classes` by default)."""
    from torch.distributed.fsdp.wrap import (
        CustomPolicy,
        ModuleWrapPolicy,
        _or_policy,
        lambda_auto_wrap_policy,
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    if spec is None:
        return None
    classes = classes or known_classes()
    kind = spec["kind"]

    def selects(rule: Mapping[str, Any], module: nn.Module) -> bool:
        path = paths.get(id(module))
        wanted = tuple(classes[name] for name in rule.get("types", ()))
        chosen = isinstance(module, wanted) or path in rule.get("paths", ())
        return chosen and path not in rule.get("except_paths", ())

    if kind == "module":
        return ModuleWrapPolicy({classes[name] for name in spec["classes"]})
    if kind == "transformer":
        layers = {classes[name] for name in spec["classes"]}
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers)
    if kind == "lambda":
        return functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda module: selects(spec, module))
    if kind == "size":
        return functools.partial(size_based_auto_wrap_policy, min_num_params=spec["min_num_params"])
    if kind == "custom":
        from torch.distributed.fsdp import ShardingStrategy

        def lambda_fn(module: nn.Module) -> bool | dict[str, Any]:
            for rule in spec["rules"]:
                if selects(rule, module):
                    kwargs = rule.get("kwargs")
                    return {k: ShardingStrategy[v] for k, v in kwargs.items()} if kwargs else True
            return False

        return CustomPolicy(lambda_fn)
    if kind == "or":
        return functools.partial(_or_policy, policies=[torch_policy(p, paths, classes) for p in spec["policies"]])
    raise ValueError(f"unknown policy kind {kind!r}")
