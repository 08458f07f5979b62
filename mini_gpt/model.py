"""A nanoGPT-style decoder-only transformer, small enough to train on a laptop CPU.

Module attribute names are part of the interface: FSDP readings refer to units by their FQNs
(`tok_emb`, `pos_emb`, `blocks.0` … `blocks.{n_layer-1}`, `ln_f`, `lm_head`).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from mini_gpt.config import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (b, t, c) -> (b, n_head, t, head_dim): each head attends independently.
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # re-join the heads
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: normalise, transform, add back onto the residual stream."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        # Build on the meta device: nn.Linear/nn.Embedding would otherwise draw a default init from
        # torch's global RNG, which we must neither consume nor perturb. Storage comes afterwards.
        target = torch.get_default_device()
        with torch.device("meta"):
            self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
            self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
            self.drop = nn.Dropout(config.dropout)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if target.type == "meta":
            # Deferred init (e.g. before sharding): caller runs to_empty(device=…) then init_weights(seed).
            self._tie_weights()
        else:
            self.to_empty(device=target)
            self.init_weights(seed)

    def _tie_weights(self) -> None:
        # Input and output embeddings share one matrix (fewer parameters, better small-data fit).
        # Re-done after every to_empty(), which allocates each module's parameters separately.
        if self.config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """nanoGPT's init, drawn from a local generator: same seed ⇒ same weights, global RNG untouched."""
        if not 0 <= seed < 2**32:
            # torch's CPU generator keeps only a seed's low 32 bits: larger seeds would silently alias.
            raise ValueError(f"seed must be in [0, 2**32), got {seed}")
        self._tie_weights()
        g = torch.Generator(device="cpu").manual_seed(seed)
        # Residual projections are scaled down so the stream's variance does not grow with depth.
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():  # registration order, so the draw order is fixed
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                _normal_(module.weight, 0.02, g)
            elif isinstance(module, nn.Linear):
                if module is self.lm_head and self.config.tie_weights:
                    continue  # its weight is tok_emb's, already drawn
                _normal_(module.weight, residual_std if name.endswith(".proj") else 0.02, g)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx, targets: (batch, time) token ids. Returns (batch, time, vocab) logits and the mean loss."""
        t = idx.size(1)
        if t > self.config.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.config.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        # Cross-entropy in float32 so bf16 logits still give a well-conditioned loss.
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss

    def num_parameters(self) -> int:
        """Trainable parameter count; a tied weight is one parameter and is counted once."""
        return sum(p.numel() for p in self.parameters())  # parameters() already de-duplicates

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding: append the most likely next token, max_new_tokens times."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size :])
            idx = torch.cat([idx, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
        return idx


def _normal_(param: torch.Tensor, std: float, g: torch.Generator) -> None:
    # Draw in float32 on the CPU, then copy: the same seed gives the same weights on any device/dtype.
    param.copy_(nn.init.normal_(torch.empty(param.shape, device="cpu"), 0.0, std, generator=g))
