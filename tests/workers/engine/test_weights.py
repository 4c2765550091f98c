"""Weight loaders: tiny-random, GGUF (every supported tensor type, Q/K permutation) and safetensors.

The reference throughout is Hugging Face ``transformers``: its ``LlamaForCausalLM`` must
accept our state dicts strictly, and its own GGUF reader must agree with ours.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workers.engine.config import ModelConfig
from workers.engine.weights import (
    TINY_CONFIG,
    StateDict,
    load_model_weights,
    model_config,
    param_shapes,
    tiny_random,
)
from workers.engine.weights_gguf import load_gguf

Q = gguf.GGMLQuantizationType

#: A tiny shape whose rows are multiples of the 32-value quantization blocks.
SMALL = replace(TINY_CONFIG, vocab_size=256, max_position_embeddings=128)

#: Which GGML type each parameter of the round-trip file is stored as.
TYPES = {
    "model.embed_tokens.weight": Q.F32,
    "lm_head.weight": Q.F16,
    "self_attn.q_proj.weight": Q.Q8_0,
    "self_attn.k_proj.weight": Q.Q4_0,
    "self_attn.v_proj.weight": Q.Q4_1,
    "self_attn.o_proj.weight": Q.F16,
    "mlp.gate_proj.weight": Q.Q8_0,
    "mlp.up_proj.weight": Q.Q4_0,
    "mlp.down_proj.weight": Q.Q4_1,
}

#: Hugging Face suffix -> GGUF tensor name (the inverse of the loader's table, spelled out).
GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """``permute`` from llama.cpp's convert_hf_to_gguf.py, verbatim in behaviour."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def hf_model(config: ModelConfig, state: StateDict) -> LlamaForCausalLM:
    """transformers' Llama with exactly ``state`` loaded (strict; tied head shares embeddings)."""
    model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict())).eval()
    full = dict(state)
    if config.tie_word_embeddings:
        full["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(full, strict=True)
    return model


def gguf_name(hf: str) -> str:
    globals_ = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in globals_:
        return globals_[hf]
    _, _, layer, suffix = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[suffix]}"


def new_writer(path: Path, config: ModelConfig) -> gguf.GGUFWriter:
    """A GGUF writer with llama.cpp's metadata for ``config``."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    return writer


def close_writer(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_gguf(path: Path, config: ModelConfig, state: StateDict) -> dict[str, np.ndarray]:
    """Write ``state`` as llama.cpp would (types from TYPES); return what each tensor must load as."""
    writer = new_writer(path, config)
    expected: dict[str, np.ndarray] = {}
    for name, tensor in state.items():
        array = tensor.numpy()
        if name.endswith("q_proj.weight"):
            stored = llama_cpp_permute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            stored = llama_cpp_permute(array, config.num_key_value_heads)
        else:
            stored = array
        qtype = next((t for k, t in TYPES.items() if name.endswith(k)), Q.F32)
        quantized = gguf.quants.quantize(stored, qtype)
        writer.add_tensor(gguf_name(name), quantized, raw_dtype=qtype)
        # What the loader must return: the quantization error, in HF row order.
        back = gguf.quants.dequantize(quantized, qtype)
        if name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
            rows = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            d = back.shape[0] // rows // 2
            back = back.reshape(rows, d, 2, -1).swapaxes(1, 2).reshape(back.shape)
        expected[name] = back
    close_writer(writer)
    return expected


def test_tiny_random_is_deterministic_and_fits_transformers() -> None:
    config, state = tiny_random(seed=0)
    _, again = tiny_random(seed=0)
    _, other = tiny_random(seed=1)
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert not torch.equal(state["model.norm.weight"], other["model.norm.weight"])
    assert all(t.dtype == torch.float32 for t in state.values())
    assert config.vocab_size == 49152 and config.num_key_value_heads < config.num_attention_heads

    logits = hf_model(config, state)(torch.tensor([[1, 200, 3000, 49151]])).logits
    assert logits.shape == (1, 4, config.vocab_size)
    assert torch.isfinite(logits).all()


def test_spec_dispatch() -> None:
    config, state = load_model_weights("tiny-random")
    assert config == TINY_CONFIG and set(state) == set(param_shapes(TINY_CONFIG))
    with pytest.raises(FileNotFoundError, match="tiny-random"):
        load_model_weights("no-such-model.gguf")


@pytest.mark.parametrize("tied", [False, True])
def test_gguf_round_trip_all_types_and_qk_permutation(tmp_path: Path, tied: bool) -> None:
    config, state = tiny_random(seed=3, config=replace(SMALL, tie_word_embeddings=tied))
    path = tmp_path / "tiny.gguf"
    expected = write_gguf(path, config, state)

    loaded_config, loaded = load_model_weights(path)
    assert loaded_config == replace(config, rope_scaling=None)
    assert set(loaded) == set(state)
    for name, want in expected.items():
        assert loaded[name].dtype == torch.float32
        np.testing.assert_array_equal(loaded[name].numpy(), want, err_msg=name)
        # And close to the original weights: a wrong row order would be far off.
        err = (loaded[name] - state[name]).abs().max().item()
        assert err < 0.25 * state[name].abs().max().item(), name

    logits = hf_model(loaded_config, loaded)(torch.tensor([[5, 6, 7]])).logits
    assert torch.isfinite(logits).all()


def test_gguf_matches_transformers_own_reader(tmp_path: Path) -> None:
    """transformers' GGUF integration undoes the permutation independently of ours."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config, state = tiny_random(seed=4, config=SMALL)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, config, state)
    _, ours = load_gguf(path)
    model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict()))
    theirs = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model)["tensors"]
    assert set(theirs) == set(ours)
    for name, tensor in ours.items():
        assert torch.equal(torch.as_tensor(theirs[name]), tensor), name


def test_safetensors_directory_round_trip(tmp_path: Path) -> None:
    config, state = tiny_random(seed=5, config=replace(SMALL, tie_word_embeddings=False))
    hf_model(config, state).save_pretrained(tmp_path / "model")
    loaded_config, loaded = load_model_weights(tmp_path / "model")
    assert loaded_config.num_key_value_heads == config.num_key_value_heads
    assert loaded_config.rope_theta == config.rope_theta
    assert not loaded_config.tie_word_embeddings
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_unknown_gguf_tensor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "llama3.gguf"
    writer = new_writer(path, SMALL)
    writer.add_tensor("rope_freqs.weight", np.ones(8, dtype=np.float32))
    close_writer(writer)
    with pytest.raises(ValueError, match="rope_freqs"):
        load_gguf(path)


def test_random_presets_are_made_in_the_asked_dtype_and_named_clearly() -> None:
    """A real-size preset's shape comes without weights; weights come in the asked dtype, the
    same for the same seed; an unknown preset's error lists the known ones."""
    eight_b = model_config("random:llama-3.1-8b")
    assert eight_b.kv_bytes_per_token(2) == 128 * 1024  # Llama-3.1-8B: 128 KiB in bf16
    config, state = load_model_weights("tiny-random", dtype=torch.bfloat16)
    assert config == TINY_CONFIG
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    _, again = load_model_weights("tiny-random", dtype=torch.bfloat16)
    assert all(torch.equal(state[n], again[n]) for n in state)
    assert 0.5 < state["model.norm.weight"].float().mean().item() < 1.5  # norms stay near 1
    with pytest.raises(ValueError, match=r"random:llama-3\.1-8b"):
        load_model_weights("random:llama-9000")
    with pytest.raises(FileNotFoundError, match="random:<preset>"):
        load_model_weights("no-such-model")
