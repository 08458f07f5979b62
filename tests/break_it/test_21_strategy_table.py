"""Guide 21: bend the strategies the table's rows describe (ZeRO's broadcast and a kept gradient, FULL_SHARD's
reshard, the tensor-parallel styles and their gradients, the pipeline's messages, orders, IR and gradient scaling,
FSDP2's tensor-parallel placements and its root's reshard) and watch each claim fail for its reason."""

import pytest

from checks.breakit.patches import returning, set_to, skipping, wrapping
from checks.guides.g18_fsdp2_reshard_and_gradients.recipes import root_resharded_anyway
from checks.guides.g21_strategy_table.recipes import (
    colwise_bias_replicated,
    colwise_neighbours_rows,
    doubled_receives,
    doubled_sends,
    first_stage_warms_up_less,
    initialized_every_step,
    input_left_plain,
    keeps_activations,
    keeps_idle_slots,
    last_stage_from_zero,
    rowwise_never_reduced,
    rowwise_reduces_a_copy,
    rowwise_scatter_then_gather,
    runs_1f1b,
    runs_gpipe,
    strided_as_plain,
)
from tests.break_it.conftest import guides, named_rows

ZRO = "torch.distributed.optim.zero_redundancy_optimizer:ZeroRedundancyOptimizer"
STYLE = "torch.distributed.tensor.parallel.style"
STAGE = "torch.distributed.pipelining.stage:_PipelineStageBase"
SCHEDULES = "torch.distributed.pipelining.schedules"

NO_BROADCAST = skipping(f"{ZRO}._sync_params")  # ZeroRedundancyOptimizer never republishes the updated shards
ZERO2_KEEPS_GRADIENTS = skipping("checks.zero.zero2:Zero2._release")  # each full gradient kept after its reduce
FULL_SHARD_KEEPS = set_to("torch.distributed.fsdp._flat_param:RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES", ())
BIAS_REPLICATED = wrapping(f"{STYLE}:ColwiseParallel._partition_linear_fn", colwise_bias_replicated)
NEIGHBOURS_ROWS = wrapping(f"{STYLE}:ColwiseParallel._partition_linear_fn", colwise_neighbours_rows)
SCATTER_GATHER = wrapping(f"{STYLE}:RowwiseParallel._apply", rowwise_scatter_then_gather)
REDUCES_A_COPY = wrapping(f"{STYLE}:RowwiseParallel._apply", rowwise_reduces_a_copy)
NEVER_REDUCED = wrapping(f"{STYLE}:RowwiseParallel._apply", rowwise_never_reduced)
INPUT_PLAIN = wrapping(f"{STYLE}:PrepareModuleInput._prepare_input_arg", input_left_plain)
DOUBLED = (
    wrapping(f"{STAGE}.get_fwd_send_ops", doubled_sends),
    wrapping(f"{STAGE}.get_fwd_recv_ops", doubled_receives),
)
INIT_EVERY_STEP = wrapping(f"{SCHEDULES}:PipelineScheduleSingle._initialize_stage", initialized_every_step)
ONE_F_ONE_B_AS_GPIPE = wrapping(f"{SCHEDULES}:Schedule1F1B._step_microbatches", runs_gpipe)
GPIPE_AS_1F1B = wrapping(f"{SCHEDULES}:ScheduleGPipe._step_microbatches", runs_1f1b)
SHORT_WARMUP = wrapping(f"{SCHEDULES}:Schedule1F1B._step_microbatches", first_stage_warms_up_less)
IDLE_KEPT = wrapping(f"{SCHEDULES}:_add_reduce_grad", keeps_idle_slots)
IR_FIXED = wrapping(f"{SCHEDULES}:Schedule1F1B._get_pipeline_order", last_stage_from_zero)
KEEPS_ACTIVATIONS = wrapping(f"{STAGE}.backward_one_chunk", keeps_activations)
UNSCALED = returning(f"{STAGE}.perform_reduce_grad", None)  # the microbatches' gradients summed, not averaged
STRIDED_AS_PLAIN = wrapping(
    "torch.distributed.fsdp._fully_shard._fsdp_param:FSDPParam._init_sharding_spec_tp", strided_as_plain
)
ROOT_RESHARDED = wrapping("torch.distributed.fsdp._fully_shard._fsdp_state:FSDPState._lazy_init", root_resharded_anyway)
TP_WORST = 1e-6  # the claims' bound; a tolerance a thousand times tighter fails, as the sums are not bitwise
COLUMN_WISE_BIASES = ("attn.q.bias", "attn.k.bias", "attn.v.bias", "mlp.fc.bias")
COLUMN_WISE = ("attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias", "attn.v.weight", "attn.v.bias",
               "mlp.fc.weight", "mlp.fc.bias")  # fmt: skip
