"""Guide 16: bend FSDP2's per-parameter sharding inside the ranks (the chunk rule, the padding, the local tensor's
storage, the all-gather's copy-in and copy-out) or the spec itself, and watch each claim fail on a shrunk model."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from checks.breakit.patches import wrapping
from checks.guides.g16_fsdp2_per_parameter_sharding.recipes import (
    copy_out_off_by_one,
    frees_regardless,
    fresh_outputs,
    honours_keep,
    one_nth,
    own_local_copy,
    pads_with_ones,
    rolled_inputs,
    split_like_tensor_split,
)
from checks.models.fsdp2_draws import params_of
from tests.break_it.conftest import named_rows

F2 = "torch.distributed.fsdp._fully_shard"
KEEPS = Version(torch.__version__.split("+")[0]) >= Version("2.15")
needs_old = pytest.mark.skipif(KEEPS, reason=f"the claim is for torch < 2.15; this is {torch.__version__}")
needs_new = pytest.mark.skipif(not KEEPS, reason=f"the claim is for torch >= 2.15; this is {torch.__version__}")
TENSOR_SPLIT = wrapping(f"{F2}._fsdp_common:_chunk_with_empty", split_like_tensor_split)
PADS_WITH_ONES = wrapping(f"{F2}._fsdp_param:FSDPParam._init_sharded_param", pads_with_ones)


def example(run) -> dict:
    return run.request.kwargs["example"]


def shapes(run) -> list[tuple[int, ...]]:
    return [shape for _, shape, _ in params_of(example(run))]


# -- (a) the shards ---------------------------------------------------------------------------------------------------
@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "shards-are-the-spec-at-2")
def test_padding_of_ones_is_caught(broken) -> None:
    run = broken(PADS_WITH_ONES)
    assert run.reason == "sharded-param-data-differs"
    # The smallest model that shows it: one parameter with an odd dim 0 (so one rank pads) and elements.
    assert len(shapes(run)) == 1 and shapes(run)[0][0] % 2 == 1


@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "shards-are-the-spec-at-4")
def test_tensor_split_rows_are_caught_at_4(broken) -> None:
    # tensor_split spreads the remainder (9 rows: 3, 2, 2, 2); torch.chunk fills ranks in order (3, 3, 3, 0).
    run = broken(TENSOR_SPLIT)
    assert run.reason in {"local-shape-differs", "sharded-param-data-differs"}
    assert len(shapes(run)) == 1


# -- (b) the all-gather -----------------------------------------------------------------------------------------------
@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "all-gather-reconstructs-at-2")
def test_a_corrupted_copy_out_is_caught(broken) -> None:
    run = broken(wrapping(f"{F2}._fsdp_collectives:foreach_all_gather_copy_out", copy_out_off_by_one))
    assert run.reason == "copy-out-differs"
    assert len(shapes(run)) == 1


@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "all-gather-reconstructs-at-4")
def test_a_corrupted_copy_in_is_caught_at_4(broken) -> None:
    run = broken(wrapping(f"{F2}._fsdp_collectives:_get_param_all_gather_inputs", rolled_inputs))
    assert run.reason == "all-gather-input-differs"
    assert run.details["rank"] == 0


# -- (c) memory -------------------------------------------------------------------------------------------------------
@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "memory-is-shard-bytes-at-2")
def test_a_local_tensor_with_its_own_storage_is_caught(broken) -> None:
    run = broken(wrapping(f"{F2}._fsdp_param:FSDPParam._init_sharded_param", own_local_copy))
    assert run.reason == "memory-differs"
    assert run.details["observed"] > run.details["expected"]


@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "memory-is-shard-bytes-at-4")
def test_a_spec_without_padding_is_caught_at_4(broken) -> None:
    # The spec, not torch, is wrong: numel / N per parameter, as if nothing were padded.
    run = broken(wrapping("checks.models.fsdp2_shards:padded_shard_numel", one_nth))
    assert run.reason == "memory-differs"
    assert run.details["observed"] > run.details["expected"]


# -- (e) keeping the unsharded storage (torch 2.15's option) and the releases before it --------------------------
def _has_elements(run) -> bool:
    return any(all(shape) for shape in shapes(run))


@needs_new
@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "reshard-keeps-storage-when-asked")
def test_a_reshard_that_frees_anyway_is_caught(broken) -> None:
    # 2.13's to_sharded on 2.15: the option is set, the storage freed all the same.
    run = broken(wrapping(f"{F2}._fsdp_param:FSDPParam.to_sharded", frees_regardless))
    assert run.reason == "storage-not-kept"
    assert run.details["observed"] == 0 and run.details["expected"] > 0
    assert len(shapes(run)) == 1 and _has_elements(run)


@needs_new
@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "reshard-keeps-storage-when-asked")
def test_outputs_allocated_anew_are_caught(broken) -> None:
    # Kept bytes, but a new buffer at every unshard: the data pointers CUDA graphs rely on move.
    run = broken(wrapping(f"{F2}._fsdp_param:FSDPParam.init_all_gather_outputs", fresh_outputs))
    assert run.reason == "storage-moved"
    assert len(shapes(run)) == 1 and _has_elements(run)


@needs_old
@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "reshard-frees-regardless-before-2-15")
def test_a_reshard_that_honours_the_attribute_is_caught(broken) -> None:
    # 2.15's to_sharded on an older torch: the attribute now keeps the storage.
    run = broken(wrapping(f"{F2}._fsdp_param:FSDPParam.to_sharded", honours_keep))
    assert run.reason == "unsharded-not-freed"
    assert run.details["observed"] > 0
    assert len(shapes(run)) == 1 and _has_elements(run)


# -- (d) the guide's table --------------------------------------------------------------------------------------------
@pytest.mark.breaks("16-fsdp2-per-parameter-sharding", "nine-rows-on-four")
def test_tensor_split_changes_the_table(broken) -> None:
    run = broken(TENSOR_SPLIT)
    assert run.reason == "layout-differs"
    assert (run.details["line"], run.details["observed"].split("  ")[0]) == (1, "rank 1: w 2x2 b 1 e 0x4 z 0x0")
    # rank 1's row is the first the tensor_split rule makes false (rank 0 still holds 3 rows).
    assert named_rows(run) == [("nine-rows-on-four", "rank 1")]
