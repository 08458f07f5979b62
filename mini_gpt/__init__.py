"""mini_gpt: a small nanoGPT-style decoder and its data, the workload the FSDP checks train."""

from mini_gpt.batches import BatchSampler, corpus_tokens
from mini_gpt.config import PRESETS, SHAPES, GPTConfig, preset
from mini_gpt.corpus import load_corpus
from mini_gpt.model import GPT
from mini_gpt.tokenizer import CharTokenizer, default_tokenizer
from mini_gpt.train import fit, make_optimizer, train, train_step

__all__ = [
    "GPT",
    "PRESETS",
    "SHAPES",
    "BatchSampler",
    "CharTokenizer",
    "GPTConfig",
    "corpus_tokens",
    "default_tokenizer",
    "fit",
    "load_corpus",
    "make_optimizer",
    "preset",
    "train",
    "train_step",
]