# the guide's pp-first-step rows, as the installed torch reads the guide (the block differs from 2.15 on)
FIRST_STEP_ONLY = tuple(guides()["21-strategy-table"].expect_blocks()["pp-first-step"].expected.keys)
# What INIT_EVERY_STEP leaves to step 1: from 2.15, `_initialize_pp_stages` preconnects the point-to-point edges
# under a guard of its own (`initialize_p2p`), which the recipe does not reset.
STILL_FIRST_STEP = [caller for caller in FIRST_STEP_ONLY if caller == "_preconnect_shared_p2p_edges"]
MADE_EVERY_STEP = [caller for caller in FIRST_STEP_ONLY if caller not in STILL_FIRST_STEP]


# -- the data-parallel rows ---------------------------------------------------------------------------------------
@pytest.mark.breaks("21-strategy-table", "data-parallel-rows")
def test_zero_redundancy_without_its_broadcast_is_caught(broken) -> None:
    run = broken(NO_BROADCAST)
    assert (run.reason, run.details["impl"]) == ("collectives-differ-from-model", "torch-zero")
    assert run.details["expected"][("broadcast", False)] == 40
    assert ("broadcast", False) not in run.details["observed"]
    assert named_rows(run) == [
        ("data-parallel-rows", "torch-zero step"),
        ("data-parallel-rows", "torch-zero ring bytes"),
    ]


@pytest.mark.breaks("21-strategy-table", "data-parallel-rows")
def test_a_full_shard_that_keeps_its_parameters_is_caught(broken) -> None:
    """FULL_SHARD that reshards nothing after forward: backward all-gathers nothing, as SHARD_GRAD_OP."""
    run = broken(FULL_SHARD_KEEPS)
    assert (run.reason, run.details["impl"]) == ("collectives-differ-from-model", "full-shard")
    assert run.details["expected"][("all_gather", True)] == 3
    assert ("all_gather", True) not in run.details["observed"]


@pytest.mark.breaks("21-strategy-table", "data-parallel-rows")
def test_a_zero2_that_keeps_its_gradients_is_caught(broken) -> None:
    """Its collectives are unchanged: only the bytes held show it (the comm lines alone would pass)."""
    run = broken(ZERO2_KEEPS_GRADIENTS)
    assert (run.reason, run.details["impl"]) == ("memory-differs-from-model", "zero2")
    assert run.details["observed"]["grads"] > run.details["expected"]["grads"]


@pytest.mark.breaks("21-strategy-table", "data-parallel-rows-at-4")
def test_a_kept_gradient_is_caught_on_4_ranks(broken) -> None:
    run = broken(ZERO2_KEEPS_GRADIENTS)
    assert (run.reason, run.details["impl"]) == ("memory-differs-from-model", "zero2")
    assert named_rows(run) == [("data-parallel-rows", "zero2 memory")]


@pytest.mark.breaks("21-strategy-table", "data-parallel-rows-at-4")
def test_no_broadcast_is_caught_on_4_ranks(broken) -> None:
    run = broken(NO_BROADCAST)
    assert (run.reason, run.details["impl"]) == ("collectives-differ-from-model", "torch-zero")


# -- tensor parallel: shards ----------------------------------------------------------------------------------------
@pytest.mark.breaks("21-strategy-table", "tp-shards")
def test_a_replicated_column_wise_bias_is_caught(broken) -> None:
    run = broken(BIAS_REPLICATED)
    assert (run.reason, run.details["name"]) == ("shard-differs-from-model", "attn.q.bias")
    assert run.details["observed"][0] == "Replicate()"
    assert named_rows(run) == [("tp-shards-2", name) for name in COLUMN_WISE_BIASES]


@pytest.mark.breaks("21-strategy-table", "tp-shards-at-4")
def test_a_replicated_column_wise_bias_is_caught_on_4_ranks(broken) -> None:
    run = broken(BIAS_REPLICATED)
    assert (run.reason, run.details["name"]) == ("shard-differs-from-model", "attn.q.bias")
    assert named_rows(run) == [("tp-shards-4", name) for name in COLUMN_WISE_BIASES]


