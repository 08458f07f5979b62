"""mini_gpt: presets, deterministic init, tokenizer, batch sharding, and that training learns."""

import dataclasses
import functools
import math
from importlib.resources import files

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_gpt import (
    GPT,
    PRESETS,
    BatchSampler,
    CharTokenizer,
    GPTConfig,
    corpus_tokens,
    default_tokenizer,
    load_corpus,
    make_optimizer,
    preset,
    train,
    train_step,
)
from mini_gpt.__main__ import main
from mini_gpt.model import Block

TINY = preset("tiny")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny matmuls gain little from threads, and oversubscribed threads stall badly on a busy 2-core box.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.cache
def tokens() -> torch.Tensor:
    return corpus_tokens()


def expected_parameters(c: GPTConfig) -> int:
    d = c.n_embd
    ln = 2 * d if c.bias else d
    linear_biases = 9 * d if c.bias else 0  # qkv 3d + attn proj d + fc 4d + mlp proj d
    block = 12 * d * d + linear_biases + 2 * ln
    lm_head = 0 if c.tie_weights else c.vocab_size * d
    return (c.vocab_size + c.block_size) * d + c.n_layer * block + ln + lm_head


def batch(c: GPTConfig, size: int = 4, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return BatchSampler(tokens(), c.block_size, size).global_batch(step)


# --- config and presets -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "target"), [("tiny", 50_000), ("grammar", 500_000)])
def test_preset_parameter_counts(name: str, target: int) -> None:
    config = preset(name)
    model = GPT(config)
    n = model.num_parameters()
    assert n == expected_parameters(config)
    assert 0.75 * target <= n <= 1.25 * target
    # The tied matrix is one parameter, counted once; untying adds exactly one vocab × n_embd matrix.
    assert model.lm_head.weight is model.tok_emb.weight
    untied = GPT(dataclasses.replace(config, tie_weights=False))
    assert untied.num_parameters() == n + config.vocab_size * config.n_embd


def test_presets_use_the_corpus_vocabulary() -> None:
    assert {c.vocab_size for c in PRESETS.values()} == {default_tokenizer().vocab_size}
    assert TINY.n_layer == 3


def test_unknown_preset_lists_the_names() -> None:
    with pytest.raises(ValueError, match=r"unknown preset 'huge'; choose one of: tiny, grammar"):
        preset("huge")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divisible by n_head"):
        GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=3, n_embd=8)
    with pytest.raises(ValueError, match="n_layer must be positive"):
        GPTConfig(vocab_size=8, block_size=8, n_layer=0, n_head=1, n_embd=8)


# --- model ------------------------------------------------------------------------------------


def test_module_names_give_the_fsdp_units() -> None:
    model = GPT(TINY)
    assert [name for name, _ in model.named_children()] == [
        "tok_emb",
        "pos_emb",
        "drop",
        "blocks",
        "ln_f",
        "lm_head",
    ]
    blocks = {name: m for name, m in model.named_modules() if isinstance(m, Block)}
    assert list(blocks) == ["blocks.0", "blocks.1", "blocks.2"]


def test_same_seed_is_bit_identical() -> None:
    a, b = GPT(TINY, seed=7), GPT(TINY, seed=7)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    x, _ = batch(TINY)
    assert torch.equal(a(x)[0], b(x)[0])


def test_different_seeds_differ() -> None:
    a, b = GPT(TINY, seed=0), GPT(TINY, seed=1)
    assert not torch.equal(a.tok_emb.weight, b.tok_emb.weight)
    assert not torch.equal(a.blocks[2].mlp.fc.weight, b.blocks[2].mlp.fc.weight)


def test_construction_neither_uses_nor_disturbs_the_global_rng() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = GPT(TINY)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(456)  # a different global state must not change the weights
    second = GPT(TINY)
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters(), strict=True))


def test_init_follows_nanogpt() -> None:
    model = GPT(preset("grammar"))
    residual_std = 0.02 / math.sqrt(2 * model.config.n_layer)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(residual_std, rel=0.05)
    assert torch.count_nonzero(model.blocks[0].mlp.fc.bias) == 0
    assert torch.equal(model.ln_f.weight, torch.ones_like(model.ln_f.weight))


@pytest.mark.parametrize("name", list(PRESETS))
def test_logits_at_init_are_order_one(name: str) -> None:
    config = preset(name)
    x, y = batch(config)
    logits, loss = GPT(config)(x, y)
    assert logits.shape == (*x.shape, config.vocab_size)
    assert 0.01 < logits.std().item() < 0.5
    # Near-uniform predictions: the loss starts at about ln(vocab_size).
    assert loss.item() == pytest.approx(math.log(config.vocab_size), abs=0.1)


def test_forward_without_targets_and_too_long_input() -> None:
    model = GPT(TINY)
    logits, loss = model(torch.zeros(2, 5, dtype=torch.long))
    assert logits.shape == (2, 5, TINY.vocab_size)
    assert loss is None
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(torch.zeros(1, TINY.block_size + 1, dtype=torch.long))


def test_bf16_forward_and_backward() -> None:
    model = GPT(TINY).to(torch.bfloat16)
    x, y = batch(TINY)
    logits, loss = model(x, y)
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(loss)
    assert model.tok_emb.weight.grad is not None


