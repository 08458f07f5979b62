"""``inspect`` on the setups people fine-tune: frozen parameters, experts no token reaches (on every rank, or
different ones per rank), dropout, a block that returns its input, nested units, weights tied across units, a
module under two names, and an input read twice by each of several units. One small model per class
(`tests.study.fine_tune_models`), run under every strategy it applies to, must agree with its prediction (exit
0) or be refused before the run with its reason (exit 2, ``--json``'s ``reason``); no class may crash or DIFFER.
The Hugging Face counterparts (`tests.study.hugging_face_models`) run in the slow tests where transformers is
installed."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from checks.inspect.predict import MEASURED
from reader.commands import inspect as inspect_command
from reader.commands.app import make_console
from tests.study.hugging_face import offline

MODELS = "tests.study.fine_tune_models"
HF = "tests.study.hugging_face_models"
DDP = ("ddp", "torch-zero")


@dataclass(frozen=True)
class Case:
    model: str
    batch: str
    wrap: str
    extra: tuple[str, ...] = ()

    def argv(self, strategy: str, world_size: int = 2) -> list[str]:
        wrap = [] if strategy in DDP else ["--wrap", self.wrap]
        return [self.model, "--input", self.batch, "--strategy", strategy, "-n", str(world_size), *wrap, *self.extra,
                "--json"]  # fmt: skip


def small(model: str, batch: str, wrap: str, *extra: str) -> Case:
    return Case(f"{MODELS}:{model}", f"{MODELS}:{batch}", wrap, extra)


CASES = {
    "frozen": small("frozen", "batch", "LoraBlock"),
    "experts-unreached": small("experts", "experts_batch", "Expert"),
    "experts-unreached-find-unused": small("experts", "experts_batch", "Expert", "--find-unused-parameters"),
    "experts-per-rank": small("experts", "experts_by_rank_batch", "Expert"),
    "experts-per-rank-one-unit": small("experts", "experts_by_rank_batch", "none"),
    "experts-per-rank-find-unused": small("experts", "experts_by_rank_batch", "Expert", "--find-unused-parameters"),
    "dropout": small("dropout", "batch", "Linear"),
    "pass-through": small("pass_through", "batch", "BiasBlock"),
    "nested-units": small("parent_and_children", "batch", "Outer,Inner"),
    "tied-in-one-unit": small("tied_head", "tokens", "Inner"),
    "tied-across-units": small("tied_head", "tokens", "Embedding,Linear"),
    "two-names": small("two_names", "tokens", "Inner"),
    "two-names-wrapped": small("two_names", "tokens", "Embedding"),
    "input-read-twice-per-unit": small("fan_out", "batch", "Decoder"),
}

NON_DDP = tuple(s for s in MEASURED if s not in DDP)
FSDP = ("full-shard", "shard-grad-op", "no-shard", "fsdp2", "fsdp2-default", "fsdp2-no-reshard")
FSDP2 = ("fsdp2", "fsdp2-default", "fsdp2-no-reshard")
REFERENCE = ("zero1", "zero2", "zero3")
# (case, strategy) -> the refusal's reason; every other pair must agree. The find-unused cases are DDP's only.
REFUSED = {
    **{("experts-unreached", s): "no-gradient-under-ddp" for s in DDP},
    **{("experts-unreached", s): "no-gradient-under-reference-zero" for s in REFERENCE},
    **{("experts-per-rank", s): "no-gradient-under-ddp" for s in DDP},
    **{("experts-per-rank", s): "unit-runs-on-some-ranks" for s in (*FSDP, "zero3")},
    **{("experts-per-rank", s): "no-gradient-under-reference-zero" for s in ("zero1", "zero2")},
    **{("experts-per-rank-one-unit", s): "no-gradient-under-ddp" for s in DDP},
    **{("experts-per-rank-one-unit", s): "gradient-on-some-ranks-fsdp2" for s in FSDP2},
    **{("experts-per-rank-one-unit", s): "no-gradient-under-reference-zero" for s in REFERENCE},
    **{("tied-across-units", s): "tied-across-units" for s in ("full-shard", "shard-grad-op", *FSDP2, "zero3")},
    **{("two-names-wrapped", s): "module-under-two-names" for s in ("full-shard", "shard-grad-op", "no-shard")},
    **{("nested-units", s): "nested-units-under-reference-zero" for s in REFERENCE},
}
PAIRS = [(case, strategy) for case in CASES for strategy in (DDP if case.endswith("find-unused") else MEASURED)]
# One pair per outcome each class can have, in the default run; every pair in the slow one.
QUICK = {
    ("frozen", "ddp"), ("frozen", "full-shard"), ("frozen", "fsdp2"), ("frozen", "zero3"),
    ("experts-unreached", "ddp"), ("experts-unreached-find-unused", "ddp"), ("experts-unreached", "fsdp2"),
    ("experts-unreached", "zero1"), ("experts-per-rank", "full-shard"), ("experts-per-rank-one-unit", "fsdp2"),
    ("experts-per-rank-one-unit", "full-shard"), ("experts-per-rank-find-unused", "torch-zero"),
    ("dropout", "full-shard"), ("pass-through", "zero3"), ("nested-units", "full-shard"),
    ("tied-across-units", "full-shard"), ("tied-across-units", "no-shard"), ("two-names", "fsdp2"),
    ("two-names-wrapped", "full-shard"), ("two-names-wrapped", "fsdp2"), ("input-read-twice-per-unit", "fsdp2"),
}  # fmt: skip


def run_json(argv: list[str]) -> tuple[int, dict]:
    parser = argparse.ArgumentParser(prog="fsdp-readings inspect")
    inspect_command.configure(parser)
    console = make_console(record=True, width=200, force_terminal=False, color_system=None)
    code = inspect_command.run(parser.parse_args(argv), console)
    return code, json.loads(console.export_text())


def _outcome(code: int, doc: dict) -> str:
    """ "agree", or the refusal's reason; anything else is shown whole."""
    if code == 0 and doc.get("agree"):
        return "agree"
    if code == 2 and "reason" in doc:
        return doc["reason"]
    differing = [(r["section"], r["item"], r["predicted"], r["measured"], r.get("differs")) for r in doc.get("rows", ())
                 if not r["agrees"]]  # fmt: skip
    return f"exit {code}: {differing or doc}"


