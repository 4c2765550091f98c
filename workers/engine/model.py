"""A Llama-family decoder in plain torch, reading and writing its KV in the paged pool.

Weights arrive as a Hugging Face ``LlamaForCausalLM`` state dict and are fused at load
(q/k/v into one matrix, gate/up into another) so that each layer runs four matmuls on the
whole step's tokens at once. Attention uses torch's fused kernels without repeating K and
V: prefill chunks attend in grouped-query mode (:mod:`workers.engine.attention`), and
decode folds the query heads of each KV head into the query axis so that a whole batch
attends in one call. K and V are written rounded to the pool's dtype (float16 under
float32 weights on the CPU, by default) and attention reads them back from the pool,
widened to the model's dtype, even those of the chunk being computed: a token's KV is the
same bytes however it got into the pool, and attention sees the same values whether they
were computed this step or restored from a tier. Attention computes in the model's dtype:
on CPUs without float16 arithmetic (AVX2, AVX-512 before Sapphire Rapids) torch's float16
attention converts every block and ran at a third to a half of float32's speed, prefill
and decode alike, while widening what was gathered costs one pass over it. The model
holds tensors, not ``nn.Module``s, to keep per-step Python overhead to a handful of ops
per layer; on a CPU in float32 the RMS norm, the rotary embedding and the SwiGLU are one
compiled call each (:mod:`workers.engine.native`), not four to seven torch ops: in
alternating runs of one process, batch-1 decode took 17.9-21.5 ms a token with them
against 19.7-23.0 without. There, too, decode attention reads its rows' K and V from the
pool in place, widening as it goes, where torch's way gathers a copy, widens a second one
and runs SDPA over that. A step of one single-token row, where one row goes through the
row-major weights, runs all its layers in one compiled call of the same kernels
(:class:`~workers.engine.native.DecodeLayers`), which gives the same bits without the ~270
calls from Python a step: batch-1 decode went from 61.8 to 73.4 tok/s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from workers.engine import native
from workers.engine.attention import chunk_attention
from workers.engine.batch import ForwardBatch
from workers.engine.config import ModelConfig
from workers.engine.kv_pool import KVPool
from workers.engine.projection import (
    Projection,
    SingleRowChoice,
    choose_single_row_kernel,
    room_for_row_major,
)

#: Attention kernels the model may use. cuDNN's is left out: it spends about 2 ms of CPU per
#: call setting up for each new sequence length, which on an H200 was 70 of a decode step's
#: 80 ms for an 8B model (the kernel itself ran 6 us). The others have no such setup; on a CPU
#: the flash entry is the CPU kernel, as before.
log = logging.getLogger(__name__)

ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Per-pair inverse frequencies, honouring ``rope_theta`` and ``rope_scaling``."""
    dim = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (default, linear, llama3 are)")


