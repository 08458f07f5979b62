"""Small models of the setups people fine-tune, one per class ``inspect`` must answer for (issue
[inspect-models]), each with the batch it takes:

- `frozen`: LoRA, a frozen base Linear in each block beside two trainable low-rank factors;
- `experts` with `experts_batch` (every rank routes to experts 0 and 1, never to 2) and `experts_by_rank_batch`
  (rank r routes to expert r only): parameters that get no gradient;
- `dropout`: ``nn.Dropout(0.1)`` between two Linear layers, on as in training;
- `pass_through` (`checks.workloads.pass_through`): T5's shape, a block that computes a bias from its own
  parameter and blocks after it that return that bias as they got it;
- `parent_and_children` (`checks.workloads.nested_units`): a unit with parameters of its own whose children are
  units too;
- `tied_head`: an embedding and an output head sharing one weight, in the root or across units;
- `two_names`: one Embedding registered under two attribute names (T5's ``shared`` and ``embed_tokens``);
- `fan_out`: one hidden state read by two blocks, so its gradient is a sum whose order the wrapper may change.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from checks.workloads.nested_units import Inner, parent_and_children  # noqa: F401  (guide 06 runs it too)
from checks.workloads.pass_through import pass_through  # noqa: F401  (T5's shape; guide 13 runs it too)

WIDTH = 8


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def batch() -> torch.Tensor:
    return torch.randn(2, WIDTH)


class LoraBlock(nn.Module):
    """``base(x) + up(down(x))``: base frozen, the two factors trained."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(WIDTH, WIDTH)
        self.down = nn.Linear(WIDTH, 2, bias=False)
        self.up = nn.Linear(2, WIDTH, bias=False)
        self.base.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.base(x) + self.up(self.down(x)))


class Frozen(nn.Module):
    """A frozen input projection (a frozen tower), two `LoraBlock` and a trained head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH).requires_grad_(False)
        self.blocks = nn.ModuleList(LoraBlock() for _ in range(2))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def frozen() -> nn.Module:
    return Frozen()


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Experts(nn.Module):
    """Top-1 routing over three experts by an index the batch carries (so a test knows which expert each token
    reaches); the gate's weight scales each expert's output, as a router's probability does."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(WIDTH, 3)
        self.experts = nn.ModuleList(Expert() for _ in range(3))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
        weight = torch.softmax(self.gate(x), dim=-1)
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            chosen = route == index
            if chosen.any():
                out[chosen] = expert(x[chosen]) * weight[chosen, index : index + 1]
        return self.head(out)


def experts() -> nn.Module:
    return Experts()


def experts_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Four tokens, two to expert 0 and two to expert 1, on every rank: expert 2 gets no gradient anywhere."""
    return torch.randn(4, WIDTH), torch.tensor([0, 1, 0, 1])


def experts_by_rank_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two tokens, both to expert ``rank % 3``: each rank leaves other experts without a gradient."""
    return torch.randn(2, WIDTH), torch.full((2,), rank() % 3)


def dropout() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, 16), nn.Dropout(0.1), nn.ReLU(), nn.Linear(16, 2))


VOCAB = 16


class TiedHead(nn.Module):
    """An embedding, one block and a head that reads the embedding's weight (``head.weight is embed.weight``), as
    GPT-2, Llama with ``tie_word_embeddings`` and T5 do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.block = Inner()
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)))


def tied_head() -> nn.Module:
    return TiedHead()


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 3))


class TwoNames(nn.Module):
    """One Embedding registered as ``shared`` and as ``encoder_embed`` (T5: ``shared`` and
    ``encoder.embed_tokens``), then a block."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(VOCAB, WIDTH)
        self.encoder_embed = self.shared
        self.block = Inner()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.block(self.encoder_embed(tokens))


def two_names() -> nn.Module:
    return TwoNames()


class Decoder(nn.Module):
    """A decoder block with cross-attention's shape: it reads its input, and the encoder's output twice (keys and
    values)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.key = nn.Linear(WIDTH, WIDTH)
        self.value = nn.Linear(WIDTH, WIDTH)

    def forward(self, y: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(y) + self.key(memory) * self.value(memory))


class FanOut(nn.Module):
    """An encoder whose output three decoder blocks read twice each (T5's cross-attention): the encoder output's
    gradient is a sum of six terms. Under FSDP2 each block's two are added first (its inputs pass through one
    autograd node of FSDP2's), so the six are grouped otherwise than in DDP's backward."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Inner()
        self.decoders = nn.ModuleList(Decoder() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(x)
        y = x
        for decoder in self.decoders:
            y = decoder(y, memory)
        return y


def fan_out() -> nn.Module:
    return FanOut()
