"""``fsdp-readings estimate`` driven in-process: its tables and JSON are the cost model's numbers, its per-module
memory is what guide 13 measures on real ranks, the budget guard exits 1 with the arithmetic, bad input exits 2."""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import pytest

from checks.models.cost import STRATEGIES, Plan, estimate, rank_memory
from reader.commands import estimate as estimate_command
from reader.commands import job_inputs
from reader.commands.app import make_console

ANSI = re.compile(r"\x1b\[")


def parser() -> argparse.ArgumentParser:
    """The command's parser as ``fsdp-readings estimate`` builds it (reader.commands.app registers configure/run)."""
    parser = argparse.ArgumentParser(prog="fsdp-readings estimate")
    estimate_command.configure(parser)
    return parser


def run(argv: list[str], width: int = 80) -> tuple[int, str]:
    args = parser().parse_args(argv)
    console = make_console(record=True, width=width, force_terminal=False, color_system=None)
    code = estimate_command.run(args, console)
    return code, console.export_text()


def run_json(argv: list[str]) -> tuple[int, dict]:
    code, out = run([*argv, "--json"], width=200)
    return code, json.loads(out)


def test_a_count_prints_every_strategy_within_80_columns() -> None:
    code, out = run(["7B", "-n", "8"])
    assert code == 0, out
    assert max(len(line) for line in out.splitlines()) <= 80 and not ANSI.search(out)
    rows: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.strip():
            rows.setdefault(line.split()[0], line.split())  # the memory table comes first
    assert rows["zero1"][1:6] == ["28", "GB", "28", "GB", "7"]  # params, grads, optim
    for strategy, total in (("ddp", "112"), ("zero1", "63"), ("zero2", "38.5"), ("zero3", "14")):
        assert re.search(rf"^\s*{strategy}\s.*\s{re.escape(total)} GB\s", out, re.M), strategy
    assert "Ψ = 7,000,000,000 · 8 GPUs on 1 node" in out


def test_json_is_the_models_numbers() -> None:
    code, doc = run_json(["7B", "-n", "8", "--precision", "mixed", "--strategy", "zero1", "--strategy", "zero2"])
    assert code == 0
    assert list(doc["strategies"]) == ["zero1", "zero2"]
    assert doc["strategies"]["zero1"]["total_bytes"] == 38_500_000_000
    assert doc["strategies"]["zero2"]["total_bytes"] == 26_250_000_000
    want = estimate(Plan(7 * 10**9, 8, "zero2", precision="mixed"))
    assert doc["strategies"]["zero2"]["comm"]["time_s"] == float(want.comm.time)
    assert doc["strategies"]["zero2"]["of_ddp"] == float(want.of_ddp)


def test_seeds_print_their_tables_and_figure_1() -> None:
    code, out = run(["--seeds"])
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    flat = " ".join(out.split())
    for text in (
        "63 GB",
        "38.5 GB",
        "26.25 GB",
        "31.40625 GB",
        "1.875 GB",
        "Figure 1",
        "16 B/param",
        "9.8304 GB",
        "~2.3 ms",
        "1.8 ms",
        "≈4.667 s",
        "differs",
        "rounded",
        "exact",
        "$0.90",
    ):
        assert text in flat, text
    assert re.search(r"fp32 Adam .*\n(.*\n)*ZeRO-2\s+28\s+3\.5\s+7\s+38\.5\n", out)
    assert re.search(r"mixed precision .*\n(.*\n)*ZeRO-2\s+14\s+1\.75\s+10\.5\s+26\.25\n", out)
    code, doc = run_json(["--seeds"])
    assert doc["seeds"]["figure_1_gb"]["Pos+g"] == {"paper": "16.6 GB", "exact": 16.640625}
    quantities = {f["quantity"] for f in doc["seeds"]["figures"]}
    assert {"ZeRO-1 memory per GPU, 7B, N=8", "embedding table 600k × 4096, fp32 weights"} <= quantities


def test_the_seeds_budget_passes_with_its_buffer() -> None:
    code, out = run(
        ["500k", "-n", "2", "--strategy", "ddp", "--price-per-gpu-hour", "0.35", "--hours", "3", "--budget", "3.00"]
    )
    assert code == 0, out
    assert "2 GPUs × $0.35/GPU-hour = $0.70/hour × 3 h = $2.10; budget $3.00: within it, $0.90 left" in " ".join(
        out.split()
    )


def test_over_budget_exits_1_with_the_arithmetic() -> None:
    code, out = run(["7B", "-n", "8", "--price-per-gpu-hour", "2.5", "--hours", "10", "--budget", "150"])
    assert code == 1
    assert "8 GPUs × $2.50/GPU-hour = $20.00/hour × 10 h = $200.00; budget $150.00: over it by $50.00, refused" in (
        " ".join(out.split())
    )
    code, doc = run_json(["7B", "-n", "8", "--price-per-gpu-hour", "2.5", "--hours", "10", "--budget", "150"])
    assert code == 1 and doc["budget"]["left"] == -50 and doc["budget"]["ok"] is False


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-5"], "cannot be negative"),
        (["7B", "--strategy", "zero4"], "unknown strategy 'zero4'; choose one of: ddp"),
        (["7B", "-n", "0"], "at least 1 GPU"),
        (["7B", "--nodes", "3"], "cannot split 8 GPUs"),
        (["7B", "--budget", "3"], "--budget needs --price-per-gpu-hour and --hours"),
        ([], "give a parameter count (e.g. 7B), --model mini_gpt:grammar, or --seeds"),
        (["7B", "--model", "mini_gpt:tiny"], "not both"),
        (["--model", "mini_gpt:huge"], "no preset 'huge'; choose one of: tiny, grammar"),
        (["--model", "mini_gpt"], "MODULE:CALLABLE"),
        (["--model", "no_such_module_xyz:build"], "cannot import 'no_such_module_xyz'"),
        (["--model", "mini_gpt:tiny", "--optimizer-bytes", "4"], "name the optimizer instead"),
        (["7B", "--optimizer", "lion"], "knows no optimizer 'lion'"),
        (["7B", "--bandwidth-gbps", "0"], "--bandwidth-gbps must be positive"),
    ],
)
def test_bad_input_exits_2_naming_what_to_do(argv: list[str], message: str) -> None:
    code, out = run(argv, width=200)
    assert code == 2 and message in out, out


