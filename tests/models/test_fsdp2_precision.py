"""The dtype model of FSDP2's MixedPrecisionPolicy (guide 18)."""

from __future__ import annotations

import pytest

from checks.models.fsdp2_precision import stages


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        ((None, None), ("float32", "float32", "float32", "unsharded_param.grad")),
        (("bfloat16", None), ("bfloat16", "bfloat16", "bfloat16", "unsharded_param.grad")),
        (("bfloat16", "float32"), ("bfloat16", "float32", "float32", "unsharded_accumulated_grad")),
        (("bfloat16", "bfloat16"), ("bfloat16", "bfloat16", "bfloat16", "unsharded_param.grad")),
        ((None, "float16"), ("float32", "float16", "float16", "unsharded_accumulated_grad")),
        (("float32", None), ("float32", "float32", "float32", "unsharded_param.grad")),
    ],
)
def test_stages_of_fp32_parameters(policy: tuple[str | None, str | None], want: tuple[str, ...]) -> None:
    gather, reduced, waits, where = want
    s = stages("float32", *policy)
    assert (s.all_gather, s.compute, s.reduce_scatter, s.sharded_grad) == (gather, gather, reduced, "float32")
    assert (s.accumulated, s.accumulated_where) == (waits, where)


def test_a_non_floating_parameter_ignores_param_dtype() -> None:
    assert stages("int64", "bfloat16").all_gather == "int64"
