"""Hugging Face counterparts of `tests.study.fine_tune_models`' classes, built from small configs without a
download, each with the batch it takes: BERT with its default dropout, T5 (its blocks pass the position bias
through, ``shared`` is also ``encoder.embed_tokens`` and ``decoder.embed_tokens``, and every decoder block reads
the encoder's output), Llama with tied and untied embeddings, Mixtral's fused experts, Switch Transformers'
experts (one module each, called only when a token reaches it), and a frozen BERT with a trained head."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB = 64


def _tf() -> Any:
    import transformers

    return transformers


def bert() -> nn.Module:
    """``BertForSequenceClassification``, dropout 0.1 as BERT's config has it by default."""
    tf = _tf()
    config = tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=16, num_labels=2)  # fmt: skip
    return tf.BertForSequenceClassification(config)


def bert_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, VOCAB, (2, 8)), "labels": torch.randint(0, 2, (2,))}


def frozen_bert() -> nn.Module:
    """BERT with every parameter frozen but the classifier's and the last layer's (a head fine-tune)."""
    model = bert()
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith(("classifier.", "bert.encoder.layer.1.")))
    return model


def t5() -> nn.Module:
    tf = _tf()
    config = tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                         num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)  # fmt: skip
    return tf.T5ForConditionalGeneration(config)


def t5_batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (2, 8))
    return {"input_ids": ids, "labels": torch.randint(1, VOCAB, (2, 6))}


def _llama(tied: bool) -> nn.Module:
    tf = _tf()
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                            tie_word_embeddings=tied)  # fmt: skip
    return tf.LlamaForCausalLM(config)


def llama_tied() -> nn.Module:
    return _llama(True)


def llama() -> nn.Module:
    return _llama(False)


def causal_batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (2, 8))
    return {"input_ids": ids, "labels": ids}


def mixtral() -> nn.Module:
    """Mixtral with 8 experts and top-2 routing. Transformers keeps its experts' weights in fused tensors
    (``MixtralExperts``), so every expert's parameter gets a gradient when any token is routed."""
    tf = _tf()
    config = tf.MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
                              num_experts_per_tok=2, max_position_embeddings=32)  # fmt: skip
    return tf.MixtralForCausalLM(config)


def switch() -> nn.Module:
    """Switch Transformers: 8 experts, top-1 routing, one ``SwitchTransformersDenseActDense`` each, called only
    for the tokens routed to it (``SwitchTransformersExperts.forward``): over 8 tokens a rank, some experts get
    none, and not the same ones on every rank."""
    tf = _tf()
    config = tf.SwitchTransformersConfig(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                         num_sparse_encoder_layers=1, num_decoder_layers=2,
                                         num_sparse_decoder_layers=1, num_heads=4, num_experts=8,
                                         expert_capacity=8, dropout_rate=0.0, decoder_start_token_id=0,
                                         pad_token_id=0)  # fmt: skip
    return tf.SwitchTransformersForConditionalGeneration(config)


def switch_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(1, VOCAB, (1, 8)), "labels": torch.randint(1, VOCAB, (1, 4))}
