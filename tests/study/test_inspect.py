"""``fsdp-readings inspect`` driven in-process on the rank pool: every measured value equal to its prediction on
mini_gpt, torch's ``nn.Transformer`` and (with the ``models`` extra) Hugging Face's GPT-2 and ResNet-18; a model
that runs its units out of registration order reported as a difference; ``--meta`` on a 1.1B GPT-2; every bad
input refused with exit 2 and nothing left running."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from checks.inspect import compare, policy
from reader.commands import inspect as inspect_command
from reader.commands.app import make_console
from tests.study.hugging_face import offline

EXAMPLES = "checks.inspect.examples"
FACTORIES = "tests.study.inspect_factories"
README = Path(__file__).resolve().parents[2] / "README.md"


def run(argv: list[str], width: int = 100) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="fsdp-readings inspect")
    inspect_command.configure(parser)
    console = make_console(record=True, width=width, force_terminal=False, color_system=None)
    code = inspect_command.run(parser.parse_args(argv), console)
    return code, console.export_text()


def run_json(argv: list[str]) -> tuple[int, dict]:
    code, out = run([*argv, "--json"], width=200)
    return code, json.loads(out)


HUGGING_FACE_MODULES = ("transformers", "transformers.models.gpt2.modeling_gpt2",
                        "transformers.models.resnet.modeling_resnet")  # fmt: skip


@pytest.fixture(scope="module")
def hugging_face() -> Iterator[None]:
    with offline(*HUGGING_FACE_MODULES):
        yield


FSDP_SECTIONS = {"units", "layout", "memory", "collectives", "prefetch", "gradients"}
DDP_SECTIONS = {"buckets", "memory", "collectives", "gradients"}
ZERO_SECTIONS = {"units", "layout", "memory", "collectives", "gradients"}
SECTIONS = {"ddp": DDP_SECTIONS, "torch-zero": {*DDP_SECTIONS, "partition"}, **dict.fromkeys(("zero1", "zero2",
            "zero3"), ZERO_SECTIONS)}  # fmt: skip


def _agrees(doc: dict) -> None:
    differing = [row for row in doc["rows"] if not row["agrees"]]
    assert doc["agree"] and not differing, differing
    assert {row["section"] for row in doc["rows"]} == SECTIONS.get(doc["strategy"], FSDP_SECTIONS)


def _rows(doc: dict) -> dict[tuple[str, str], dict]:
    return {(r["section"], r["item"]): r for r in doc["rows"]}


def test_mini_gpt_is_measured_as_predicted() -> None:
    code, doc = run_json([f"{EXAMPLES}:mini_gpt_tiny", "--input", f"{EXAMPLES}:mini_gpt_batch", "--wrap", "Block"])
    assert code == 0
    _agrees(doc)
    rows = {(r["section"], r["item"]): r for r in doc["rows"]}
    # guide 13's figures for mini_gpt tiny at N=2 (AdamW): 103,176 bytes of parameters and of gradients per rank
    assert rows[("memory", "rank 0 params")]["measured"] == 103_176
    assert rows[("gradients", "FSDP against DDP")]["note"] == "bitwise: all 40 parameters"
    pairs = "root→blocks.2 blocks.2→blocks.1 blocks.1→blocks.0"
    assert rows[("prefetch", "BACKWARD_PRE prefetches")]["measured"] == pairs


@pytest.mark.parametrize("strategy", ["full-shard", "fsdp2"])
def test_torchs_transformer_is_measured_as_predicted(strategy: str) -> None:
    wrap = "TransformerEncoderLayer,TransformerDecoderLayer"
    argv = [f"{EXAMPLES}:transformer", "--input", f"{EXAMPLES}:transformer_batch", "--wrap", wrap]
    argv += ["--strategy", strategy]
    code, doc = run_json(argv)
    assert code == 0
    _agrees(doc)
    units = [r["item"] for r in doc["rows"] if r["section"] == "units"]
    assert units == ["encoder.layers.0", "decoder.layers.0", "root"]


# -- DDP, ZeroRedundancyOptimizer and NO_SHARD, against values worked by hand -------------------------------------
# three_linears: Linear(4, 6), Linear(6, 6), Linear(6, 2): 24 + 6, 36 + 6, 12 + 2 = 86 elements in 6 parameters
LINEARS = [f"{FACTORIES}:three_linears", "--input", f"{FACTORIES}:batch"]


def test_ddp_on_three_linears_is_one_bucket_over_the_reversed_parameters() -> None:
    code, doc = run_json([*LINEARS, "--strategy", "ddp"])
    assert code == 0
    _agrees(doc)
    rows = _rows(doc)
    # 344 bytes: under the rebuild's 1 MiB first bucket, so one bucket; no buffers, so no broadcast
    assert rows[("buckets", "bucket 0")]["measured"] == "86 elements in 6 parameters"
    assert [k for k in rows if k[0] == "buckets"] == [("buckets", "bucket 0"),
                                                      ("buckets", "parameters in each bucket, in order")]  # fmt: skip
    assert rows[("collectives", "all_reduce in backward")]["measured"] == "1, 86 elements"
    assert not [k for k in rows if k[0] == "collectives" and "broadcast" in k[1]]
    assert rows[("memory", "rank 1 optim")]["measured"] == 8 * 86 + 4 * 6  # AdamW: two moments, a step each
    assert rows[("gradients", "DDP: elements not a sum of the ranks' gradients / N")]["measured"] == 0


def test_zero_redundancy_partitions_three_linears_greedily() -> None:
    code, doc = run_json([*LINEARS, "--strategy", "torch-zero"])
    assert code == 0
    _agrees(doc)
    rows = _rows(doc)
    # largest first, each to the lightest rank (ties to the lower): 36 → 0, 24 → 1, 12 → 1, 6 → 0, 6 → 1, 2 → 0
    assert rows[("partition", "rank 0 updates")]["measured"] == "44 elements in 3 parameters"
    assert rows[("partition", "rank 1 updates")]["measured"] == "42 elements in 3 parameters"
    assert rows[("memory", "rank 0 optim")]["measured"] == 8 * 44 + 4 * 3
    assert rows[("memory", "rank 1 optim")]["measured"] == 8 * 42 + 4 * 3
    assert rows[("collectives", "broadcast in the optimizer's step")]["measured"] == "6, 86 elements"
    assert rows[("gradients", "DDP + ZeroRedundancyOptimizer against DDP")]["note"] == "bitwise: all 6 parameters"


def test_ddp_broadcasts_the_buffers_before_each_forward_one_tensor_per_dtype() -> None:
    code, doc = run_json([f"{FACTORIES}:normed", "--input", f"{FACTORIES}:batch", "--strategy", "ddp"])
    assert code == 0
    _agrees(doc)
    # running_mean and running_var (12 float32) in one flat tensor, num_batches_tracked (1 int64) in another
    assert _rows(doc)[("collectives", "broadcast in forward")]["measured"] == "2, 13 elements"


def test_no_shard_keeps_each_flat_parameter_whole_and_all_reduces_it() -> None:
    code, doc = run_json([*LINEARS, "--strategy", "no-shard", "--wrap", "Linear"])
    assert code == 0
    _agrees(doc)
    rows = _rows(doc)
    # 24 + 6: the bias starts at element 24, a multiple of 4 (16 bytes), so no alignment padding and no shard
    assert rows[("layout", "0")]["measured"] == "30 = 30 + 0 padding; shard 30"
    assert rows[("collectives", "all_reduce in backward")]["measured"] == "3, 86 elements"
    assert not [k for k in rows if k[0] == "collectives" and "all_gather" in k[1]]


def test_every_strategy_estimate_knows_is_one_a_run_measures() -> None:
    from checks.inspect.predict import MEASURED
    from checks.models.cost import STRATEGIES

    assert sorted(MEASURED) == sorted(STRATEGIES)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_the_reference_zero_stages_on_mini_gpt_hold_guide_13s_figures(strategy: str) -> None:
    code, doc = run_json([f"{EXAMPLES}:mini_gpt_tiny", "--input", f"{EXAMPLES}:mini_gpt_batch", "--wrap", "Block",
                          "--strategy", strategy])  # fmt: skip
    assert code == 0
    _agrees(doc)
    rows = _rows(doc)
    # 51,588 elements in four groups of even size: 25,794 per rank, no padding; AdamW's two moments over the
    # shard and one step scalar per group's master tensor
    assert rows[("memory", "rank 1 optim")]["measured"] == 8 * 25_794 + 4 * 4
    assert rows[("memory", "rank 1 params")]["measured"] == 4 * (51_588 if strategy != "zero3" else 25_794)
    assert rows[("memory", "rank 1 grads")]["measured"] == 4 * (51_588 if strategy == "zero1" else 25_794)
    gathers = "all_gather in the optimizer's step" if strategy != "zero3" else "all_gather in forward"
    assert rows[("collectives", gathers)]["measured"] == "4, 51,588 elements"


def test_reference_zero3_gathers_blocks_that_return_pairs_under_a_root_without_parameters() -> None:
    code, doc = run_json([f"{FACTORIES}:Pairs", "--input", f"{FACTORIES}:batch", "--wrap", "PairBlock",
                          "--strategy", "zero3"])  # fmt: skip
    assert code == 0
    _agrees(doc)
    rows = _rows(doc)
    # no root group: both blocks (20 elements each) are freed after forward and gathered again in backward
    assert [k[1] for k in rows if k[0] == "units"] == ["blocks.0", "blocks.1"]
    assert rows[("collectives", "all_gather in backward")]["measured"] == "2, 40 elements"


@pytest.mark.slow
@pytest.mark.usefixtures("hugging_face")
@pytest.mark.parametrize(
    ("factory", "batch", "wrap", "ranks", "strategy"),
    [("gpt2", "gpt2_batch", "GPT2Block", "2", "full-shard"), ("gpt2", "gpt2_batch", "GPT2Block", "4", "full-shard"),
     ("gpt2", "gpt2_batch", "GPT2Block", "4", "fsdp2-default"), ("gpt2", "gpt2_batch", "none", "4", "ddp"),
     ("resnet18", "image_batch", "ResNetBasicLayer", "2", "full-shard"),
     ("resnet18", "image_batch", "ResNetBasicLayer", "2", "fsdp2"),
     ("resnet18", "image_batch", "ResNetBasicLayer", "2", "no-shard"),
     ("resnet18", "image_batch", "none", "2", "ddp"), ("resnet18", "image_batch", "none", "4", "torch-zero"),
     ("gpt2", "gpt2_batch", "GPT2Block", "2", "zero3"), ("resnet18", "image_batch", "ResNetBasicLayer", "2", "zero2")],
)  # fmt: skip
def test_hugging_face_models_are_measured_as_predicted(factory: str, batch: str, wrap: str, ranks: str,
                                                       strategy: str) -> None:  # fmt: skip
    argv = [f"{EXAMPLES}:{factory}", "--input", f"{EXAMPLES}:{batch}", "--wrap", wrap, "-n", ranks, "--strategy",
            strategy]  # fmt: skip
    code, doc = run_json(argv)
    assert code == 0
    _agrees(doc)


def test_a_model_that_runs_its_units_in_reverse_is_a_difference_and_the_prefetch_still_agrees() -> None:
    code, doc = run_json([f"{FACTORIES}:Reversed", "--input", f"{FACTORIES}:batch", "--wrap", "Linear"])
    assert code == 1
    differing = [(r["section"], r["item"]) for r in doc["rows"] if not r["agrees"]]
    assert differing == [("prefetch", "post-forward order")]
    order = next(r for r in doc["rows"] if r["item"] == "post-forward order")
    assert (order["predicted"], order["measured"]) == ("layers.0 layers.1 layers.2", "layers.2 layers.1 layers.0")
    pre = next(r for r in doc["rows"] if r["item"] == "BACKWARD_PRE prefetches")
    assert pre["note"].startswith("torch ran the units in another order")


def test_meta_inspects_a_billion_parameter_gpt2_with_no_run(hugging_face: None) -> None:
    code, out = run([f"{EXAMPLES}:gpt2_1b", "--meta", "--wrap", "GPT2Block", "-n", "64", "--strategy", "full-shard"],
                    width=160)  # fmt: skip
    assert code == 0
    assert "transformer.h.19" in out and "full-shard" in out
    code, doc = run_json([f"{EXAMPLES}:gpt2_1b", "--meta", "--wrap", "GPT2Block", "-n", "64"])
    assert code == 0 and len(doc["units"]) == 21  # 20 blocks and the root
    assert sum(n for u in doc["units"] for _, n in u["params"]) == 1_114_290_176


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nowhere.to.be.found:build"], "cannot import 'nowhere.to.be.found'"),
        ([f"{FACTORIES}:raises"], "RuntimeError: the config file is missing"),
        ([f"{FACTORIES}:no_parameters", "--input", f"{FACTORIES}:batch"], "has no parameters"),
        ([f"{FACTORIES}:not_a_module"], "returned int, not an nn.Module"),
        ([f"{FACTORIES}:three_linears"], "a run needs --input"),
        (
            [f"{FACTORIES}:three_linears", "--input", f"{FACTORIES}:batch", "--wrap", "Conv2d"],
            "--wrap names Conv2d, which no module of the model is",
        ),
        ([f"{FACTORIES}:huge", "--input", f"{FACTORIES}:batch"], "use --meta"),
        ([f"{FACTORIES}:three_linears", "--input", f"{FACTORIES}:batch", "-n", "3"], "-n 2 or 4"),
        (
            [f"{FACTORIES}:three_linears", "--input", f"{FACTORIES}:batch", "--strategy", "zero4"],
            "unknown strategy 'zero4'; choose one of: ddp, torch-zero, zero1",
        ),
        (
            [
                f"{FACTORIES}:nested",
                "--input",
                f"{FACTORIES}:batch",
                "--strategy",
                "zero2",
                "--wrap",
                "Sequential,Linear",
            ],
            "the reference ZeRO stages take groups that do not nest, and 0.0 is inside 0",
        ),
        (
            [f"{FACTORIES}:three_linears", "--input", f"{FACTORIES}:batch", "--strategy", "ddp", "--wrap", "Linear"],
            "--wrap Linear picks FSDP units, and ddp has none",
        ),
    ],
)
def test_bad_input_exits_2_with_what_to_do(argv: list[str], message: str) -> None:
    code, out = run(argv, width=300)
    assert code == 2
    assert message in " ".join(out.split()), out


def test_a_batch_the_model_rejects_shows_the_models_own_error_and_leaves_nothing_running() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    code, out = run([f"{FACTORIES}:three_linears", "--input", f"{FACTORIES}:wrong_width_batch"], width=300)
    assert code == 2
    assert "rejected the batch" in out and "mat1 and mat2 shapes cannot be multiplied" in out, out
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    # The zygote ranks fork from is kept for the pytest session (checks.ranks.zygote); no rank may be left.
    zygotes = [p for p in left if "checks.ranks.zygote" in " ".join(p.cmdline())]
    assert not [p for p in zygotes if p.children()], [p.children() for p in zygotes]
    ranks = [p for p in left if p not in zygotes]
    assert not [p for p in ranks if p.status() != psutil.STATUS_ZOMBIE], ranks


def test_readme_shows_a_real_output() -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"```text\n\$ fsdp-readings inspect ([^\n]*)\n(.*?)```", text, re.S)
    assert match, "README.md has no ```text block starting with $ fsdp-readings inspect"
    code, out = run(match.group(1).split(), width=80)
    assert code == 0
    assert match.group(2).rstrip() == "\n".join(line.rstrip() for line in out.splitlines()).rstrip()


# -- the comparison and the policy text, torch-free ---------------------------------------------------------------
def test_a_value_off_by_one_byte_or_one_collective_is_a_difference() -> None:
    want = [{"params": 8, "grads": 8, "optim": 20}]
    rows = compare.memory(want, [{"params": 8, "grads": 9, "optim": 20, "unsharded": 0, "buffers": 0}], buffers=0)
    assert [r.item for r in rows if not r.agrees] == ["rank 0 grads"]
    gather = {"op": "all_gather", "numel": 16, "phase": "forward"}
    reduce = {"op": "reduce_scatter", "numel": 16, "phase": "backward"}
    rows = compare.collectives([gather, reduce], [gather])
    missing = ["reduce_scatter in backward", "every payload (op, elements, phase)"]
    assert [r.item for r in rows if not r.agrees] == missing


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("none", None),
        ("size", {"kind": "size", "min_num_params": 100_000_000}),
        ("size:1M", {"kind": "size", "min_num_params": 1_000_000}),
        ("20k", {"kind": "size", "min_num_params": 20_000}),
        ("Block", {"kind": "module", "classes": ["Block"]}),
        ("module:A, B", {"kind": "module", "classes": ["A", "B"]}),
        ("transformer:GPT2Block", {"kind": "transformer", "classes": ["GPT2Block"]}),
    ],
)
def test_wrap_text_names_the_policy(text: str, spec: dict | None) -> None:
    assert policy.parse_wrap(text) == spec


def test_wrap_text_that_names_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="give none, size"):
        policy.parse_wrap("module:")


def test_views_draw_the_runs_layout_memory_and_timeline() -> None:
    argv = [f"{EXAMPLES}:transformer", "--input", f"{EXAMPLES}:transformer_batch", "--wrap",
            "TransformerEncoderLayer,TransformerDecoderLayer", "--view", "layout", "--view", "memory", "--view",
            "timeline", "--rank", "1"]  # fmt: skip
    code, out = run(argv, width=100)
    assert code == 0
    # guide 12's diagram of the root's flat parameter (128 elements, 64 per rank), the memory bars' peak, and a
    # timeline row of the root's all-gather (128 fp32 elements)
    assert "root: 128 elements = 128 in 4 parameters; 2 ranks x 64" in out
    assert "bytes held over the second step" in out and "peak " in out
    assert "rank 1: 4 event recording(s), 1 collective recording(s)" in out
    assert "all_gather 128 fp32 (512 B)" in out


# -- the gradient rows can fail: FSDP1 bent so that it never divides by N ------------------------------------------
def test_an_fsdp_that_sums_instead_of_averaging_is_a_difference(pool) -> None:
    from checks.ranks.protocol import CheckRequest, Patch

    no_division = Patch("torch.distributed.fsdp._runtime_utils:_div_if_needed", "checks.breakit.sabotage:noop")
    kwargs = {"model": f"{EXAMPLES}:mini_gpt_tiny", "batch": f"{EXAMPLES}:mini_gpt_batch",
              "wrap": policy.parse_wrap("Block"), "strategy": "full-shard"}  # fmt: skip
    run_ = pool.run(CheckRequest("checks.inspect.measure:measure", kwargs=kwargs, world_size=2, patches=(no_division,)))
    assert run_.ok, run_.failure
    measured = run_.values()[0]["gradients"]
    rows = {row.item: row for row in compare.gradients(measured, 2)}
    fsdp = rows["FSDP against DDP"]
    assert (fsdp.agrees, fsdp.measured) == (False, "different values")
    apart = measured["apart"]  # twice the mean: as far apart in float64 as in fp32, not rounding
    assert apart["float64"] > apart["max_abs"] * compare.SHRINK and apart["max_rel"] > 0.4
    assert rows["DDP: elements not a sum of the ranks' gradients / N"].agrees  # DDP does not call it


# -- the DDP rows can fail: a reducer that never rebuilds, buffers never broadcast, parameters never re-synced ---
def _bent_report(pool, model: str, strategy: str, patch) -> list[compare.Row]:
    from checks.inspect import predict as prediction
    from checks.ranks.protocol import CheckRequest
    from reader.commands.inspect import _structure, _tree

    kwargs = {"model": model, "batch": f"{FACTORIES}:batch", "wrap": None, "strategy": strategy}
    run_ = pool.run(CheckRequest("checks.inspect.measure:measure", kwargs=kwargs, world_size=2, patches=(patch,)))
    assert run_.ok, run_.failure
    meta, shapes, buffers = _structure(model)
    want = prediction.predict(_tree(meta), shapes, None, strategy=strategy, world_size=2, buffers=buffers)
    return compare.report(want, run_.values(), strategy=strategy, world_size=2, shapes=shapes, buffers=buffers)


def _differing(rows: list[compare.Row]) -> list[tuple[str, str]]:
    return [(r.section, r.item) for r in rows if not r.agrees]


def test_a_reducer_that_never_rebuilds_its_buckets_is_a_difference(pool) -> None:
    from checks.breakit.patches import wrapping
    from checks.guides.g19_ddp_buckets.recipes import pre_forward_without_rebuild

    patch = wrapping("torch.nn.parallel.distributed:DistributedDataParallel._pre_forward",
                     pre_forward_without_rebuild)  # fmt: skip
    rows = _bent_report(pool, f"{FACTORIES}:three_linears", "ddp", patch)
    # the first iteration's bucket holds the parameters in registration order; the rebuild's, in ready order
    assert _differing(rows) == [("buckets", "parameters in each bucket, in order")]


def test_buffers_never_broadcast_are_a_difference(pool) -> None:
    from checks.breakit.patches import skipping

    rows = _bent_report(pool, f"{FACTORIES}:normed", "ddp",
                        skipping("torch.nn.parallel.distributed:DistributedDataParallel._sync_buffers"))  # fmt: skip
    assert _differing(rows) == [("collectives", "broadcast in forward"),
                                ("collectives", "every payload (op, elements, phase)")]  # fmt: skip


def test_a_zero_redundancy_optimizer_that_never_syncs_its_parameters_is_a_difference(pool) -> None:
    from checks.breakit.patches import skipping

    patch = skipping("torch.distributed.optim.zero_redundancy_optimizer:ZeroRedundancyOptimizer._sync_params")
    rows = _bent_report(pool, f"{FACTORIES}:three_linears", "torch-zero", patch)
    assert _differing(rows) == [("collectives", "broadcast in the optimizer's step"),
                                ("collectives", "every payload (op, elements, phase)")]  # fmt: skip


def test_a_bucket_or_a_partition_off_by_one_parameter_is_a_difference() -> None:
    from checks.inspect.predict import ddp_buckets

    shapes = {"a": (4,), "b": (2,), "c": (3,)}
    predicted = {"parameters": list(shapes), "sizes": [4, 2, 3], "buckets": ddp_buckets(shapes, [0, 1, 2], [2, 1, 0])}
    moved = {"ready": [2, 1, 0], "buckets": [[2, 1], [0]]}
    assert [r.item for r in compare.buckets(predicted, moved) if not r.agrees] == [
        "bucket 0", "bucket 1", "parameters in each bucket, in order"]  # fmt: skip
    swapped = compare.partition([["a"], ["b", "c"]], [["b"], ["a", "c"]], {"a": 4, "b": 2, "c": 3})
    assert [r.item for r in swapped if not r.agrees] == ["rank 0 updates", "rank 1 updates", "which parameters"]


def test_views_of_a_ddp_run_show_the_buffer_broadcasts_and_no_flat_parameter() -> None:
    argv = [f"{FACTORIES}:normed", "--input", f"{FACTORIES}:batch", "--strategy", "ddp", "--view", "layout",
            "--view", "memory", "--view", "timeline"]  # fmt: skip
    code, out = run(argv, width=100)
    assert code == 0
    assert "no flat parameter to draw" in out and "bytes held over the third step" in out
    assert "broadcast 12 fp32 (48 B)" in out and "broadcast 1 int64 (8 B)" in out


def test_a_reference_zero_that_never_publishes_its_shards_is_a_difference(pool) -> None:
    from checks.breakit.patches import skipping

    rows = _bent_report(pool, f"{FACTORIES}:three_linears", "zero1", skipping("checks.zero.zero1:Zero1._publish"))
    assert _differing(rows) == [("collectives", "all_gather in the optimizer's step"),
                                ("collectives", "every payload (op, elements, phase)")]  # fmt: skip
