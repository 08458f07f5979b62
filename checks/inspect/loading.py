"""``MODULE:CALLABLE`` specs: import the callable, build its module on the meta device or for real, each failure a
`LoadError` that says what to do (``estimate --model`` and ``inspect`` print it and exit 2)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class LoadError(Exception):
    """A spec that cannot be loaded or built: the message is for the user, as it is."""


def factory(spec: str, option: str = "--model") -> tuple[Callable[[], Any], Any]:
    """The callable ``spec`` names, and a mini_gpt config when it names a preset (``mini_gpt:tiny``)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise LoadError(f"{option} takes MODULE:CALLABLE (or mini_gpt:PRESET), not {spec!r}")
    if module_name == "mini_gpt":
        from mini_gpt import GPT, PRESETS, SHAPES

        configs = {**PRESETS, **SHAPES}
        if attr not in configs:
            raise LoadError(f"mini_gpt has no preset {attr!r}; choose one of: {', '.join(configs)}")
        config = configs[attr]
        return (lambda: GPT(config)), config
    importable_from_here()
    try:
        build = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise LoadError(f"{option} {spec}: cannot import {module_name!r} ({exc}), neither from the current directory "
                        f"({Path.cwd()}) nor from the installed packages; run from the directory that holds it, or "
                        "add that directory to PYTHONPATH") from None  # fmt: skip
    except AttributeError:
        raise LoadError(f"{option} {spec}: {module_name} has no {attr!r}; name a callable") from None
    if not callable(build):
        raise LoadError(f"{option} {spec} is not callable; name a function or class")
    return build, None


def importable_from_here() -> None:
    """The current directory on the import path, first, as ``python -m`` puts it (an installed console script puts
    its own directory there instead); the ranks a pool starts inherit it."""
    here = str(Path.cwd())
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def build_on_meta(spec: str, build: Callable[[], Any]) -> Any:
    """``build()`` under the meta device: an ``nn.Module`` whose parameters are all on meta (no memory, no RNG)."""
    import torch
    from torch import nn

    try:
        with torch.device("meta"):
            model = build()
    except Exception as exc:
        raise LoadError(
            f"{spec} cannot be built on the meta device: {type(exc).__name__}: {exc}; build it without "
            "reading tensor values (no .item(), no data-dependent init) and without device="
        ) from None
    if not isinstance(model, nn.Module):
        raise LoadError(f"{spec} returned {type(model).__name__}, not an nn.Module")
    named = list(model.named_parameters())
    off_meta = [n for n, p in named if p.device.type != "meta"]
    if off_meta:
        raise LoadError(
            f"{spec} built {off_meta[0]} on {named[0][1].device}, not the meta device: create its "
            "parameters from the default device (no device=, no .to())"
        )
    return model


def build_for_real(spec: str, build: Callable[[], Any], seed: int = 0) -> Any:
    """``build()`` on the CPU from ``seed``, so every rank builds the same weights."""
    import torch
    from torch import nn

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = build()
        except Exception as exc:
            raise LoadError(f"{spec} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise LoadError(f"{spec} returned {type(model).__name__}, not an nn.Module")
    return model


def build_on_meta_or_cpu(spec: str, build: Callable[[], Any]) -> Any:
    """The model's structure: built on meta, or, when it cannot be built there, on the CPU (where a factory that
    raises says why)."""
    try:
        return build_on_meta(spec, build)
    except LoadError:
        return build_for_real(spec, build)