@pytest.mark.breaks("21-strategy-table", "tp-shards")
def test_the_neighbours_rows_are_caught(broken) -> None:
    """Same placement, same shapes, another slice: the placement and shape comparison alone would pass."""
    run = broken(NEIGHBOURS_ROWS)
    assert (run.reason, run.details["name"]) == ("wrong-slice", "attn.q.weight")


@pytest.mark.breaks("21-strategy-table", "tp-shards-at-4")
def test_the_neighbours_rows_are_caught_on_4_ranks(broken) -> None:
    run = broken(NEIGHBOURS_ROWS)
    assert (run.reason, run.details["name"]) == ("wrong-slice", "attn.q.weight")


# -- tensor parallel: all-reduces -----------------------------------------------------------------------------------
@pytest.mark.breaks("21-strategy-table", "tp-all-reduces")
def test_a_reduce_scatter_and_all_gather_for_the_output_is_caught(broken) -> None:
    """The same ring bytes as the all-reduce (a bytes-only check would pass), in two other collectives."""
    run = broken(SCATTER_GATHER)
    assert run.reason == "collectives-differ-from-model"
    ops = [entry[0] for entry in run.details["observed"]]
    assert ops[:2] == ["reduce_scatter", "all_gather"]


@pytest.mark.breaks("21-strategy-table", "tp-all-reduces")
def test_an_all_reduce_of_another_tensor_is_caught(broken) -> None:
    """Same count, elements, dtype and pass, same values: a check of those alone would pass; the storage the
    all-reduce moved is not the partial output's."""
    run = broken(REDUCES_A_COPY)
    assert run.reason == "wrong-tensor-all-reduced"
    assert [what for _, what in run.details["moved"][:2]] == ["another tensor", "another tensor"]


@pytest.mark.breaks("21-strategy-table", "tp-all-reduces")
def test_an_output_never_reduced_is_caught(broken) -> None:
    run = broken(NEVER_REDUCED)
    assert run.reason == "collectives-differ-from-model"
    assert [entry[3] for entry in run.details["observed"]] == [True] * 4  # backward's only
    assert named_rows(run) == [("tp-all-reduces", "forward: all-reduce 256 of the attn.o output")]


@pytest.mark.breaks("21-strategy-table", "tp-all-reduces-prepared")
def test_a_prepare_module_input_that_does_nothing_is_caught(broken) -> None:
    run = broken(INPUT_PLAIN)
    assert run.reason == "collectives-differ-from-model"
    assert sum(entry[3] for entry in run.details["observed"]) == 4  # q, k and v all-reduce one each again
    assert named_rows(run) == [("tp-all-reduces-prepared", "backward: all-reduce 256 of the attn input gradient")]


@pytest.mark.breaks("21-strategy-table", "tp-all-reduces-prepared")
def test_the_prepared_count_is_checked_against_another_tensor(broken) -> None:
    run = broken(REDUCES_A_COPY)
    assert run.reason == "wrong-tensor-all-reduced"


@pytest.mark.breaks("21-strategy-table", "tp-all-reduces-at-4")
def test_a_scatter_and_gather_is_caught_on_4_ranks(broken) -> None:
    run = broken(SCATTER_GATHER)
    assert run.reason == "collectives-differ-from-model"
    assert named_rows(run) == [("tp-all-reduces-prepared", "forward: all-reduce 256 of the attn.o output")]


# -- tensor parallel: equivalence -----------------------------------------------------------------------------------
@pytest.mark.breaks("21-strategy-table", "tp-equivalence")
def test_an_output_never_reduced_is_not_equivalent(broken) -> None:
    run = broken(NEVER_REDUCED)
    assert (run.reason, run.details["what"], run.details["step"]) == ("not-equivalent", "output", 1)
    assert run.details["error"] > TP_WORST


@pytest.mark.breaks("21-strategy-table", "tp-equivalence")
def test_the_bound_is_checked(broken) -> None:
    run = broken(tolerance=TP_WORST / 1000)
    assert run.reason == "not-equivalent"
    assert TP_WORST / 1000 < run.details["error"] <= TP_WORST


@pytest.mark.breaks("21-strategy-table", "tp-equivalence-at-4")
def test_an_output_never_reduced_is_not_equivalent_on_4_ranks(broken) -> None:
    run = broken(NEVER_REDUCED)
    assert run.reason == "not-equivalent"


