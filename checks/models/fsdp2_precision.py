"""The dtypes FSDP2's ``MixedPrecisionPolicy`` gives each stage of a step (guide 18). Torch-free; dtypes by name.

As guide 18 reads ``FSDPParam.init_dtype_attrs`` and ``foreach_reduce`` (torch 2.13):

1. ``reduce_dtype`` equal to ``param_dtype`` is dropped (``None``): gradients already come in ``param_dtype``.
2. ``param_dtype`` equal to the original dtype is dropped too (so is any for a non-floating parameter).
3. The all-gather, the unsharded parameter and so the gradient autograd computes are in ``param_dtype``, or
   the original dtype without one.
4. The reduce-scatter runs in ``reduce_dtype``, or in the gradient's dtype without one (so ``param_dtype`` when
   only that is set).
5. The sharded gradient is stored in the original dtype (cast back after the reduction).
6. Without gradient sync, the unsharded gradient waits on the unsharded parameter in its computed dtype, unless a
   (kept) ``reduce_dtype`` differs from it: then it is moved to ``unsharded_accumulated_grad`` in
   ``reduce_dtype``, and later micro-batches are added there.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOATING = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class Stages:
    all_gather: str
    compute: str
    reduce_scatter: str
    sharded_grad: str
    accumulated: str  # the dtype an unsynced gradient waits in
    accumulated_where: str  # "unsharded_param.grad" | "unsharded_accumulated_grad"


def stages(orig: str, param_dtype: str | None = None, reduce_dtype: str | None = None) -> Stages:
    if reduce_dtype == param_dtype:
        reduce_dtype = None
    if param_dtype == orig or orig not in FLOATING:
        param_dtype = None
    compute = param_dtype or orig
    reduced = reduce_dtype or compute
    upcast = reduce_dtype is not None and reduce_dtype != compute
    where = "unsharded_accumulated_grad" if upcast else "unsharded_param.grad"
    return Stages(compute, compute, reduced, orig, reduce_dtype if upcast else compute, where)