def _params(pairs: list[tuple[str, str]], quick: set[tuple[str, str]]) -> list:
    return [pytest.param(c, s, id=f"{c}-{s}", marks=() if (c, s) in quick else pytest.mark.slow) for c, s in pairs]


@pytest.mark.parametrize(("case", "strategy"), _params(PAIRS, QUICK))
def test_each_fine_tuning_class_agrees_or_is_refused_for_its_reason(case: str, strategy: str) -> None:
    code, doc = run_json(CASES[case].argv(strategy))
    assert _outcome(code, doc) == REFUSED.get((case, strategy), "agree")


def test_a_refusal_says_what_the_model_did_and_what_to_do() -> None:
    code, doc = run_json(CASES["experts-unreached"].argv("ddp"))
    assert (code, doc["reason"], doc["exit"]) == (2, "no-gradient-under-ddp", 2)
    assert "experts.2.fc.weight" in doc["error"] and "--find-unused-parameters" in doc["error"]
    code, doc = run_json(CASES["experts-per-rank"].argv("fsdp2"))
    assert (code, doc["reason"]) == (2, "unit-runs-on-some-ranks")
    assert doc["error"].startswith("unit experts.0 runs its forward on rank 0 and not on the others")


def test_four_ranks_each_reaching_its_own_expert_train_under_ddp_with_find_unused_parameters() -> None:
    code, doc = run_json(CASES["experts-per-rank-find-unused"].argv("ddp", world_size=4))
    assert _outcome(code, doc) == "agree"
    rows = {(r["section"], r["item"]): r for r in doc["rows"]}
    # one bucket (never rebuilt under find_unused_parameters), then the used map: an int32 per parameter tensor
    elements, tensors = 8 * 3 + 3 + 3 * (8 * 8 + 8) + 8 * 2 + 2, 2 + 3 * 2 + 2  # gate, three experts, head
    assert rows[("collectives", "all_reduce in backward")]["measured"] == f"2, {elements + tensors} elements"


def test_summation_order_is_told_from_different_values_and_sized() -> None:
    code, doc = run_json(CASES["input-read-twice-per-unit"].argv("fsdp2"))
    assert _outcome(code, doc) == "agree"
    row = next(r for r in doc["rows"] if r["item"] == "FSDP against DDP")
    assert "elements differ" in row["note"] and row["note"].endswith("in float64: summation order")


# -- Hugging Face ---------------------------------------------------------------------------------------------------
HF_MODULES = ("transformers", "transformers.models.bert.modeling_bert", "transformers.models.t5.modeling_t5",
              "transformers.models.llama.modeling_llama", "transformers.models.mixtral.modeling_mixtral")  # fmt: skip


@pytest.fixture(scope="module")
def hugging_face() -> Iterator[None]:
    with offline(*HF_MODULES):
        yield


def hf(model: str, batch: str, wrap: str, *extra: str) -> Case:
    return Case(f"{HF}:{model}", f"{HF}:{batch}", wrap, extra)


