"""One vocabulary for FSDP units, shared by every probe, workload, check, model and renderer.

A unit is named by the module path of the original model (``blocks.0``), with the wrapper attributes FSDP and
friends insert left out; the outermost unit, whose module path is empty, is ``root``. Parameter and buffer names
are cleaned the same way (``blocks.0.attn.weight``) but never become ``root``.
"""

from __future__ import annotations

ROOT = "root"
# Attributes that wrappers insert between a module and its children: FSDP1, activation checkpointing, torch.compile.
WRAPPER_ATTRIBUTES = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def clean(name: str) -> str:
    """``_fsdp_wrapped_module.blocks.0._fsdp_wrapped_module.ln.weight`` → ``blocks.0.ln.weight``."""
    return ".".join(part for part in name.split(".") if part and part not in WRAPPER_ATTRIBUTES)


def unit_name(module_path: str) -> str:
    """The unit whose module sits at ``module_path``: the cleaned path, or ``root`` for the outermost module."""
    return clean(module_path) or ROOT
