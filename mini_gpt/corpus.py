"""The shipped training text: short Spanish sentences that exercise agreement and conjugation."""

import functools
from importlib.resources import files


@functools.cache
def load_corpus() -> str:
    """Return `data/corpus.txt`, read through importlib.resources so it also works from a wheel."""
    return files("mini_gpt").joinpath("data", "corpus.txt").read_text(encoding="utf-8")
