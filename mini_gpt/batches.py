"""Deterministic training batches, and the per-rank shards of them that data parallelism consumes."""

import torch

from mini_gpt.corpus import load_corpus
from mini_gpt.tokenizer import default_tokenizer

_STEPS = 2**32  # torch's CPU generator (mt19937) keeps only the low 32 bits of a seed
_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads run seeds far apart in the 32-bit seed space


def corpus_tokens() -> torch.Tensor:
    """The shipped corpus encoded with the default tokenizer: a 1-D int64 tensor."""
    return torch.tensor(default_tokenizer().encode(load_corpus()), dtype=torch.long)


class BatchSampler:
    """Random windows of `tokens`, a pure function of (seed, step).

    Every rank can rebuild the same global batch without communicating, then keep its own rows;
    so a data-parallel run sees exactly the batches a single-process run of the same seed sees.
    """

    def __init__(self, tokens: torch.Tensor, block_size: int, global_batch_size: int, seed: int = 0) -> None:
        if tokens.ndim != 1 or tokens.is_floating_point():
            raise ValueError(f"tokens must be a 1-D integer tensor, got {tokens.ndim}-D {tokens.dtype}")
        if block_size < 1 or tokens.numel() <= block_size:
            raise ValueError(f"need 1 <= block_size < len(tokens), got {block_size} and {tokens.numel()}")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
        if not 0 <= seed < _STEPS:
            raise ValueError(f"seed must be in [0, 2**32), got {seed}")
        self.tokens = tokens
        self.block_size = block_size
        self.global_batch_size = global_batch_size
        self.seed = seed
        # Offsets of one window: block_size inputs plus the one extra token the last target needs.
        self._window = torch.arange(block_size + 1, device="cpu")

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (global_batch_size, block_size); y is x shifted one token to the left."""
        if not 0 <= step < _STEPS:
            raise ValueError(f"step must be in [0, 2**32), got {step}")
        # A local generator keeps torch's global RNG out of it. The 32-bit generator seed is a Weyl
        # mix: for one run seed it is a bijection of step, so no two steps of a run share a stream,
        # and different run seeds start their step sequences far apart.
        g = torch.Generator(device="cpu").manual_seed((self.seed * _GOLDEN + step) % _STEPS)
        # Positions are drawn on the CPU whatever the tokens' device, so batches match across devices.
        n_starts = self.tokens.numel() - self.block_size
        starts = torch.randint(n_starts, (self.global_batch_size,), generator=g, device="cpu")
        windows = self.tokens[(starts[:, None] + self._window).to(self.tokens.device)]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def shard(self, step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [rank·B/N, (rank+1)·B/N) of global_batch(step); all ranks' shards concatenate to it."""
        if world_size < 1:
            raise ValueError(f"world_size must be positive, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is out of range for world_size {world_size} (need 0 <= rank < N)")
        if self.global_batch_size % world_size:
            raise ValueError(
                f"global_batch_size {self.global_batch_size} is not divisible by world_size {world_size}; "
                "every rank must get the same number of rows"
            )
        per_rank = self.global_batch_size // world_size
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        x, y = self.global_batch(step)
        return x[rows], y[rows]