# -- pipeline parallel: traffic -------------------------------------------------------------------------------------
@pytest.mark.breaks("21-strategy-table", "pp-traffic-gpipe")
def test_each_activation_sent_twice_is_caught(broken) -> None:
    run = broken(*DOUBLED)
    assert run.reason == "transfers-differ-from-model"
    assert run.details["stage"] in (0, 1)


@pytest.mark.breaks("21-strategy-table", "pp-traffic-gpipe")
def test_shapes_exchanged_every_step_are_caught(broken) -> None:
    """Step 2 exchanges metadata too, so no caller is step 1's alone."""
    run = broken(INIT_EVERY_STEP)
    assert run.reason == "first-step-traffic-differs"
    assert run.details["observed"] == STILL_FIRST_STEP
    assert named_rows(run) == [("pp-first-step", caller) for caller in MADE_EVERY_STEP]


@pytest.mark.breaks("21-strategy-table", "pp-traffic-1f1b")
def test_each_activation_sent_twice_is_caught_under_1f1b(broken) -> None:
    run = broken(*DOUBLED)
    assert (run.reason, run.details["stage"]) == ("transfers-differ-from-model", 0)
    assert named_rows(run) == [("pp-traffic-2", "stage 0")]  # the lowest failing stage's


@pytest.mark.breaks("21-strategy-table", "pp-traffic-at-4")
def test_shapes_exchanged_every_step_are_caught_on_4_stages(broken) -> None:
    run = broken(INIT_EVERY_STEP)
    assert run.reason == "first-step-traffic-differs"
    assert named_rows(run) == [("pp-first-step", caller) for caller in MADE_EVERY_STEP]


# -- pipeline parallel: orders, IR, bubble, activations held ----------------------------------------------------------
@pytest.mark.breaks("21-strategy-table", "pp-bubble-gpipe")
def test_gpipe_running_1f1b_is_caught(broken) -> None:
    run = broken(GPIPE_AS_1F1B)
    assert (run.reason, run.details["stage"]) == ("order-differs-from-model", 0)
    assert run.details["observed"] == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert named_rows(run) == [("gpipe-bubble-2", "gpipe in flight")]  # 1F1B's 2 1, not GPipe's 4 4


@pytest.mark.breaks("21-strategy-table", "pp-bubble-gpipe")
def test_an_ir_with_idle_slots_is_caught(broken) -> None:
    run = broken(IDLE_KEPT)
    assert run.reason == "ir-has-idle-slots"


@pytest.mark.breaks("21-strategy-table", "pp-bubble-1f1b")
def test_1f1b_running_gpipe_is_caught(broken) -> None:
    run = broken(ONE_F_ONE_B_AS_GPIPE)
    assert (run.reason, run.details["stage"]) == ("order-differs-from-model", 0)
    assert run.details["observed"] == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]


@pytest.mark.breaks("21-strategy-table", "pp-bubble-1f1b")
def test_a_first_stage_that_warms_up_less_leaves_a_larger_bubble(broken) -> None:
    """Stage 0 runs F0 B0 F1 B1 …: each backward waits for stage 1's forward and backward of that microbatch."""
    run = broken(SHORT_WARMUP)
    assert run.reason == "bubble-differs-from-formula"
    assert run.details["slots"][0][:4] == ["F0", ".", ".", "B0"]
    assert run.details["observed"] > run.details["expected"]


@pytest.mark.breaks("21-strategy-table", "pp-bubble-1f1b-at-4")
def test_a_short_warm_up_is_caught_on_4_stages(broken) -> None:
    run = broken(SHORT_WARMUP)
    assert run.reason == "bubble-differs-from-formula"


@pytest.mark.breaks("21-strategy-table", "pp-bubble-1f1b")
def test_a_fixed_last_stage_ir_differs_from_the_guide(broken) -> None:
    """The day torch numbers the last stage's forwards from 0, the guide's IR lines (and its note) are stale."""
    run = broken(IR_FIXED)
    assert run.reason == "ir-differs-from-guide"
    assert run.details["observed"][-1] == "rank 1: F0 B0 F1 B1 F2 B2 F3 B3"
    assert named_rows(run) == [("1f1b-ir-2", "rank 1")]


