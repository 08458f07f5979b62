"""Model hyperparameters and the named presets the readings and checks train."""

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from mini_gpt.tokenizer import default_tokenizer


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int  # longest context the position embedding covers
    n_layer: int
    n_head: int
    n_embd: int
    bias: bool = True  # biases in Linear and LayerNorm layers
    dropout: float = 0.0
    tie_weights: bool = True  # lm_head shares tok_emb's weight

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


# vocab_size comes from the shipped corpus so that editing the text can never desynchronise the model.
_VOCAB = default_tokenizer().vocab_size

PRESETS: Mapping[str, GPTConfig] = MappingProxyType(
    {
        # ~50k parameters; three blocks so an FSDP wrap gives root + blocks.0/1/2 as four units.
        "tiny": GPTConfig(vocab_size=_VOCAB, block_size=64, n_layer=3, n_head=4, n_embd=36),
        # ~500k parameters: the course's "MiniGPT-grammar".
        "grammar": GPTConfig(vocab_size=_VOCAB, block_size=128, n_layer=4, n_head=6, n_embd=96),
    }
)

# Shapes built only on the meta device (`fsdp-readings estimate --model mini_gpt:NAME`), never trained: far too big.
SHAPES: Mapping[str, GPTConfig] = MappingProxyType(
    {
        # GPT-3 6.7B (Brown et al. 2020, Table 2.1): 32 blocks of width 4,096, 32 heads, context 2,048.
        "gpt3-6.7b": GPTConfig(vocab_size=50257, block_size=2048, n_layer=32, n_head=32, n_embd=4096),
        # A GPT-3-style 100B: 80 blocks of width 10,240 (12·80·10,240² ≈ 100.7B in the blocks).
        "gpt-100b": GPTConfig(vocab_size=50257, block_size=2048, n_layer=80, n_head=80, n_embd=10240),
        # Seed 000's exercise: the grammar tutor's 4 blocks and context, 600k word forms, d_model 4,096.
        "grammar-600k": GPTConfig(vocab_size=600_000, block_size=128, n_layer=4, n_head=32, n_embd=4096),
    }
)


def preset(name: str) -> GPTConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
