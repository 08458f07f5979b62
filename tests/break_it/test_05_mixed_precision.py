"""Guide 05: bend mixed precision and watch the claims fail."""

import pytest

from checks.breakers import wrapping
from checks.protocol import Patch

RU = "torch.distributed.fsdp._runtime_utils"
FP = "torch.distributed.fsdp._flat_param"
NO_PARAM_MIXED_PRECISION = Patch(f"{FP}:FlatParamHandle._uses_param_mixed_precision", "checks.sabotage:value",
                                 {"value": False})  # fmt: skip


@pytest.mark.breaks("05-mixed-precision", "inputs-in-bf16")
def test_an_uncast_root_input_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_root_cast_forward_input", "root_input_uncast"))
    assert "unit root received torch.float32, expected torch.bfloat16" in run.failure


@pytest.mark.breaks("05-mixed-precision", "bf16-aligns-flat-params")
def test_alignment_counted_in_fp32_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:_get_aligned_numel", "align_in_fp32"))
    assert "bf16 all-gather sizes differs from the expectation" in run.failure


@pytest.mark.breaks("05-mixed-precision", "collectives-move-bf16")
def test_fp32_all_gathers_are_caught(broken) -> None:
    run = broken(NO_PARAM_MIXED_PRECISION)
    # The layout stays bf16-aligned (3,532): only the cast before the all-gather is gone.
    assert "collectives not in bf16" in run.failure and "all_gather 3532 × float32" in run.failure


@pytest.mark.breaks("05-mixed-precision", "params-and-grads-stay-fp32")
def test_gradients_left_in_bf16_are_caught(broken) -> None:
    # The reduced shard stays bf16; torch itself then refuses to hand it to the fp32 parameter, so the check
    # stops there rather than at its own dtype assertion.
    run = broken(Patch(f"{RU}:_cast_grad_to_param_dtype", "checks.sabotage:noop"))
    assert "attempting to assign a gradient with dtype 'c10::BFloat16'" in run.failure


@pytest.mark.breaks("05-mixed-precision", "bf16-logits-within-one-epsilon")
def test_a_lossy_all_gather_exceeds_the_tolerance(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", "gather_then_scale"))
    assert "bf16 epsilons of the largest logit" in run.failure and "the guide allows (0, 1.0]" in run.failure


@pytest.mark.breaks("05-mixed-precision", "bf16-logits-within-one-epsilon")
def test_no_bf16_at_all_is_caught(broken) -> None:
    run = broken(NO_PARAM_MIXED_PRECISION)
    assert "mixed-precision logits are torch.float32" in run.failure


@pytest.mark.breaks("05-mixed-precision", "buffers-cast-at-lazy-init")
def test_buffers_left_uncast_are_caught(broken) -> None:
    run = broken(Patch(f"{RU}:_cast_buffers_to_dtype_and_device", "checks.sabotage:noop"))
    assert "buffer dtypes after the first forward" in run.failure


@pytest.mark.breaks("05-mixed-precision", "buffers-cast-at-lazy-init")
def test_root_dtype_winning_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_get_buffers_and_dtypes_for_computation", "buffers_all_in_root_dtype"))
    assert "'1.scale': 'torch.bfloat16'" in run.failure


@pytest.mark.breaks("05-mixed-precision", "bf16-aligns-flat-params-at-4")
def test_alignment_counted_in_fp32_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{FP}:_get_aligned_numel", "align_in_fp32"))
    assert "bf16 all-gather sizes differs from the expectation" in run.failure