HF_CASES = {
    "bert-dropout": hf("bert", "bert_batch", "BertLayer"),
    "bert-frozen": hf("frozen_bert", "bert_batch", "BertLayer"),
    "t5": hf("t5", "t5_batch", "T5Block"),
    "llama-tied": hf("llama_tied", "causal_batch", "LlamaDecoderLayer"),
    "llama-tied-across-units": hf("llama_tied", "causal_batch", "LlamaDecoderLayer,Embedding"),
    "llama": hf("llama", "causal_batch", "LlamaDecoderLayer"),
    "mixtral-fused-experts": hf("mixtral", "causal_batch", "MixtralDecoderLayer"),
    "switch-experts": hf("switch", "switch_batch", "SwitchTransformersBlock"),
    "switch-experts-find-unused": hf("switch", "switch_batch", "SwitchTransformersBlock", "--find-unused-parameters"),
    "switch-expert-units": hf("switch", "switch_batch", "SwitchTransformersDenseActDense"),
}
HF_STRATEGIES = ("ddp", "full-shard", "fsdp2", "zero3")
HF_REFUSED = {
    **{("llama-tied-across-units", s): "tied-across-units" for s in ("full-shard", "fsdp2", "zero3")},
    ("switch-experts", "ddp"): "no-gradient-under-ddp",
    ("switch-experts", "fsdp2"): "gradient-on-some-ranks-fsdp2",
    ("switch-experts", "zero3"): "no-gradient-under-reference-zero",
    ("switch-expert-units", "ddp"): "no-gradient-under-ddp",
    **{("switch-expert-units", s): "unit-runs-on-some-ranks" for s in ("full-shard", "fsdp2", "zero3")},
}
HF_PAIRS = [(c, s) for c in HF_CASES for s in (("ddp",) if c.endswith("find-unused") else HF_STRATEGIES)]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "strategy"), [pytest.param(c, s, id=f"{c}-{s}") for c, s in HF_PAIRS])
def test_hugging_face_counterparts_agree_or_are_refused_for_their_reason(hugging_face: None, case: str,
                                                                        strategy: str) -> None:  # fmt: skip
    code, doc = run_json(HF_CASES[case].argv(strategy))
    assert _outcome(code, doc) == HF_REFUSED.get((case, strategy), "agree")


# -- errors: JSON with --json, a failed run in the user's terms, exit 2 never 1 ------------------------------------
def test_bad_input_under_json_is_json_with_its_reason_and_fix() -> None:
    code, doc = run_json([f"{MODELS}:frozen", "--input", f"{MODELS}:batch", "--wrap", "NoSuchBlock", "--json"])
    assert (code, doc["exit"], doc["reason"]) == (2, 2, "bad-input")
    assert doc["error"].startswith("--wrap names NoSuchBlock, which no module of the model is")
    code, doc = run_json([f"{MODELS}:frozen", "--input", f"{MODELS}:batch", "--find-unused-parameters", "--json"])
    assert (code, doc["reason"]) == (2, "bad-input") and "DDP's option" in doc["error"]


def test_a_run_that_fails_names_the_rank_and_what_it_raised() -> None:
    from checks.ranks.protocol import CheckRequest, CheckRun, RankResult

    request = CheckRequest("checks.inspect.measure:measure", world_size=2)
    died = RankResult(rank=1, ok=False, error="Fatal Python error: Aborted", signal="SIGABRT")
    raised = RankResult(rank=0, ok=False, error="Traceback ...", error_type="builtins.RuntimeError",
                        message="size mismatch, got input (6), mat (6x8), vec (64)\nmore")  # fmt: skip
    args = argparse.Namespace(model="m:f", world_size=2, timeout=300.0)
    problem = inspect_command.rank_failure(CheckRun(request, [died], failure="rank 1: SIGABRT"), args, "fsdp2")
    assert problem.message.splitlines()[0] == "the fsdp2 run of m:f on 2 ranks: rank 1 died of SIGABRT"
    assert (problem.code, problem.reason) == (2, "run-failed")
    problem = inspect_command.rank_failure(CheckRun(request, [raised], failure="..."), args, "full-shard")
    assert problem.message.splitlines()[0] == ("the full-shard run of m:f on 2 ranks: rank 0 raised RuntimeError: "
                                               "size mismatch, got input (6), mat (6x8), vec (64)")  # fmt: skip
    assert "--strategy ddp" in problem.fix


def test_a_model_in_the_current_directory_is_importable_as_python_m_would_make_it(tmp_path: Path) -> None:
    """The console script puts its own directory first on the import path, not the current one: ``inspect`` adds
    the current directory, and the ranks it starts inherit it."""
    import subprocess
    import sys

    (tmp_path / "my_model.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "def build():\n    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))\n\n"
        "def batch():\n    return torch.randn(2, 4)\n",
        encoding="utf-8",
    )
    script = Path(sys.executable).parent / "fsdp-readings"
    argv = [str(script), "inspect", "my_model:build", "--input", "my_model:batch", "--wrap", "Linear", "--json"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["agree"] is True
    done = subprocess.run([str(script), "inspect", "nowhere_xyz:build", "--meta"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 2 and f"neither from the current directory ({tmp_path})" in " ".join(done.stdout.split())
    assert "--model" not in done.stdout