def test_meta_device_deferred_init_matches_eager() -> None:
    with torch.device("meta"):
        deferred = GPT(TINY)
    assert deferred.tok_emb.weight.is_meta
    deferred.to_empty(device="cpu")
    deferred.init_weights(seed=3)
    eager = GPT(TINY, seed=3)
    assert deferred.lm_head.weight is deferred.tok_emb.weight
    assert all(torch.equal(v, eager.state_dict()[k]) for k, v in deferred.state_dict().items())


def test_generate_appends_greedy_tokens() -> None:
    model = GPT(TINY).eval()
    prompt = torch.tensor([default_tokenizer().encode("la ")])
    out = model.generate(prompt, 5)
    assert out.shape == (1, 8)
    assert torch.equal(out[:, :3], prompt)
    assert out[0, 3].item() == model(prompt)[0][0, -1].argmax().item()


# --- corpus and tokenizer ---------------------------------------------------------------------


def test_corpus_is_the_shipped_file() -> None:
    text = load_corpus()
    assert text == files("mini_gpt").joinpath("data", "corpus.txt").read_text(encoding="utf-8")
    assert 6_000 <= len(text.encode("utf-8")) <= 10_000
    lines = text.splitlines()
    assert len(set(lines)) == len(lines)
    assert all(line.endswith(".") for line in lines)


def test_tokenizer_round_trips_the_corpus() -> None:
    tok = default_tokenizer()
    text = load_corpus()
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert list(tok.chars) == sorted(set(text))
    assert tok is default_tokenizer()  # cached


@given(st.text(alphabet=default_tokenizer().chars, max_size=200))
def test_tokenizer_round_trips_any_vocabulary_text(text: str) -> None:
    assert default_tokenizer().decode(default_tokenizer().encode(text)) == text


def test_unknown_character_is_named() -> None:
    with pytest.raises(ValueError, match=r"character 'Q' at position 3 is not in the vocabulary"):
        default_tokenizer().encode("la Qniña")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        default_tokenizer().decode([-1])
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer("")


# --- batches ----------------------------------------------------------------------------------


def test_global_batch_is_deterministic_and_shifted() -> None:
    sampler = BatchSampler(tokens(), block_size=16, global_batch_size=8, seed=5)
    x, y = sampler.global_batch(3)
    state = torch.get_rng_state()
    again = BatchSampler(tokens(), block_size=16, global_batch_size=8, seed=5).global_batch(3)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(x, again[0])
    assert torch.equal(y, again[1])
    assert torch.equal(x, sampler.global_batch(3)[0])
    assert x.shape == y.shape == (8, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(x, sampler.global_batch(4)[0])
    # The run seed must matter (a seed·2**32 + step packing would lose it to mt19937's 32-bit seeding).
    assert not torch.equal(x, BatchSampler(tokens(), 16, 8, seed=6).global_batch(3)[0])


def test_seeds_beyond_32_bits_are_rejected() -> None:
    # They would alias smaller seeds: torch's CPU generator keeps only the low 32 bits.
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*32\)"):
        BatchSampler(tokens(), 16, 8, seed=2**32)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*32\)"):
        GPT(TINY, seed=2**32)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    global_batch_size=st.integers(1, 24),
    step=st.integers(0, 10_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_shards_concatenate_to_the_global_batch(
    data: st.DataObject, global_batch_size: int, step: int, seed: int
) -> None:
    sampler = BatchSampler(tokens(), block_size=8, global_batch_size=global_batch_size, seed=seed)
    x, y = sampler.global_batch(step)
    divisors = [n for n in range(1, global_batch_size + 1) if global_batch_size % n == 0]
    world_size = data.draw(st.sampled_from(divisors), label="world_size")
    shards = [sampler.shard(step, rank, world_size) for rank in range(world_size)]
    assert torch.equal(torch.cat([sx for sx, _ in shards]), x)
    assert torch.equal(torch.cat([sy for _, sy in shards]), y)

    non_divisor = data.draw(
        st.integers(2, 2 * global_batch_size + 1).filter(lambda n: global_batch_size % n), label="bad"
    )
    with pytest.raises(ValueError, match="not divisible by world_size"):
        sampler.shard(step, 0, non_divisor)


def test_shard_rejects_bad_ranks() -> None:
    sampler = BatchSampler(tokens(), block_size=8, global_batch_size=4)
    for rank in (-1, 2):
        with pytest.raises(ValueError, match="out of range"):
            sampler.shard(0, rank, 2)


# --- training ---------------------------------------------------------------------------------


def test_train_step_updates_the_model() -> None:
    model = GPT(TINY)
    before = model.tok_emb.weight.detach().clone()
    loss = train_step(model, make_optimizer(model, 1e-2), *batch(TINY))
    assert isinstance(loss, float)
    assert not torch.equal(before, model.tok_emb.weight)


def test_loss_falls() -> None:
    seen: list[int] = []
    losses = train(TINY, steps=60, lr=1e-2, batch_size=16, seed=0, on_step=lambda step, _: seen.append(step))
    assert seen == list(range(60))
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5


def test_cli_trains_and_samples(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--steps", "2", "--batch-size", "4", "--sample-length", "10"])
    out = capsys.readouterr().out
    assert "MiniGPT-tiny" in out
    assert "loss: first" in out
    assert "greedy sample:" in out
    with pytest.raises(SystemExit):
        main(["--prompt", "¡Hola!"])
