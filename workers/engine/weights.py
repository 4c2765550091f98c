"""Model weights from any source, as ``(ModelConfig, state dict)`` with Hugging Face names.

Every loader returns fp32 tensors named like ``transformers.LlamaForCausalLM`` parameters
(``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``, ...,
``model.norm.weight``, and ``lm_head.weight`` unless the embeddings are tied), so the
engine and the Hugging Face reference model read the same dict. Sources:

- ``"tiny-random"``: a seeded small Llama for fast tests (vocabulary of SmolLM2's tokenizer);
- ``"random:<preset>"``: a seeded Llama of a real model's size (see :data:`RANDOM_PRESETS`),
  made directly on the serving device in its dtype, for speed measurements where only the
  shape matters (a GPU benchmark of an 8B-sized model needs no 16 GB download);
- a ``.gguf`` file (see ``weights_gguf``);
- a directory with ``config.json`` and ``*.safetensors`` (Hugging Face layout).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from workers.engine.config import RANDOM_PREFIX, TINY_RANDOM, ModelConfig, is_random_spec

StateDict = dict[str, torch.Tensor]


#: Shape of ``tiny_random``: small enough for fast tests, with grouped-query attention
#: (2 query heads per KV head), and SmolLM2's vocabulary and special ids so that the
#: SmolLM2 tokenizer drives it.
TINY_CONFIG = ModelConfig(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_ids=(2,),
)


#: Real model shapes ``random:<name>`` builds. They keep SmolLM2's vocabulary and special ids
#: (so SmolLM2's tokenizer drives them), which makes the embedding and LM head smaller than
#: the original's; the transformer stack, and so the KV bytes per token, are the real ones.
RANDOM_PRESETS: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig(
        vocab_size=49152,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "smollm2-135m": ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
}


def random_config(spec: str) -> ModelConfig:
    """The shape a random-model spec names; ``ValueError`` listing the presets otherwise."""
    if spec == TINY_RANDOM:
        return TINY_CONFIG
    name = spec.removeprefix(RANDOM_PREFIX)
    if not spec.startswith(RANDOM_PREFIX) or name not in RANDOM_PRESETS:
        known = ", ".join(RANDOM_PREFIX + n for n in RANDOM_PRESETS)
        raise ValueError(f"model {spec!r}: not {TINY_RANDOM!r} or one of {known}")
    return RANDOM_PRESETS[name]


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter a Llama of this shape has, by Hugging Face name, with its shape."""
    h, d = config.hidden_size, config.head_dim
    q, kv, ff = (
        config.num_attention_heads * d,
        config.num_key_value_heads * d,
        config.intermediate_size,
    )
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (ff, h),
            p + "mlp.up_proj.weight": (ff, h),
            p + "mlp.down_proj.weight": (h, ff),
        }
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    return shapes


def check_state_dict(config: ModelConfig, state: StateDict, source: str) -> None:
    """Raise ``ValueError`` naming what is missing, unexpected or mis-shaped in ``state``."""
    want = param_shapes(config)
    problems = [f"missing {n}" for n in want if n not in state]
    problems += [f"unexpected {n}" for n in state if n not in want]
    problems += [
        f"{n} has shape {tuple(t.shape)}, expected {want[n]}"
        for n, t in state.items()
        if n in want and tuple(t.shape) != want[n]
    ]
    if problems:
        shown = "; ".join(problems[:5]) + (
            f"; ... ({len(problems)} problems)" if len(problems) > 5 else ""
        )
        raise ValueError(f"{source}: weights do not fit a Llama of this config: {shown}")


def tiny_random(
    seed: int = 0,
    config: ModelConfig | None = None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[ModelConfig, StateDict]:
    """A seeded random Llama (``TINY_CONFIG`` unless ``config`` is given), identical on every
    run on the same device; made on ``device`` in ``dtype`` (an 8B shape never touches the CPU).

    Projections are scaled by 1/sqrt(fan_in) and embeddings have unit variance so that the
    logits are well spread: greedy decoding then has clear winners and comparisons with a
    reference implementation are not decided by rounding noise.
    """
    config = config or TINY_CONFIG
    gen = torch.Generator(device=device).manual_seed(seed)
    state: StateDict = {}
    for name, shape in param_shapes(config).items():
        tensor = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        if name.endswith("norm.weight"):
            # Not all ones, so that a norm weight wired to the wrong place shows up.
            tensor.mul_(0.1).add_(1.0)
        elif name != "model.embed_tokens.weight":
            tensor.div_(math.sqrt(shape[1]))
        state[name] = tensor
    return config, state


def load_safetensors_dir(path: Path) -> tuple[ModelConfig, StateDict]:
    """A Hugging Face model directory: ``config.json`` plus one or more ``*.safetensors``."""
    from safetensors.torch import load_file

    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{path}: no config.json; expected a Hugging Face model directory")
    config = ModelConfig.from_hf_dict(json.loads(config_path.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files next to config.json")
    state: StateDict = {}
    for file in files:
        for name, tensor in load_file(file).items():
            if name.endswith("rotary_emb.inv_freq"):
                continue  # a buffer some exporters save; recomputed from the config
            state[name] = tensor.to(torch.float32)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # some exporters write the tied copy too
    elif "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        # config.json says untied but the file has no head: the embeddings are the head.
        config = replace(config, tie_word_embeddings=True)
    check_state_dict(config, state, str(path))
    return config, state


def model_config(spec: str | Path) -> ModelConfig:
    """The shape of the model ``spec`` names, read without loading its weights."""
    if is_random_spec(spec):
        return random_config(str(spec))
    path = Path(spec)
    if path.is_dir():
        return ModelConfig.from_hf_dict(json.loads((path / "config.json").read_text()))
    from workers.engine.gguf_metadata import GGUFMetadata

    # import cycle: the GGUF loader reuses this module's checks; loaded only for GGUF
    from workers.engine.weights_gguf import gguf_config

    return gguf_config(GGUFMetadata.open(path))


def load_model_weights(
    spec: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[ModelConfig, StateDict]:
    """Load a random model, a ``.gguf`` file or a safetensors directory (HF names).

    Files load as fp32 on the CPU (the engine casts and moves them); random models are made
    on ``device`` in ``dtype`` directly.
    """
    if is_random_spec(spec):
        return tiny_random(config=random_config(str(spec)), device=device, dtype=dtype)
    path = Path(spec)
    if path.is_dir():
        return load_safetensors_dir(path)
    if path.is_file() and path.suffix == ".gguf":
        # import cycle: as in model_config
        from workers.engine.weights_gguf import load_gguf

        return load_gguf(path)
    raise FileNotFoundError(
        f"model {str(spec)!r}: not {TINY_RANDOM!r}, random:<preset> "
        f"({', '.join(RANDOM_PRESETS)}), an existing .gguf file, "
        "or a directory with config.json and *.safetensors"
    )
