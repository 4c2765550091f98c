"""Load a llama.cpp GGUF file into fp32 tensors with Hugging Face Llama names.

Tensors are dequantized with ``gguf.quants.dequantize`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1
and every other type the ``gguf`` package implements). llama.cpp's converter permutes the
rows of the Q and K projections so that its RoPE rotates adjacent pairs; Hugging Face's
``rotate_half`` rotates the two halves of each head, so the permutation is undone here.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import torch

from workers.engine.config import ModelConfig
from workers.engine.gguf_metadata import GGUFMetadata
from workers.engine.weights import StateDict, check_state_dict

#: GGUF tensor name -> Hugging Face name, for tensors outside the layer blocks.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

#: GGUF per-block tensor suffix -> Hugging Face per-layer suffix.
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")


def hf_name(gguf_name: str) -> str:
    """The Hugging Face parameter name of a GGUF tensor; ``ValueError`` for unknown tensors."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}"
    raise ValueError(
        f"unsupported GGUF tensor {gguf_name!r} (e.g. llama3 rope_freqs): "
        "only plain Llama checkpoints load"
    )


def gguf_unpermute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: interleaved RoPE pairs -> Hugging Face halves.

    llama.cpp's converter reshapes each head's rows as (2, head_dim/2) and swaps the axes;
    this reshapes as (head_dim/2, 2) and swaps them back.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_config(meta: GGUFMetadata) -> ModelConfig:
    """Hyper-parameters from the ``llama.*`` keys (vocabulary size from the tokenizer if absent)."""
    arch = meta.architecture
    if arch != "llama":
        raise ValueError(f"{meta.path}: architecture {arch!r} is not supported; need 'llama'")
    hidden = int(meta.require("llama.embedding_length"))
    heads = int(meta.require("llama.attention.head_count"))
    rope_dim = meta.get("llama.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != hidden // heads:
        raise ValueError(
            f"{meta.path}: partial RoPE ({rope_dim} of {hidden // heads}) is not supported"
        )
    vocab = meta.get("llama.vocab_size")
    if vocab is None:
        vocab = len(meta.require("tokenizer.ggml.tokens"))
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(meta.require("llama.feed_forward_length")),
        num_hidden_layers=int(meta.require("llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        max_position_embeddings=int(meta.require("llama.context_length")),
        rms_norm_eps=float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        # llama.cpp writes no output.weight when the head shares the embedding matrix.
        tie_word_embeddings=not any(t.name == "output.weight" for t in meta.reader.tensors),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def load_gguf(path: str | Path) -> tuple[ModelConfig, StateDict]:
    """Read ``path``: config from metadata, every tensor dequantized to fp32 with HF names."""
    meta = GGUFMetadata.open(path)
    config = gguf_config(meta)
    state: StateDict = {}
    for tensor in meta.reader.tensors:
        name = hf_name(tensor.name)
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise ValueError(
                f"{meta.path}: tensor {tensor.name} has type {tensor.tensor_type.name}, "
                "which the installed gguf package cannot dequantize"
            ) from exc
        if name.endswith("q_proj.weight"):
            array = gguf_unpermute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = gguf_unpermute(array, config.num_key_value_heads)
        # Copy out of the memory map (and own the memory) before handing it to torch.
        state[name] = torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
    check_state_dict(config, state, str(meta.path))
    return config, state
