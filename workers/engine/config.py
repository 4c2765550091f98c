"""Shape of a Llama-family decoder, as read from a GGUF file, a config.json or made up."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The model spec that selects the seeded tiny random Llama (``weights.tiny_random``).
TINY_RANDOM = "tiny-random"
#: Spec prefix of the real-size random models (``weights.RANDOM_PRESETS``).
RANDOM_PREFIX = "random:"


def is_random_spec(spec: str | Path | None) -> bool:
    """Whether ``spec`` names a seeded random model (``tiny-random`` or ``random:<preset>``).

    Torch-free, like the rest of this module, so the supervisor can name models with it.
    """
    return spec is not None and (str(spec) == TINY_RANDOM or str(spec).startswith(RANDOM_PREFIX))


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama-architecture model (Hugging Face ``LlamaConfig`` names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    #: Hugging Face ``rope_scaling`` dict (e.g. llama3 scaling), or None for plain RoPE
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    def to_hf_dict(self) -> dict[str, Any]:
        """This shape as a Hugging Face ``config.json`` dict (``LlamaConfig(**d)`` accepts it)."""
        eos: int | list[int] | None = list(self.eos_token_ids) or None
        if eos is not None and len(eos) == 1:
            eos = eos[0]
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face Llama ``config.json`` dict; refuse shapes our model cannot run."""
        if d.get("model_type", "llama") not in ("llama", "mistral"):
            raise ValueError(f"unsupported model_type {d.get('model_type')!r}: need a Llama model")
        if d.get("hidden_act", "silu") != "silu" or d.get("attention_bias") or d.get("mlp_bias"):
            raise ValueError("unsupported Llama variant: need silu MLP without attention/MLP bias")
        heads = d["num_attention_heads"]
        if d.get("head_dim") not in (None, d["hidden_size"] // heads):
            raise ValueError(f"unsupported head_dim {d['head_dim']}: must be hidden_size / heads")
        eos = d.get("eos_token_id")
        eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        # transformers >= 5 nests rope_theta in rope_parameters; older configs have it on top.
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling")
        if scaling is None and rope.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-5),
            rope_theta=d.get("rope_theta", rope.get("rope_theta", 10000.0)),
            rope_scaling=scaling,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
