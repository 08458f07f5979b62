"""allreduce-hook-is-builtin, fp16-hook-error-bound and their -at-4: the default ``allreduce_hook`` issues the
built-in all-reduces from Python and trains bit for bit like no hook; ``fp16_compress_hook`` stays within the
bound the guide derives from fp16's arithmetic, and reaches at least half of it."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from checks.guides.g19_ddp_buckets.ddp_runs import LR, ddp_of, loss_of, model_of, parameters_flat
from checks.probes.comm import record_comm
from checks.ranks.context import RankContext
from checks.violation import require, require_equal

HOOKS_MODULE = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"
FP16_UNIT_ROUNDOFF = 2.0**-11  # fp16 keeps 11 significant bits: rounding to nearest errs by at most 2^-11, relative
FP16_HALF_SUBNORMAL = 2.0**-25  # below 2^-14 fp16 is subnormal, spaced 2^-24: rounding errs by at most 2^-25


def _default_hooks() -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks


def _grads(ddp: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten() for p in ddp.module.parameters()]).cpu()


def allreduce_hook_is_builtin(ctx: RankContext, steps: int = 3, bucket_cap_mb: float = 0.05) -> dict[str, Any]:
    """DDP with ``register_comm_hook(None, allreduce_hook)`` against DDP without: the same all-reduces (count,
    elements, dtype), issued from the hook's Python (``_allreduce_fut``) instead of C++, and gradients and AdamW
    parameters bitwise equal after every step."""
    plain = ddp_of(ctx, "tiny", bucket_cap_mb=bucket_cap_mb)
    hooked = ddp_of(ctx, "tiny", bucket_cap_mb=bucket_cap_mb)
    hooked.register_comm_hook(None, _default_hooks().allreduce_hook)
    optims = [torch.optim.AdamW(m.parameters(), lr=LR) for m in (plain, hooked)]
    callers: set[tuple[str, str]] = set()
    counts = []
    for step in range(steps):
        logs = []
        for model in (plain, hooked):
            with record_comm() as comm:
                loss_of(model, ctx, "tiny", step).backward()
            logs.append(comm)
        shapes = [[(c.op, c.numel, c.dtype) for c in log] for log in logs]
        require_equal(shapes[1], shapes[0], reason="hook-collectives-differ", what=f"step {step + 1}: the hooked "
                      "DDP's collectives (op, elements, dtype) against the built-in's", step=step + 1)  # fmt: skip
        callers |= {(c.api, c.caller) for c in logs[1].select("all_reduce")}
        require({c.api for c in logs[0].select("all_reduce")} == {"<C++>"}, "builtin-not-cpp",
                "the built-in all-reduce was issued from Python", step=step + 1)  # fmt: skip
        differing = int((_grads(plain) != _grads(hooked)).sum())
        require(differing == 0, "hook-gradients-differ", f"step {step + 1}: {differing} gradient elements differ "
                "from the built-in all-reduce's", step=step + 1, observed=differing)  # fmt: skip
        for optim in optims:
            optim.step()
            optim.zero_grad(set_to_none=True)
        require(torch.equal(parameters_flat(plain), parameters_flat(hooked)), "hook-parameters-differ",
                f"after step {step + 1} the parameters differ", step=step + 1)  # fmt: skip
        counts.append(len(logs[1].select("all_reduce")))
    expected_caller = {("all_reduce", f"{HOOKS_MODULE}:_allreduce_fut")}
    require_equal(callers, expected_caller, reason="hook-not-called", what="(api, caller) of the hooked all-reduces")
    return {"all_reduces_per_step": counts, "callers": sorted(callers)}


def fp16_error_bound(ctx: RankContext, steps: int = 3, slack: float = 1.01, tight: float = 0.5) -> dict[str, Any]:
    """``fp16_compress_hook`` against the fp32 built-in, at the same parameters every step (mini_gpt tiny, one
    bucket): every element of the compressed gradient is within B = slack · (N · 2^-11 · mean_r |a_r| + (N+1) ·
    2^-25) of the fp32 one, a_r the ranks' local gradients (the guide derives it); the all-reduces carry fp16; and
    the worst element reaches at least ``tight`` of B, so the bound is not loose and the rounding did happen."""
    n = ctx.world_size
    fp32 = ddp_of(ctx, "tiny")
    fp16 = ddp_of(ctx, "tiny")
    fp16.register_comm_hook(None, _default_hooks().fp16_compress_hook)
    replica = model_of(ctx, "tiny")
    optim = torch.optim.AdamW(fp16.parameters(), lr=LR)
    worst_ratio, worst_relative, dtypes = 0.0, 0.0, set()
    for step in range(steps):
        fp32.module.load_state_dict(fp16.module.state_dict())
        replica.load_state_dict(fp16.module.state_dict())
        with record_comm() as comm:
            loss_of(fp16, ctx, "tiny", step).backward()
        loss_of(fp32, ctx, "tiny", step).backward()
        loss_of(replica, ctx, "tiny", step).backward()
        local = torch.cat([p.grad.detach().flatten() for p in replica.parameters()]).cpu()
        everyone = [torch.empty_like(local) for _ in range(n)]
        dist.all_gather(everyone, local)
        mean_abs = torch.stack(everyone).double().abs().mean(dim=0)
        bound = slack * (n * FP16_UNIT_ROUNDOFF * mean_abs + (n + 1) * FP16_HALF_SUBNORMAL)
        reference = _grads(fp32).double()
        error = (_grads(fp16).double() - reference).abs()
        ratio = error / bound
        at = int(ratio.argmax())
        require(bool((error <= bound).all()), "beyond-fp16-bound", f"step {step + 1}: element {at} is off by "
                f"{float(error[at]):.3g}, {float(ratio[at]):.3g} of its bound {float(bound[at]):.3g}", step=step + 1,
                ratio=float(ratio[at]), error=float(error[at]), bound=float(bound[at]),
                elements_beyond=int((error > bound).sum()))  # fmt: skip
        dtypes |= {(c.dtype, c.nbytes == 2 * c.numel) for c in comm.select("all_reduce")}
        worst_ratio = max(worst_ratio, float(ratio[at]))
        worst_relative = max(worst_relative, float(error.max() / reference.abs().max()))
        optim.step()
        for model in (fp16, fp32, replica):
            model.zero_grad(set_to_none=True)
    require_equal(dtypes, {("torch.float16", True)}, reason="not-fp16", what="(dtype, 2 bytes per element) of the "
                  "hooked all-reduces")  # fmt: skip
    require(worst_ratio >= tight, "bound-not-tight", f"the worst element reached only {worst_ratio:.3g} of its bound",
            observed=worst_ratio, expected=tight)  # fmt: skip
    return {"worst_ratio": worst_ratio, "worst_relative_to_largest": worst_relative}
