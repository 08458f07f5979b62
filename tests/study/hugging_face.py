"""Hugging Face models for the ``inspect`` tests: transformers offline, imported once by the zygote the ranks fork
from rather than by every rank; skipped where the models extra is not installed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from checks.ranks import zygote as zygotes


@contextmanager
def offline(*modules: str) -> Iterator[None]:
    """``HF_HUB_OFFLINE=1`` and ``modules`` preloaded by the zygote, for the block; the environment restored."""
    pytest.importorskip("transformers", reason="the models extra is not installed: pip install '.[models]'")
    kept = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        with zygotes.preloading(*modules):
            yield
    finally:
        if kept is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = kept
