"""``fsdp-readings estimate --recommend`` on the seeds' worked cases, every expected figure worked by hand from
the model's shape (closed forms over Ψ, the root and one block), never read back from the recommender; and on
bad input (exit 2, the option named) and a job nothing fits (exit 1)."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from mini_gpt import PRESETS, SHAPES, GPTConfig
from tests.study.test_estimate import ANSI, run, run_json, user_models  # noqa: F401 (a fixture)

GB = 10**9
H100 = ["--gpu-memory-gb", "80"]
NVLINK_IB = ["--intra-bandwidth-gbps", "7200", "--bandwidth-gbps", "400"]  # NVLink 4 (900 GB/s), 400G InfiniBand
README = Path(__file__).resolve().parents[2] / "README.md"
GUIDE = Path(__file__).resolve().parents[2] / "readings" / "21-strategy-table.md"


def recommend(argv: list[str]) -> tuple[int, dict]:
    code, doc = run_json(["--recommend", *argv])
    return code, doc["recommend"]


def steps(doc: dict) -> dict[int, dict]:
    return {s["step"]: s for s in doc["steps"]}


# -- the model's sizes by hand: mini_gpt's blocks (qkv, proj, fc, proj, two LayerNorms), the tied embedding --------
def block_numel(d: int) -> int:
    return (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d  # 12d² + 13d


def root_numel(c: GPTConfig) -> int:
    return c.vocab_size * c.n_embd + c.block_size * c.n_embd + 2 * c.n_embd  # tok_emb (= lm_head), pos_emb, ln_f


def psi(c: GPTConfig) -> int:
    return root_numel(c) + c.n_layer * block_numel(c.n_embd)


def test_the_hand_count_is_torchs() -> None:
    import torch

    from mini_gpt import GPT

    for config in (PRESETS["grammar"], SHAPES["grammar-600k"]):
        with torch.device("meta"):
            model = GPT(config)
        assert psi(config) == sum(p.numel() for p in model.parameters())


# -- seed 001: "El tutor de gramática §A13 nunca alcanza el paso 2" ------------------------------------------------
def test_the_grammar_tutor_never_leaves_step_1() -> None:
    c = PRESETS["grammar"]
    code, doc = recommend(["--model", "mini_gpt:grammar", "-n", "4", "--gpu-memory-gb", "16"])
    assert code == 0 and doc["recommended_step"] == 1 and [s["step"] for s in doc["steps"]] == [1]
    tensors = 4 * 12 + 4  # AdamW's step scalar per tensor: 12 per block, tok_emb, pos_emb, ln_f's two
    assert steps(doc)[1]["total_bytes"] == 16 * psi(c) + 4 * tensors
    (traffic,) = steps(doc)[1]["traffic"]
    assert traffic["ops"] == "1 AR" and traffic["sent_bytes"] == 2 * 3 * 4 * psi(c) / 4  # 2(N−1)/N · 4Ψ


# -- seed 001: "El ejemplo de 7B-en-8-H100s está en el paso 3-4" -------------------------------------------------
@pytest.mark.parametrize(
    "reserve, step, total",
    [
        ("0", 2, Fraction(4 * 7 * GB) + Fraction(12 * 7 * GB, 8)),  # ZeRO-1: 2 + 2 + 12/8 bytes per parameter
        ("41.5", 2, Fraction(385, 10) * GB),  # 38.5 of 38.5: spending all of it fits
        ("41.6", 3, Fraction(2 * 7 * GB) + Fraction(14 * 7 * GB, 8)),  # ZeRO-2: 2 + (2 + 12)/8
        ("53.75", 3, Fraction(2625, 100) * GB),
        ("54", 4, Fraction(16 * 7 * GB, 8)),  # ZeRO-3: 16/8
    ],
)
def test_7b_on_8_h100s_walks_as_far_as_the_reserve_pushes_it(reserve: str, step: int, total: Fraction) -> None:
    code, doc = recommend(["7B", "-n", "8", *H100, "--precision", "mixed", "--reserve-gb", reserve])
    assert code == 0 and doc["recommended_step"] == step
    assert steps(doc)[step]["total_bytes"] == total
    assert steps(doc)[1]["total_bytes"] == 16 * 7 * GB  # DDP's fp32 autocast: 4 + 4 + 8
    assert all(not s["fits"] for s in doc["steps"][:-1])


def test_7b_names_what_pushed_each_step() -> None:
    code, out = run(["--recommend", "7B", "-n", "8", *H100, "--precision", "mixed", "--reserve-gb", "54"], 80)
    assert code == 0
    flat = " ".join(out.split())
    assert "step 1, DDP: 112 GB > 26 GB; ZeRO-1 shards the optimizer state (56 GB on every GPU here)" in flat
    assert "step 2, ZeRO-1: 38.5 GB > 26 GB; ZeRO-2 shards the gradients too (14 GB on every GPU here)" in flat
    assert "step 3, ZeRO-2: 26.25 GB > 26 GB; ZeRO-3 shards the parameters too (14 GB on every GPU here)" in flat
    assert "step 4, ZeRO-3 / FSDP: 14 GB ≤ 26 GB: fits, 12 GB left per GPU" in flat
    assert "recommend: step 4, ZeRO-3 over 8 GPUs: 14 GB of 26 GB" in flat


def test_the_gpt3_shape_adds_the_working_memory_a_count_cannot_know() -> None:
    c = SHAPES["gpt3-6.7b"]
    code, doc = recommend(
        ["--model", "mini_gpt:gpt3-6.7b", "-n", "8", *H100, "--precision", "mixed", "--reserve-gb", "55"]
    )
    four = steps(doc)[4]
    # The root (embeddings) kept unsharded beside one block's bf16 parameters and gradient, or the root's gradient.
    root, block = root_numel(c), block_numel(c.n_embd)
    assert four["memory_bytes"]["working"] == 2 * root + max(2 * root, 4 * block)
    assert code == 0 and doc["recommended_step"] == 4


def test_nothing_fits_exits_1() -> None:
    code, doc = recommend(["7B", "-n", "1", "--gpu-memory-gb", "24"])
    assert code == 1 and doc["recommended_step"] is None
    assert [s["tried"] for s in doc["steps"]] == [True, True, True, True, False, False]
    code, out = run(["--recommend", "7B", "-n", "1", "--gpu-memory-gb", "24"], 80)
    assert code == 1 and "nothing fits: no step of the recipe fits 24 GB per GPU" in " ".join(out.split())


# -- seed 000: the 600k-form vocabulary, d_model 4,096 ---------------------------------------------------------
def test_the_600k_vocabulary_is_what_forces_tensor_parallelism() -> None:
    c = SHAPES["grammar-600k"]
    code, doc = recommend(["--model", "mini_gpt:grammar-600k", "-n", "8", "--gpu-memory-gb", "16"])
    assert code == 0 and doc["recommended_step"] == 5
    four, five = steps(doc)[4], steps(doc)[5]
    root = root_numel(c)
    assert root * 4 > 9.8 * GB  # the seed's "10 GB solo para la tabla de embeddings", its fp32 parameters
    assert four["memory_bytes"]["working"] == 8 * root  # the root's fp32 parameters and gradient, unsharded
    assert four["largest"] == "tok_emb.weight (600000×4096)"
    state = sum(v for k, v in four["memory_bytes"].items() if k != "working")
    assert state <= 16 * GB < state + 8 * root
    # TP 4 (TP 2 leaves 8·root/2 ≈ 9.8 GB beside the state): each rank a quarter of tok_emb's and pos_emb's rows.
    assert five["layout"]["tp"] == 4 and five["layout"]["shard"] == 2
    local_root = (c.vocab_size // 4) * c.n_embd + (c.block_size // 4) * c.n_embd + 2 * c.n_embd
    assert five["memory_bytes"]["working"] == 8 * local_root
    assert five["largest"] == "tok_emb.weight (150000×4096)"
    assert [t["what"] for t in five["traffic"]] == ["data parallel", "tensor parallel"]
    tp = five["traffic"][1]
    # 4 all-reduces per block of tokens × d_model (guide 21), one sequence of 128 tokens, fp32, ring of 4.
    assert tp["ops"] == "16 AR" and tp["sent_bytes"] == 16 * 2 * 3 * 128 * 4096 * 4 / 4


# -- seed 001: "Las ejecuciones de frontera 100B+ están en el paso 6" --------------------------------------------
GPT_100B = ["--model", "mini_gpt:gpt-100b", "-n", "256", "--nodes", "32", *H100, "--precision", "mixed"]


def test_100b_on_256_gpus_reaches_pipeline_parallel_over_hsdp() -> None:
    c = SHAPES["gpt-100b"]
    code, doc = recommend([*GPT_100B, *NVLINK_IB, "--tokens", "8192"])
    assert code == 0 and doc["recommended_step"] == 6 and doc["cluster"]["limited_inter_node"]
    four, five, six = steps(doc)[4], steps(doc)[5], steps(doc)[6]
    assert four["layout"]["hybrid"] and four["layout"]["shard"] == 8 and four["layout"]["replicas"] == 32
    state = sum(v for k, v in four["memory_bytes"].items() if k != "working")
    assert abs(state - 16 * psi(c) / 8) < 16 * 81  # 16 bytes per parameter over a node; padding < N per unit
    assert not five["tried"] and "sharded state is what does not fit" in five["verdict"]
    assert six["layout"] == {**six["layout"], "pp": 4, "tp": 1, "shard": 8, "replicas": 8, "hybrid": True}
    # The fullest stage is the first: the root and 80/4 blocks, 16 bytes each over a node, plus the working memory.
    stage = root_numel(c) + 20 * block_numel(c.n_embd)
    held = sum(v for k, v in six["memory_bytes"].items() if k != "working")
    assert abs(held - 16 * stage / 8) < 16 * 21
    assert six["memory_bytes"]["working"] == 2 * root_numel(c) + 4 * block_numel(c.n_embd)
    pipeline = next(t for t in six["traffic"] if t["what"] == "pipeline")
    assert pipeline["level"] == "inter-node" and pipeline["sent_bytes"] == 2 * 8192 * c.n_embd * 2  # both ways


def test_100b_with_links_of_one_speed_shards_over_every_gpu_at_step_4() -> None:
    code, doc = recommend([*GPT_100B, "--intra-bandwidth-gbps", "400", "--bandwidth-gbps", "400"])
    assert code == 0 and doc["recommended_step"] == 4 and not doc["cluster"]["limited_inter_node"]
    four = steps(doc)[4]
    assert four["layout"]["shard"] == 256 and not four["layout"]["hybrid"]
    assert [t["level"] for t in four["traffic"]] == ["inter-node"]


# -- the output ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [60, 80, 100])
def test_every_case_fits_the_terminal(width: int) -> None:
    for argv in (
        ["--model", "mini_gpt:grammar-600k", "-n", "8", "--gpu-memory-gb", "16"],
        [*GPT_100B, *NVLINK_IB, "--tokens", "8192"],
    ):
        code, out = run(["--recommend", *argv], width)
        assert code == 0 and not ANSI.search(out)
        assert max(len(line) for line in out.splitlines()) <= width, out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["7B", "-n", "0", *H100], "-n/--world-size must be at least 1 GPU, not 0"),
        (["7B", "--gpu-memory-gb", "0"], "--gpu-memory-gb must be positive, not 0"),
        (["7B", "--gpu-memory-gb", "-80"], "--gpu-memory-gb must be positive, not -80"),
        (["7B", "--gpu-memory-gb", "lots"], "--gpu-memory-gb must be a number, not 'lots'"),
        (["7B"], "--recommend needs --gpu-memory-gb"),
        (["7B", *H100, "--bandwidth-gbps", "-100"], "--bandwidth-gbps must be positive, not -100 Gbps"),
        (["7B", *H100, "--intra-bandwidth-gbps", "-1"], "--intra-bandwidth-gbps must be positive, not -1 Gbps"),
        (["7B", *H100, "--latency-us", "-5"], "--latency-us cannot be negative, not -5 µs"),
        (["7B", *H100, "--nodes", "3"], "--nodes 3 cannot split 8 GPUs evenly"),
        (["7B", *H100, "--reserve-gb", "-1"], "--reserve-gb cannot be negative, not -1"),
        (["7B", *H100, "--reserve-gb", "80"], "--reserve-gb 80 leaves nothing of a 80 GB GPU"),
        (["7B", *H100, "--tokens", "0"], "--tokens must be positive"),
        (["7B", *H100, "--microbatches", "0"], "--microbatches must be at least 1, not 0"),
        (["7B", *H100, "--strategy", "zero1"], "--recommend chooses the strategy: drop --strategy"),
        (["7B", *H100, "--precision", "int8"], "--precision is fp32 or mixed (bf16 and fp16 are mixed), not 'int8'"),
    ],
)
def test_bad_input_exits_2_naming_the_option(argv: list[str], message: str) -> None:
    code, out = run(["--recommend", *argv], width=200)
    assert code == 2 and message in out, out


# -- what README and guide 21 print are real outputs --------------------------------------------------------------
def readme_example() -> tuple[list[str], str]:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"```text\n\$ fsdp-readings estimate (--recommend [^\n]*)\n(.*?)```", text, re.S)
    assert match, "README.md has no ```text block starting with $ fsdp-readings estimate --recommend"
    return match.group(1).split(), match.group(2)


def test_readme_shows_a_real_output() -> None:
    argv, shown = readme_example()
    code, out = run(argv, 80)
    assert code == 0
    assert shown.rstrip() == "\n".join(line.rstrip() for line in out.splitlines()).rstrip()


def guide_cases(guide: Path = GUIDE) -> dict[str, tuple[list[str], int, str]]:
    """Guide 21's seeds' cases: {case: (its command's arguments, the step the table says the tool stops at, the
    table's cell)}, the commands from the guide's fenced block (a ``# case`` line, then the command, its lines
    joined at a trailing backslash)."""
    text = guide.read_text(encoding="utf-8")
    block = re.search(r"```\n(# the grammar tutor\n.*?)```", text, re.S)
    assert block, "guide 21 has no block of commands starting with '# the grammar tutor'"
    commands: dict[str, list[str]] = {}
    for chunk in re.split(r"^# ", block.group(1), flags=re.M)[1:]:
        case, _, command = chunk.partition("\n")
        words = command.replace("\\\n", " ").split()
        assert words[:3] == ["fsdp-readings", "estimate", "--recommend"], chunk
        commands[case.strip()] = words[2:]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in commands:
            step = re.match(r"step (\d)", cells[1])
            assert step, f"guide 21: {cells[1]!r} does not start with 'step N'"
            rows[cells[0]] = (commands[cells[0]], int(step.group(1)), cells[1])
    assert rows.keys() == commands.keys(), (rows.keys(), commands.keys())
    return rows


def test_guide_21_says_what_the_tool_prints_for_each_seed_case() -> None:
    check_guide_cases(GUIDE)


def test_a_stale_figure_in_guide_21s_table_is_caught(tmp_path: Path) -> None:
    stale = tmp_path / "21-strategy-table.md"
    stale.write_text(
        GUIDE.read_text(encoding="utf-8").replace("| step 2, ZeRO-1: 38.5 GB", "| step 2, ZeRO-1: 39.5 GB")
    )
    with pytest.raises(AssertionError, match=r"39\.5 GB"):
        check_guide_cases(stale)
    wrong_step = tmp_path / "wrong-step.md"
    wrong_step.write_text(GUIDE.read_text(encoding="utf-8").replace("| step 6, PP 4", "| step 5, PP 4"))
    with pytest.raises(AssertionError, match="100B on 256 GPUs"):
        check_guide_cases(wrong_step)


def check_guide_cases(guide: Path) -> None:
    cases = guide_cases(guide)
    assert list(cases) == ["the grammar tutor", "7B on 8 H100s", "the 600k-form vocabulary", "100B on 256 GPUs"]
    for case, (argv, step, cell) in cases.items():
        code, doc = run_json(argv)
        assert code == 0 and doc["recommend"]["recommended_step"] == step, case
        _, out = run(argv, 200)
        flat = " ".join(out.split())
        figures = re.findall(r"\d[\d.,]*\s(?:GB|MB|TB)", cell)
        assert figures, case
        for figure in figures:
            assert figure in flat, (case, figure)


def test_guide_21s_other_figures_are_the_tools() -> None:
    """The seed column's figures that come from other runs of the tool: the 7B thresholds (ZeRO-2's and ZeRO-3's
    totals, 80 GB less ZeRO-1's and ZeRO-2's) and the 100B on links of one speed."""
    _, seven = run(["--recommend", "7B", "-n", "8", *H100, "--precision", "mixed", "--reserve-gb", "54"], 200)
    flat = " ".join(seven.split())
    assert "38.5 GB > 26 GB" in flat and "26.25 GB > 26 GB" in flat and "14 GB ≤ 26 GB" in flat
    assert 80 - 38.5 == 41.5 and 80 - 26.25 == 53.75
    _, same = run(["--recommend", *GPT_100B, "--intra-bandwidth-gbps", "400", "--bandwidth-gbps", "400"], 200)
    flat = " ".join(same.split())
    assert "recommend: step 4, ZeRO-3 over 256 GPUs: 12.43 GB of 80 GB" in flat
    assert re.search(r"4 inter-node data parallel 161 AG, 81 RS 603\.8 GB", flat)
    assert psi(PRESETS["grammar"]) == 462_912
    assert 600_000 * 4096 * 4 == 9_830_400_000


def test_a_model_of_one_unit_is_told_to_name_its_units(user_models: str) -> None:  # noqa: F811 (the fixture)
    code, doc = recommend(["--model", f"{user_models}:mlp", "-n", "8", "--gpu-memory-gb", "0.000009"])
    assert code in (0, 1)
    assert "the model is one unit, gathered whole: --units names the submodules to wrap" in steps(doc)[4]["verdict"]
