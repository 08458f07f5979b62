"""Guide 05: bend mixed precision and watch the claims fail."""

import pytest

from checks.breakit.patches import set_to, skipping, wrapping
from checks.guides.g05_mixed_precision import (
    align_in_fp32,
    buffer_casts_down_only,
    buffers_all_in_root_dtype,
    gather_then_scale,
    reduce_dtype_ignored,
    root_input_uncast,
    root_pre_forward_casting_buffers,
)
from checks.workloads.gpt import padded_sizes

RU = "torch.distributed.fsdp._runtime_utils"
FP = "torch.distributed.fsdp._flat_param"
NO_PARAM_MIXED_PRECISION = set_to(f"{FP}:FlatParamHandle._uses_param_mixed_precision", False)


@pytest.mark.breaks("05-mixed-precision", "inputs-in-bf16")
def test_an_uncast_root_input_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_root_cast_forward_input", root_input_uncast))
    assert (run.reason, run.details) == ("input-dtype", {"unit": "root", "observed": "torch.float32"})


@pytest.mark.breaks("05-mixed-precision", "bf16-aligns-flat-params")
def test_alignment_counted_in_fp32_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:_get_aligned_numel", align_in_fp32))
    assert run.reason == "all-gather-sizes" and run.details["what"] == "bf16 all-gather sizes"
    assert run.details["observed"] == list(padded_sizes(2, 4).values())  # fp32-aligned lengths


@pytest.mark.breaks("05-mixed-precision", "collectives-move-bf16")
def test_fp32_all_gathers_are_caught(broken) -> None:
    run = broken(NO_PARAM_MIXED_PRECISION)
    # The layout stays bf16-aligned (3,532): only the cast before the all-gather is gone.
    assert run.reason == "not-bf16"
    assert any("all_gather 3532 × float32" in line for line in run.details["observed"])


@pytest.mark.breaks("05-mixed-precision", "params-and-grads-stay-fp32")
def test_gradients_left_in_bf16_are_caught(broken) -> None:
    # The reduced shard stays bf16; torch itself then refuses to hand it to the fp32 parameter, so the check
    # stops there rather than at its own dtype assertion.
    run = broken(skipping(f"{RU}:_cast_grad_to_param_dtype"))
    assert run.reason is None and run.error_types == {"builtins.RuntimeError"}
    assert all("attempting to assign a gradient with dtype 'c10::BFloat16'" in r.message for r in run.failed)


@pytest.mark.breaks("05-mixed-precision", "bf16-logits-within-one-epsilon")
def test_a_lossy_all_gather_exceeds_the_tolerance(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._all_gather_flat_param", gather_then_scale))
    assert run.reason == "logits-out-of-bound" and run.details["ratio"] > 1.0


@pytest.mark.breaks("05-mixed-precision", "bf16-logits-within-one-epsilon")
def test_no_bf16_at_all_is_caught(broken) -> None:
    run = broken(NO_PARAM_MIXED_PRECISION)
    assert (run.reason, run.details["observed"]) == ("logits-not-bf16", "torch.float32")


@pytest.mark.breaks("05-mixed-precision", "buffers-cast-at-lazy-init")
def test_buffers_left_uncast_are_caught(broken) -> None:
    run = broken(skipping(f"{RU}:_cast_buffers_to_dtype_and_device"))
    assert run.reason == "buffer-dtypes"
    assert run.details["observed"]["0.scale"] == "torch.float32"


@pytest.mark.breaks("05-mixed-precision", "buffers-cast-at-lazy-init")
def test_root_dtype_winning_is_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_get_buffers_and_dtypes_for_computation", buffers_all_in_root_dtype))
    assert run.reason == "buffer-dtypes"
    assert run.details["observed"]["1.scale"] == "torch.bfloat16"


@pytest.mark.breaks("05-mixed-precision", "bf16-aligns-flat-params-at-4")
def test_alignment_counted_in_fp32_is_caught_on_4_ranks(broken) -> None:
    run = broken(wrapping(f"{FP}:_get_aligned_numel", align_in_fp32))
    assert run.reason == "all-gather-sizes"
    assert run.details["observed"] == list(padded_sizes(4, 4).values())


@pytest.mark.breaks("05-mixed-precision", "fp16-aligns-like-bf16")
def test_fp16_alignment_counted_in_fp32_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:_get_aligned_numel", align_in_fp32))
    assert run.reason == "all-gather-sizes" and run.details["what"] == "fp16 all-gather sizes"
    assert run.details["observed"] == list(padded_sizes(2, 4).values())


@pytest.mark.breaks("05-mixed-precision", "fp32-reduce-scatters")
def test_an_ignored_reduce_dtype_is_caught(broken) -> None:
    run = broken(wrapping(f"{FP}:FlatParamHandle._init_param_reduce_dtypes", reduce_dtype_ignored))
    assert run.reason == "reduce-dtype"
    assert run.details["observed"] and all("reduce_scatter" in line for line in run.details["observed"])
    assert any("bfloat16" in line for line in run.details["observed"])


@pytest.mark.breaks("05-mixed-precision", "buffers-full-precision-in-eval")
def test_buffers_left_low_in_eval_are_caught(broken) -> None:
    run = broken(wrapping(f"{RU}:_cast_buffers_to_dtype_and_device", buffer_casts_down_only))
    assert run.reason == "eval-not-full-precision"
    observed = run.details["observed"]
    assert (observed["0.scale"], observed["1.scale"]) == ("torch.bfloat16", "torch.float16")


@pytest.mark.breaks("05-mixed-precision", "buffers-cast-at-lazy-init")
def test_buffers_cast_at_every_forward_are_caught(broken) -> None:
    # The check puts the float buffers back in fp32 after the first forward; a cast at the next forward shows.
    run = broken(wrapping(f"{RU}:_root_pre_forward", root_pre_forward_casting_buffers))
    assert run.reason == "cast-again"
    assert (run.details["observed"]["0.scale"], run.details["observed"]["1.scale"]) == (
        "torch.bfloat16",
        "torch.float16",
    )