def _room(buffer: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``buffer`` if it holds ``shape``'s elements, else a quarter more than that, uninitialised."""
    need = math.prod(shape)
    if buffer.numel() >= need:
        return buffer
    return torch.empty(need + need // 4, dtype=buffer.dtype, device=buffer.device)


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    qkv: Projection  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: Projection
    mlp_norm: torch.Tensor
    gate_up: Projection  # [2 * intermediate, hidden]
    down: Projection


class LlamaModel:
    """Forward pass over a :class:`ForwardBatch`, KV kept in a :class:`KVPool`."""

    def __init__(
        self,
        config: ModelConfig,
        state_dict: Mapping[str, torch.Tensor],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        kv_dtype: torch.dtype | None = None,
        threads: int | None = None,
    ) -> None:
        """``threads``: torch threads the steps will run with (the caller's by default), for
        timing the kernels one row runs on (:mod:`workers.engine.projection`)."""
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        #: what the KV pool stores and attention computes in (``dtype`` when None)
        self.kv_dtype = kv_dtype or dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} attention heads do not split over {self.kv_heads}")
        self.group = self.heads // self.kv_heads

        def w(name: str) -> torch.Tensor:
            if name not in state_dict:
                raise KeyError(f"weight {name!r} missing from the state dict")
            return state_dict[name].to(device=self.device, dtype=dtype)

        tied = config.tie_word_embeddings or "lm_head.weight" not in state_dict
        head = "model.embed_tokens.weight" if tied else "lm_head.weight"
        projected = [n for n in state_dict if n.endswith("_proj.weight") or n == head]
        kernels = native.load() if self.device.type == "cpu" and dtype == torch.float32 else None
        #: the compiled kernels between the projections (None: torch's ops)
        self._kernels = kernels
        rowdot = None if kernels is None else kernels.rowdot
        if rowdot is not None and not room_for_row_major(
            sum(state_dict[n].numel() for n in projected) * dtype.itemsize
        ):
            rowdot = None

        def projection(weight: torch.Tensor) -> Projection:
            return Projection(weight, rowdot=rowdot)

        def fused(*names: str) -> Projection:
            return projection(torch.cat([w(n) for n in names], dim=0).contiguous())

        self.embed = w("model.embed_tokens.weight")
        self.layers: list[_Layer] = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            self.layers.append(
                _Layer(
                    attn_norm=w(p + "input_layernorm.weight"),
                    qkv=fused(*(p + f"self_attn.{x}_proj.weight" for x in "qkv")),
                    o=projection(w(p + "self_attn.o_proj.weight")),
                    mlp_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=fused(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    down=projection(w(p + "mlp.down_proj.weight")),
                )
            )
        self.norm = w("model.norm.weight")
        self.lm_head = projection(self.embed if tied else w("lm_head.weight"))
        #: how one row goes through the weights here; None where there was no choice
        self.single_row: SingleRowChoice | None = choose_single_row_kernel(
            [p for layer in self.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
            + [self.lm_head],
            threads or torch.get_num_threads(),
        )
        freqs = torch.outer(
            torch.arange(config.max_position_embeddings, dtype=torch.float32),
            rope_inv_freq(config),
        )
        self.cos = freqs.cos().to(device=self.device, dtype=dtype)
        self.sin = freqs.sin().to(device=self.device, dtype=dtype)
        #: CPU memory the attention gathers each call's KV into, and widens it into when
        #: the pool's dtype is not the model's; grown as needed and reused
        self._gathered = torch.empty(0, dtype=self.kv_dtype, device=self.device)
        self._widened = torch.empty(0, dtype=dtype, device=self.device)
        #: every layer of a lone decode row in one compiled call; None: op by op
        self._decode_layers = self._one_call_decode()

    def _one_call_decode(self) -> native.DecodeLayers | None:
        """The compiled batch-1 decode over the row-major weights, where one row goes
        through them (:attr:`single_row`) and the kernels take the model's shape."""
        if self._kernels is None or self.single_row is None or not self.single_row.native:
            return None
        layers = [
            native.LayerWeights(
                attn_norm=layer.attn_norm,
                qkv=layer.qkv.row_major,
                o=layer.o.row_major,
                mlp_norm=layer.mlp_norm,
                gate_up=layer.gate_up.row_major,
                down=layer.down.row_major,
            )
            for layer in self.layers
        ]
        try:
            return self._kernels.decode_layers(
                layers,
                heads=self.heads,
                kv_heads=self.kv_heads,
                eps=self.config.rms_norm_eps,
                cos=self.cos,
                sin=self.sin,
            )
        except (TypeError, ValueError) as exc:  # a shape or dtype the kernels do not take
            log.info("batch-1 decode runs op by op: %s", exc)
            return None

    def _context(self, slots: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """KV of the pool slots ``index`` (``[n, 2, kv_heads, head_dim]``) in the model's
        dtype; on the CPU in reused memory, valid until the next call.

        A decode step gathers every sequence's context once per layer: 45 MB for 8 requests
        of 3.7k tokens with SmolLM2's KV in float32. glibc serves blocks over 32 MB with a fresh mmap
        and unmaps them when freed, so a new tensor each time faulted in every page again:
        on the CPU a whole worker then ran at half speed, a core lost to the kernel. CUDA's
        caching allocator reuses its blocks already, and a buffer held for good would only
        take GPU memory from other temporaries.
        """
        if self.device.type != "cpu":
            return slots.index_select(0, index).to(self.dtype)
        shape = (index.numel(), *slots.shape[1:])
        self._gathered = _room(self._gathered, shape)
        gathered = torch.index_select(
            slots, 0, index, out=self._gathered[: math.prod(shape)].view(shape)
        )
        if slots.dtype == self.dtype:
            return gathered
        self._widened = _room(self._widened, shape)
        return self._widened[: math.prod(shape)].view(shape).copy_(gathered)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._kernels is not None:
            return self._kernels.rms_norm(x, weight, self.config.rms_norm_eps)
        return F.rms_norm(x, weight.shape, weight, self.config.rms_norm_eps)

    def _swiglu(self, gu: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of the fused gate/up output ``[T, 2 * intermediate]``."""
        if self._kernels is not None:
            return self._kernels.swiglu(gu)
        inter = gu.shape[-1] // 2
        return F.silu(gu[:, :inter]).mul_(gu[:, inter:])

    def _rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate the query and key heads of ``qkv`` (``[T, (heads + 2 * kv_heads) *
        head_dim]``) in place."""
        heads = self.heads + self.kv_heads
        if self._kernels is not None:
            self._kernels.rope(qkv, heads, self.head_dim, cos, sin)
            return
        qk = qkv[:, : heads * self.head_dim].view(qkv.shape[0], heads, self.head_dim)
        half = self.head_dim // 2
        x1, x2 = qk[..., :half], qk[..., half:]
        r1 = x1 * cos - x2 * sin
        x2.mul_(cos).addcmul_(x1, sin)
        x1.copy_(r1)

    def _attention(
        self, qkv: torch.Tensor, batch: ForwardBatch, slots: torch.Tensor
    ) -> torch.Tensor:
        """Attention output ``[T, heads * head_dim]`` for the step's queries."""
        H, D = self.heads, self.head_dim
        q = qkv[:, : H * D]
        if not batch.prefill:  # decode only: the attention output is the whole result
            return self._decode_attention(q, batch, slots)
        out = torch.empty(q.shape, dtype=self.dtype, device=q.device)
        for p in batch.prefill:
            ctx = self._context(slots, p.ctx_slots)  # [L, 2, K, D]
            k = ctx[:, 0].transpose(0, 1)[None]  # [1, K, L, D]
            v = ctx[:, 1].transpose(0, 1)[None]
            qp = q[p.row : p.row + p.n].view(p.n, H, D).transpose(0, 1)[None]  # [1, H, n, D]
            o = chunk_attention(qp, k, v, p.mask)
            out[p.row : p.row + p.n] = o[0].transpose(0, 1).reshape(p.n, H * D)
        if batch.decode_slots is not None:
            out[batch.decode_row :] = self._decode_attention(q, batch, slots)
        return out

    def _decode_attention(
        self, q: torch.Tensor, batch: ForwardBatch, slots: torch.Tensor
    ) -> torch.Tensor:
        """Attention of the single-token rows, ``[B, heads * head_dim]``."""
        assert batch.decode_slots is not None and batch.decode_lengths is not None
        if self._kernels is not None and slots.dtype in (torch.float16, torch.float32):
            return self._kernels.decode_attention(
                q[batch.decode_row :], slots, batch.decode_slots, batch.decode_lengths
            )
        K, D, g = self.kv_heads, self.head_dim, self.group
        B, L = batch.decode_slots.shape
        ctx = self._context(slots, batch.decode_slots.view(-1)).view(B, L, 2, K, D)
        k = ctx[:, :, 0].transpose(1, 2)  # [B, K, L, D]
        v = ctx[:, :, 1].transpose(1, 2)
        qd = q[batch.decode_row :].view(B, K, g, D)  # the g query heads of a KV head as rows
        mask = None if batch.decode_mask is None else batch.decode_mask.to(q.dtype)
        o = F.scaled_dot_product_attention(qd, k, v, attn_mask=mask)
        return o.reshape(B, K * g * D)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Run one step; returns float32 logits ``[len(batch.logit_rows), vocab]``."""
        h = self.embed[batch.input_ids]
        if (
            self._decode_layers is not None
            and batch.num_tokens == 1
            and batch.decode_slots is not None
            and pool.kv.dtype in (torch.float16, torch.float32)
        ):
            self._decode_layers(h, batch.decode_slots, pool.kv)
        else:
            cos = self.cos[batch.positions][:, None, :]  # [T, 1, D/2] broadcast over heads
            sin = self.sin[batch.positions][:, None, :]
            with sdpa_kernel(ATTENTION_BACKENDS):
                self._layers(h, batch, pool, cos, sin)
        last = self._norm(h[batch.logit_rows], self.norm)
        return self.lm_head(last).float()

    def _layers(
        self,
        h: torch.Tensor,
        batch: ForwardBatch,
        pool: KVPool,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> None:
        """Every decoder layer over the hidden states ``h``, in place."""
        H, K, D = self.heads, self.kv_heads, self.head_dim
        T = batch.num_tokens
        for i, layer in enumerate(self.layers):
            x = self._norm(h, layer.attn_norm)
            qkv = layer.qkv(x)
            self._rope(qkv, cos, sin)
            slots = pool.layer_slots[i]
            kv = qkv[:, H * D :].view(T, 2, K, D)
            slots.index_copy_(0, batch.write_slots, kv.to(slots.dtype))
            h.add_(layer.o(self._attention(qkv, batch, slots)))
            gu = layer.gate_up(self._norm(h, layer.mlp_norm))
            h.add_(layer.down(self._swiglu(gu)))
