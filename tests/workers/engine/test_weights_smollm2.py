"""The real SmolLM2-135M-Instruct GGUF: shape, agreement with transformers, sane logits.

Marked slow: each test dequantizes or runs the whole 135M model (~10 s of CPU each).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workers.engine.config import ModelConfig
from workers.engine.tokenizer import load_tokenizer
from workers.engine.weights import StateDict, check_state_dict, load_model_weights, model_config


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> tuple[ModelConfig, StateDict]:
    return load_model_weights(smollm2_gguf)


@pytest.mark.slow
def test_smollm2_shape_and_agreement_with_transformers_reader(
    smollm2_gguf: Path, smollm2: tuple[ModelConfig, StateDict]
) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config, state = smollm2
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (
        30,
        9,
        3,
    )
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (576, 1536, 49152)
    assert config.tie_word_embeddings and "lm_head.weight" not in state
    assert (config.rope_theta, config.rms_norm_eps, config.max_position_embeddings) == (
        100000.0,
        1e-5,
        8192,
    )
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))
    assert all(t.dtype == torch.float32 for t in state.values())

    model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict())).eval()
    # transformers' own GGUF reader (dequantize + its Q/K un-permutation) agrees bit for bit.
    theirs = load_gguf_checkpoint(smollm2_gguf, return_tensors=True, model_to_load=model)["tensors"]
    assert set(theirs) == set(state)
    assert all(torch.equal(torch.as_tensor(theirs[k]), v) for k, v in state.items())


@pytest.mark.slow
def test_smollm2_in_transformers_answers_a_question(
    smollm2_gguf: Path, smollm2: tuple[ModelConfig, StateDict]
) -> None:
    config, state = smollm2
    model = LlamaForCausalLM(LlamaConfig(**config.to_hf_dict())).eval()
    model.load_state_dict({**state, "lm_head.weight": state["model.embed_tokens.weight"]})
    tok = load_tokenizer(smollm2_gguf)
    prompt = tok.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
        logits = model(ids).logits
    assert torch.isfinite(logits).all()
    # A model with scrambled Q/K rows or mis-wired norms answers gibberish; this one knows.
    assert "Paris" in tok.decode(out[0, ids.shape[1] :].tolist())


def test_random_smollm2_preset_has_the_real_shape(smollm2_gguf: Path) -> None:
    """``random:smollm2-135m`` must be SmolLM2 in every hyper-parameter, read without weights
    from the real GGUF, and its made-up weights must fit that shape."""
    real = model_config(smollm2_gguf)
    assert model_config("random:smollm2-135m") == real
    config, state = load_model_weights("random:smollm2-135m")
    assert config == real
    check_state_dict(config, state, "random:smollm2-135m")
    assert {t.dtype for t in state.values()} == {torch.float32}
