"""The dtypes FSDP2's ``MixedPrecisionPolicy`` gives each stage of a step (guide 18). Torch-free; dtypes by name.

Two rules, as guide 18 reads them. ``release="2.13"`` holds for torch 2.13 and 2.14 (``FSDPParam.init_dtype_attrs``,
``to_accumulated_grad_if_needed`` and ``foreach_reduce``):

1. ``reduce_dtype`` equal to ``param_dtype`` is dropped (``None``): gradients already come in ``param_dtype``.
2. ``param_dtype`` equal to the original dtype is dropped too (so is any for a non-floating parameter).
3. The all-gather, the unsharded parameter and so the gradient autograd computes are in ``param_dtype``, or
   the original dtype without one. Autograd adds the gradients of a parameter used twice in that dtype.
4. The reduce-scatter runs in ``reduce_dtype``, or in the gradient's dtype without one (so ``param_dtype`` when
   only that is set).
5. The sharded gradient is stored in the original dtype (cast back after the reduction).
6. Without gradient sync, the unsharded gradient waits on the unsharded parameter in its computed dtype, unless a
   (kept) ``reduce_dtype`` differs from it: then it is moved to ``unsharded_accumulated_grad`` in
   ``reduce_dtype``, and later micro-batches are added there.

``release="2.15"`` holds from torch 2.15 (``unsharded_grad_dtype``, ``init_unsharded_param``,
``FSDPParamGroup._get_reduce_dtype`` and ``_set_unsharded_grad_dtypes``), for a parameter whose own ``grad_dtype``
was never set:

1. ``reduce_dtype`` is kept even when it equals ``param_dtype``; rule 2 is unchanged.
2. The unsharded parameter's ``grad_dtype`` is ``reduce_dtype``, or the original dtype without one.
3. Autograd casts each gradient reaching the unsharded parameter to that ``grad_dtype`` before adding it, unless
   the ``grad_dtype`` is wider than the compute dtype: FSDP then switches the cast off during backward, and the
   gradients are computed and added in the compute dtype.
4. The reduce-scatter runs in ``reduce_dtype``, or without one in the unsharded ``grad_dtype``: the original dtype,
   whatever ``param_dtype`` is.
5. The sharded gradient is stored in the original dtype, as before.
6. Without gradient sync, the gradient waits on the unsharded parameter itself, cast to its ``grad_dtype``.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOATING = ("float32", "bfloat16", "float16", "float64")
ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
RELEASES = ("2.13", "2.15")


@dataclass(frozen=True)
class Stages:
    all_gather: str
    compute: str
    reduce_scatter: str
    sharded_grad: str
    accumulated: str  # the dtype an unsynced gradient waits in
    accumulated_where: str  # "unsharded_param.grad" | "unsharded_accumulated_grad"
    uses_added_in: str  # the dtype autograd adds the gradients of a parameter used twice in, in one backward


def stages(
    orig: str, param_dtype: str | None = None, reduce_dtype: str | None = None, *, release: str = "2.13"
) -> Stages:
    if release not in RELEASES:
        raise ValueError(f"release must be one of {RELEASES}, got {release!r}")
    if release == "2.13" and reduce_dtype == param_dtype:
        reduce_dtype = None  # before param_dtype is dropped, as init_dtype_attrs does
    if param_dtype == orig or orig not in FLOATING:
        param_dtype = None
    compute = param_dtype or orig
    if release == "2.15":
        grad_dtype = reduce_dtype or orig
        wider = grad_dtype in ITEMSIZE and compute in ITEMSIZE and ITEMSIZE[grad_dtype] > ITEMSIZE[compute]
        added_in = compute if wider else grad_dtype
        return Stages(compute, compute, grad_dtype, orig, grad_dtype, "unsharded_param.grad", added_in)
    reduced = reduce_dtype or compute
    upcast = reduce_dtype is not None and reduce_dtype != compute
    where = "unsharded_accumulated_grad" if upcast else "unsharded_param.grad"
    return Stages(compute, compute, reduced, orig, reduce_dtype if upcast else compute, where, compute)
