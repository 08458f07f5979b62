"""Guide 21's pipeline workload: eight ``Linear(16, 16)`` + ``Tanh`` layers cut into one stage per rank, run by
``torch.distributed.pipelining`` under GPipe or 1F1B. A batch of 8 rows makes 4 microbatches of 2 × 16 = 32
elements, the size of every activation and gradient a stage sends."""

from __future__ import annotations

import torch
from torch import nn

from checks.ranks.context import RankContext

PP_WIDTH, PP_LAYERS, PP_BATCH, MICROBATCHES = 16, 8, 8, 4
ACTIVATION_NUMEL = (PP_BATCH // MICROBATCHES) * PP_WIDTH  # one microbatch's activation at any cut


def pp_layers(seed: int = 0) -> nn.Sequential:
    """Eight Linear(16, 16) + Tanh layers, weights from ``seed`` alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(*(nn.Sequential(nn.Linear(PP_WIDTH, PP_WIDTH), nn.Tanh()) for _ in range(PP_LAYERS)))


def pp_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).square().mean()


def pp_data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``step``'s input and target, the same on every rank."""
    generator = torch.Generator().manual_seed(2000 + step)
    return torch.randn(PP_BATCH, PP_WIDTH, generator=generator), torch.randn(PP_BATCH, PP_WIDTH, generator=generator)


def stage_slice(stage: int, stages: int) -> slice:
    """The layers of ``stage`` out of ``stages``."""
    per = PP_LAYERS // stages
    return slice(stage * per, (stage + 1) * per)


class Pipeline:
    """This rank's stage of the eight layers, one stage per rank, under ``schedule`` with m microbatches."""

    def __init__(self, ctx: RankContext, schedule: str, microbatches: int = MICROBATCHES) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.ctx, self.stages = ctx, ctx.world_size
        self.module = pp_layers()[stage_slice(ctx.rank, self.stages)].to(ctx.device)
        self.stage = PipelineStage(self.module, ctx.rank, self.stages, ctx.device)
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        self.schedule = kind(self.stage, n_microbatches=microbatches, loss_fn=pp_loss)

    def step(self, step: int) -> list[float]:
        """One pipeline step on batch ``step``: the first stage feeds the input, the last the target; the last
        returns each microbatch's loss."""
        x, y = pp_data(step)
        losses: list[torch.Tensor] = []
        if self.ctx.rank == 0:
            self.schedule.step(x.to(self.ctx.device))
        elif self.ctx.rank == self.stages - 1:
            self.schedule.step(target=y.to(self.ctx.device), losses=losses)
        else:
            self.schedule.step()
        return [float(v.detach()) for v in losses]