@pytest.mark.breaks("21-strategy-table", "pp-bubble-1f1b")
def test_a_stage_that_keeps_its_activations_is_caught(broken) -> None:
    run = broken(KEEPS_ACTIVATIONS)
    assert run.reason == "in-flight-differs-from-model"
    assert run.details["observed"] != run.details["expected"]
    assert named_rows(run) == [("1f1b-bubble-2", "1f1b in flight")]


@pytest.mark.breaks("21-strategy-table", "pp-bubble-gpipe-at-4")
def test_gpipe_running_1f1b_is_caught_on_4_stages(broken) -> None:
    run = broken(GPIPE_AS_1F1B)
    assert run.reason == "order-differs-from-model"
    assert run.details["stage"] in (1, 2, 3)  # stage 0 warms up all four microbatches either way
    assert named_rows(run) == [("gpipe-bubble-4", "gpipe in flight")]


@pytest.mark.breaks("21-strategy-table", "pp-bubble-1f1b-at-4")
def test_1f1b_running_gpipe_is_caught_on_4_stages(broken) -> None:
    run = broken(ONE_F_ONE_B_AS_GPIPE)
    assert run.reason == "order-differs-from-model"


@pytest.mark.breaks("21-strategy-table", "pp-bubble-1f1b-at-4")
def test_kept_activations_are_caught_on_4_stages(broken) -> None:
    run = broken(KEEPS_ACTIVATIONS)
    assert run.reason == "in-flight-differs-from-model"
    assert named_rows(run) == [("1f1b-bubble-4", "1f1b in flight")]


# -- pipeline parallel: equivalence ---------------------------------------------------------------------------------
@pytest.mark.breaks("21-strategy-table", "pp-equivalence")
def test_unscaled_gradients_differ_from_one_process(broken) -> None:
    run = broken(UNSCALED)
    assert (run.reason, run.details["schedule"], run.details["step"]) == ("gradients-differ", "gpipe", 1)
    assert run.details["observed"] > 0


@pytest.mark.breaks("21-strategy-table", "pp-equivalence-at-4")
def test_unscaled_gradients_differ_on_4_stages(broken) -> None:
    run = broken(UNSCALED)
    assert run.reason == "gradients-differ"


# -- 2D -------------------------------------------------------------------------------------------------------------
@pytest.mark.breaks("21-strategy-table", "two-d-placements")
def test_a_plain_shard_for_a_strided_one_is_caught(broken) -> None:
    run = broken(STRIDED_AS_PLAIN)
    assert (run.reason, run.details["name"]) == ("placements-differ-from-model", "attn.q.weight")
    assert run.details["observed"] == "(Shard(dim=0), Shard(dim=0))"
    assert named_rows(run) == [("two-d-placements", name) for name in COLUMN_WISE]


@pytest.mark.breaks("21-strategy-table", "two-d-placements")
def test_the_neighbours_rows_are_caught_under_fsdp(broken) -> None:
    run = broken(NEIGHBOURS_ROWS)
    assert (run.reason, run.details["name"]) == ("wrong-slice", "attn.q.weight")


@pytest.mark.breaks("21-strategy-table", "two-d-collectives")
def test_a_resharded_root_all_gathers_again_on_dp(broken) -> None:
    run = broken(ROOT_RESHARDED)
    assert run.reason == "dp-collectives-differ-from-model"
    assert [entry[0] for entry in run.details["observed"]] == ["all_gather", "all_gather", "reduce_scatter"]


@pytest.mark.breaks("21-strategy-table", "two-d-collectives")
def test_outputs_never_reduced_are_caught_on_tp(broken) -> None:
    """The dp group's collectives are unchanged: only the tp group's differ."""
    run = broken(NEVER_REDUCED)
    assert run.reason == "tp-collectives-differ-from-model"
    assert named_rows(run) == [("two-d-collectives", "tp all_reduce 256")]  # the first forward all-reduce is gone


@pytest.mark.breaks("21-strategy-table", "two-d-equivalence")
def test_outputs_never_reduced_are_not_equivalent_in_2d(broken) -> None:
    run = broken(NEVER_REDUCED)
    assert run.reason == "not-equivalent"


@pytest.mark.breaks("21-strategy-table", "two-d-equivalence")
def test_the_2d_bound_is_checked(broken) -> None:
    run = broken(tolerance=TP_WORST / 1000)
    assert run.reason == "not-equivalent"
