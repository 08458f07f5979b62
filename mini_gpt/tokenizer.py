"""Character-level tokenizer: one id per distinct character of the corpus."""

import functools
from collections.abc import Iterable

from mini_gpt.corpus import load_corpus


class CharTokenizer:
    """Maps each character of `text` to its rank in sorted order, so the vocabulary is deterministic."""

    def __init__(self, text: str) -> None:
        if not text:
            raise ValueError("cannot build a tokenizer from empty text")
        self.chars: tuple[str, ...] = tuple(sorted(set(text)))
        self._ids: dict[str, int] = {ch: i for i, ch in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError:
            pos, ch = next((i, ch) for i, ch in enumerate(text) if ch not in self._ids)
            raise ValueError(
                f"character {ch!r} at position {pos} is not in the vocabulary "
                f"(the {self.vocab_size} characters {''.join(self.chars)!r})"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        ids = list(ids)
        # Reject out-of-range ids explicitly: a negative id would otherwise index from the end silently.
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        return "".join(self.chars[i] for i in ids)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


@functools.cache
def default_tokenizer() -> CharTokenizer:
    """The tokenizer of the shipped corpus; presets take their vocab_size from it."""
    return CharTokenizer(load_corpus())
