"""Factories to point ``fsdp-readings inspect`` at, and the batches they take: mini_gpt, and three models nobody
here wrote (torch's ``nn.Transformer``, and Hugging Face's GPT-2 and ResNet-18, built from configs without a
download). Each ``*_batch`` returns what ``model(...)`` takes: `checks.inspect.measure` calls it under a seed per
rank and step.

    fsdp-readings inspect checks.inspect.examples:transformer --input checks.inspect.examples:transformer_batch
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

GPT2 = {"vocab_size": 64, "n_positions": 16, "n_embd": 32, "n_layer": 2, "n_head": 2}
GPT2_TOKENS = {"bos_token_id": 0, "eos_token_id": 0}  # GPT-2's 50256 is outside the small vocabulary
GPT2_1B = {"vocab_size": 50257, "n_positions": 2048, "n_embd": 2048, "n_layer": 20, "n_head": 16}
RESNET18 = {"layer_type": "basic", "depths": [2, 2, 2, 2], "hidden_sizes": [64, 128, 256, 512]}


def mini_gpt_tiny() -> nn.Module:
    from mini_gpt import GPT, preset

    return GPT(preset("tiny"))


def mini_gpt_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two sequences of 16 tokens and their targets (mini_gpt returns the loss with them)."""
    tokens = torch.randint(0, 32, (2, 17))
    return tokens[:, :-1], tokens[:, 1:]


def transformer() -> nn.Module:
    """``nn.Transformer`` small enough for a CPU step: width 32, 2 heads, one encoder and one decoder layer."""
    return nn.Transformer(d_model=32, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=64,
                          dropout=0.0, batch_first=True)  # fmt: skip


def transformer_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 5, 32), torch.randn(2, 4, 32)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("these examples need Hugging Face transformers: pip install 'fsdp-readings[models]'") from exc
    return transformers


def gpt2() -> nn.Module:
    """Hugging Face's ``GPT2LMHeadModel`` from a small config (`GPT2`): 2 blocks, width 32, no dropout."""
    tf = _transformers()
    config = tf.GPT2Config(**GPT2, **GPT2_TOKENS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return tf.GPT2LMHeadModel(config)


def gpt2_batch() -> dict[str, torch.Tensor]:
    """Token ids and labels: the model returns its language-modelling loss."""
    ids = torch.randint(0, GPT2["vocab_size"], (2, 8))
    return {"input_ids": ids, "labels": ids}


def gpt2_1b() -> nn.Module:
    """A GPT-2 of about 1.1B parameters (`GPT2_1B`): for ``inspect --meta``, which builds it on the meta device."""
    tf = _transformers()
    return tf.GPT2LMHeadModel(tf.GPT2Config(**GPT2_1B))


def resnet18() -> nn.Module:
    """ResNet-18 with its 1000-class head, from ``transformers``' ``ResNetConfig`` (`RESNET18`): 11,689,512
    parameters, torchvision's count."""
    tf = _transformers()
    return tf.ResNetForImageClassification(tf.ResNetConfig(**RESNET18, num_labels=1000))


def image_batch() -> dict[str, torch.Tensor]:
    """Two 32×32 RGB images and their labels."""
    return {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.randint(0, 1000, (2,))}
