"""The dtype model of FSDP2's MixedPrecisionPolicy (guide 18), under torch 2.13's rule and 2.15's."""

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
    assert s.uses_added_in == gather  # 2.13: autograd adds a parameter's gradients in the compute dtype


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        ((None, None), ("float32", "float32", "float32", "float32")),
        (("bfloat16", None), ("bfloat16", "float32", "float32", "bfloat16")),  # reduced in fp32 from 2.15
        (("bfloat16", "float32"), ("bfloat16", "float32", "float32", "bfloat16")),
        (("bfloat16", "bfloat16"), ("bfloat16", "bfloat16", "bfloat16", "bfloat16")),
        ((None, "float16"), ("float32", "float16", "float16", "float16")),  # each use rounded to fp16 first
        (("float32", None), ("float32", "float32", "float32", "float32")),
    ],
)
def test_stages_of_fp32_parameters_from_2_15(policy: tuple[str | None, str | None], want: tuple[str, ...]) -> None:
    gather, reduced, waits, added_in = want
    s = stages("float32", *policy, release="2.15")
    assert (s.all_gather, s.compute, s.reduce_scatter, s.sharded_grad) == (gather, gather, reduced, "float32")
    assert (s.accumulated, s.accumulated_where, s.uses_added_in) == (waits, "unsharded_param.grad", added_in)


def test_the_releases_differ_only_where_guide_18_says() -> None:
    policies = [(None, None), ("bfloat16", None), ("bfloat16", "float32"), ("bfloat16", "bfloat16"), (None, "float16")]
    differ = {
        policy: {f for f in ("reduce_scatter", "accumulated", "uses_added_in")
                 if getattr(stages("float32", *policy), f) != getattr(stages("float32", *policy, release="2.15"), f)}
        for policy in policies
    }  # fmt: skip
    assert {p: d for p, d in differ.items() if d} == {
        ("bfloat16", None): {"reduce_scatter", "accumulated"},
        (None, "float16"): {"uses_added_in"},
    }


def test_a_non_floating_parameter_ignores_param_dtype() -> None:
    assert stages("int64", "bfloat16").all_gather == "int64"
    assert stages("int64", "bfloat16", release="2.15").all_gather == "int64"


def test_an_unknown_release_is_refused() -> None:
    with pytest.raises(ValueError, match="release"):
        stages("float32", release="2.14")
