"""mini_gpt whose blocks run in an order set between iterations (guides 04, 06, 17 and 18): a model whose
forward order changes, which FSDP's record of the first iteration's order does not expect."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

from mini_gpt import GPT


class OrderedBlocks(nn.ModuleList):
    """Blocks iterated in ``order`` when it is set; their module names stay ``blocks.0``, ``blocks.1``, ..."""

    order: list[int] | None = None

    def __iter__(self) -> Iterator[nn.Module]:
        return iter([self[i] for i in self.order]) if self.order is not None else super().__iter__()


class ReorderableGPT(GPT):
    """mini_gpt whose forward runs its blocks in ``blocks.order``: a model whose forward order can change
    between iterations, which the static-graph assumption of forward prefetch does not expect."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.blocks = OrderedBlocks(self.blocks)