@pytest.fixture
def user_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "user_models_for_estimate.py").write_text(
        textwrap.dedent("""
        import torch
        from torch import nn

        def mlp():
            return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Sequential(nn.Linear(20, 30), nn.Linear(30, 5)))

        def data_dependent():
            layer = nn.Linear(4, 4)
            scale = layer.weight.abs().max().item()  # reads a value: impossible on meta
            return layer

        def on_cpu():
            return nn.Linear(4, 4, device="cpu")

        def not_a_module():
            return 42
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_models_for_estimate"
    sys.modules.pop("user_models_for_estimate", None)


def test_a_users_module_is_built_on_meta_with_its_units(user_models: str) -> None:
    code, doc = run_json(["--model", f"{user_models}:mlp", "--units", "2", "-n", "2", "--strategy", "full-shard"])
    assert code == 0, doc
    # root: Linear(10, 20) = 220; unit "2": Linear(20, 30) + Linear(30, 5) = 630 + 155.
    assert doc["model"]["units"] == {"root": 220, "2": 785} and doc["model"]["psi"] == 1005
    params = job_inputs.load_module(f"{user_models}:mlp", ["2"]).params
    assert doc["strategies"]["full-shard"]["total_bytes"] == int(estimate(Plan(params, 2, "full-shard")).memory.total)


@pytest.mark.parametrize(
    "name, message",
    [
        ("data_dependent", "cannot be built on the meta device"),
        ("on_cpu", "not the meta device"),
        ("not_a_module", "returned int, not an nn.Module"),
        ("missing", "has no 'missing'"),
    ],
)
def test_a_module_that_cannot_be_built_on_meta_exits_2(user_models: str, name: str, message: str) -> None:
    code, out = run(["--model", f"{user_models}:{name}"], width=200)
    assert code == 2 and message in out, out


def test_units_match_per_dotted_component() -> None:
    assert job_inputs.unit_of("blocks.0.attn.qkv.weight", ["blocks.*"]) == "blocks.0"
    assert job_inputs.unit_of("blocks.0.attn.qkv.weight", ["blocks.*", "blocks.*.attn"]) == "blocks.0.attn"
    assert job_inputs.unit_of("tok_emb.weight", ["blocks.*"]) == "root"


def test_mini_gpt_is_wrapped_as_guide_13_wraps_it() -> None:
    from checks.workloads.gpt import parameters_of_tiny

    assert job_inputs.load_module("mini_gpt:tiny", None).params == tuple(parameters_of_tiny())


def test_every_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parser().parse_args(["--help"])
    assert done.value.code == 0
    helped = capsys.readouterr().out
    assert "examples:" in helped and "--budget" in helped and "mini_gpt:grammar" in helped


def test_the_estimate_is_what_guide_13_measures_on_mini_gpt(pool) -> None:
    """The fractions of DDP and every byte by category, per rank, on real ranks: guide 13's memory check runs
    every implementation on mini_gpt tiny (N=2, fp32), and the command's per-module numbers are what it measured."""
    from checks.ranks.protocol import CheckRequest

    result = pool.run(CheckRequest("checks.guides.g13_zero_stages.memory:memory_per_rank", world_size=2))
    measured = result.values()
    params = job_inputs.load_module("mini_gpt:tiny", None).params
    code, doc = run_json(["--model", "mini_gpt:tiny", "-n", "2"])
    assert code == 0
    for strategy, rule in STRATEGIES.items():
        plan = Plan(params, 2, strategy)
        for rank, memory in enumerate(rank_memory(plan)):
            assert measured[rank]["bytes"][rule.impl] == memory.by_category(), (strategy, rank)
        fullest = max(measured[r]["totals"][rule.impl] for r in range(2))
        ddp = measured[0]["totals"]["ddp"]
        assert doc["strategies"][strategy]["total_bytes"] == fullest
        assert Fraction(fullest, ddp) == estimate(plan).of_ddp


def test_the_optimizer_is_an_input_per_module_and_for_a_count() -> None:
    # mini_gpt tiny: 51,588 elements in 40 tensors; SGD with momentum keeps one fp32 buffer each, and no step.
    code, doc = run_json(["--model", "mini_gpt:tiny", "-n", "2", "--optimizer", "sgd-momentum", "--strategy", "ddp"])
    assert code == 0 and doc["strategies"]["ddp"]["memory_bytes"]["optim"] == 4 * 51588
    code, doc = run_json(["--model", "mini_gpt:tiny", "-n", "2", "--optimizer", "adam-amsgrad", "--strategy", "ddp"])
    assert doc["strategies"]["ddp"]["memory_bytes"]["optim"] == 12 * 51588 + 4 * 40
    code, doc = run_json(["7B", "-n", "8", "--optimizer", "sgd", "--strategy", "ddp", "--strategy", "zero1"])
    assert doc["strategies"]["ddp"]["total_bytes"] == 8 * 7 * 10**9  # 4 + 4, no state
    code, doc = run_json(["--recommend", "7B", "-n", "8", "--gpu-memory-gb", "80", "--optimizer", "sgd"])
    assert doc["recommend"]["recommended_step"] == 1  # 56 GB of parameters and gradients fit as they are
