"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a paged KV cache with multi-LoRA deltas.

Weights use merged projections (qkv, gate_up); `load_weights` maps HF checkpoint names onto them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.engine.layers.attention import AttentionMetadata, paged_attention
from gpu_workers.engine.layers.linear import MergedLinear, pack_linear_weight, packed_linear
from gpu_workers.engine.layers.lora import LoraBatch, add_lora_delta, select_lora_rows
from gpu_workers.engine.layers.norm import RMSNorm
from gpu_workers.engine.layers.pointwise import EAGER_POINTWISE, PointwiseOps
from gpu_workers.engine.layers.rotary import rope_parameters
from gpu_workers.engine.layers.vocab_lora import VocabStep

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelArgs:
    """Architecture read from a HF config.json."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: dict[str, Any]
    is_tied_embeddings: bool
    has_qkv_bias: bool
    has_o_bias: bool
    has_mlp_bias: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        """Parse and check a HF config dict; raises ValueError for unsupported architectures."""
        model_type = cfg.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg.get('hidden_act')!r}; only silu")
        num_heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        is_attention_bias = bool(cfg.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rope=rope_parameters(cfg),
            is_tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            has_qkv_bias=model_type == "qwen2" or is_attention_bias,
            has_o_bias=is_attention_bias,
            has_mlp_bias=bool(cfg.get("mlp_bias", False)),
            eos_token_ids=tuple(eos if isinstance(eos, list) else ([eos] if eos is not None else [])),
        )


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU MLP, each projection with an optional multi-LoRA delta."""

    def __init__(self, args: ModelArgs, layer_idx: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim
        self.scale = args.head_dim**-0.5
        hidden, inter = args.hidden_size, args.intermediate_size
        qkv_sizes = {"q_proj": self.q_size, "k_proj": self.kv_size, "v_proj": self.kv_size}
        self.input_layernorm = RMSNorm(hidden, args.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(hidden, args.rms_norm_eps, dtype, device)
        self.qkv = MergedLinear(hidden, qkv_sizes, args.has_qkv_bias, dtype, device)
        self.o = MergedLinear(self.q_size, {"o_proj": hidden}, args.has_o_bias, dtype, device)
        self.gate_up = MergedLinear(
            hidden, {"gate_proj": inter, "up_proj": inter}, args.has_mlp_bias, dtype, device
        )
        self.down = MergedLinear(inter, {"down_proj": hidden}, args.has_mlp_bias, dtype, device)
        self.pointwise: PointwiseOps = (
            EAGER_POINTWISE  # the elementwise runs, eager or compiled (layers/pointwise.py)
        )

    def forward(
        self,
        h: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        lora: LoraBatch,
        keep: tuple[torch.Tensor, LoraBatch] | None = None,
    ) -> torch.Tensor:
        """h: [num_tokens, hidden] -> [num_tokens, hidden].

        keep = (rows, lora of those rows): K/V are still computed and cached for every token, but the output
        projection and MLP run only on `rows` -> [len(rows), hidden] (the last layer, when only some rows'
        outputs are read).
        """
        if keep is None:
            h = h + self._attention(self._norm(self.input_layernorm, h), cos_sin, kv_cache, meta, lora)
            return h + self._mlp(self._norm(self.post_attention_layernorm, h), lora)
        rows, kept_lora = keep
        o = self._attention_heads(self._norm(self.input_layernorm, h), cos_sin, kv_cache, meta, lora)
        if rows.shape[0] == 0:
            return h[:0]
        h = h.index_select(0, rows) + self._project("o", o.index_select(0, rows), kept_lora)
        return h + self._mlp(self._norm(self.post_attention_layernorm, h), kept_lora)

    def _norm(self, norm: RMSNorm, h: torch.Tensor) -> torch.Tensor:
        return self.pointwise.rms_norm(h, norm.weight, norm.eps)

    def _project(self, name: str, x: torch.Tensor, lora: LoraBatch) -> torch.Tensor:
        out = getattr(self, name)(x)
        if not lora.is_empty:
            add_lora_delta(out, x, lora, self.layer_idx, name)
        return out

    def _attention(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        lora: LoraBatch,
    ) -> torch.Tensor:
        o = self._attention_heads(x, cos_sin, kv_cache, meta, lora)
        return self._project("o", o, lora)

    def _attention_heads(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        lora: LoraBatch,
    ) -> torch.Tensor:
        """Attention up to (not including) the output projection -> [num_tokens, q_size]."""
        num_tokens = x.shape[0]
        qkv = self._project("qkv", x, lora)  # [T, q_size + 2 * kv_size]
        # q and k rotated in one pass over their adjacent columns: [T, Hq + Hkv, D]
        qk = self.pointwise.rotate_qk(qkv, *cos_sin, self.q_size + self.kv_size, self.head_dim)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)  # [T, Hq, D]
        return o.reshape(num_tokens, self.q_size)

    def _mlp(self, x: torch.Tensor, lora: LoraBatch) -> torch.Tensor:
        gate_up = self._project("gate_up", x, lora)  # [T, 2 * intermediate]
        return self._project("down", self.pointwise.silu_mul(gate_up), lora)


class LlamaForCausalLM(nn.Module):
    """Embedding -> decoder layers -> final norm; `logits` applies the LM head to selected rows."""

    def __init__(self, args: ModelArgs, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size, dtype=dtype, device=device)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(args, i, dtype, device) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype, device)
        self.lm_head_packed: torch.Tensor | None = None
        if args.is_tied_embeddings:
            self.lm_head_weight = self.embed_tokens.weight
        else:
            self.lm_head_weight = nn.Parameter(
                torch.empty(args.vocab_size, args.hidden_size, dtype=dtype, device=device),
                requires_grad=False,
            )

    def forward(
        self,
        input_ids: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        lora: LoraBatch,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids: [num_tokens] -> final hidden states [num_tokens, hidden], or only those of
        `output_rows` ([len(output_rows), hidden]; ascending rows): then the last layer's output projection
        and MLP skip the other rows (prompt tokens whose outputs nobody reads)."""
        h = self.embed_tokens(input_ids)
        vocab = lora.find(VocabStep)
        if vocab is not None:  # LoRA on embed_tokens: a per-row gather (layers/vocab_lora.py)
            vocab.add_embedding_delta(h, input_ids)
        num_tokens = input_ids.shape[0]
        keep = None
        if output_rows is not None and output_rows.shape[0] < num_tokens:
            keep = (output_rows, select_lora_rows(lora, output_rows))
        last = len(self.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            lora.begin_layer(i)  # layer boundary: host-assisted adapters whose copy landed switch to it
            h = layer(h, cos_sin, kv_cache, meta, lora, keep if i == last else None)
        if keep is None and output_rows is not None:
            h = h.index_select(0, output_rows)
        return h

    def logits(self, hidden: torch.Tensor, head: VocabStep | None = None) -> torch.Tensor:
        """hidden: [n, hidden] (un-normed rows to sample from) -> fp32 logits [n, vocab]; `head`: the LoRA on
        lm_head of these n rows (VocabStep.select_rows), None when no row has one."""
        x = self.norm(hidden)
        if self.lm_head_packed is not None:
            out = packed_linear(x, self.lm_head_packed)
        else:
            out = F.linear(x, self.lm_head_weight)
        if head is not None:
            head.add_head_delta(out, x)
        return out.float()

    def use_pointwise(self, ops: PointwiseOps) -> None:
        """Run every layer's elementwise runs through `ops` (layers/pointwise.py: eager or compiled)."""
        for layer in self.layers:
            cast(DecoderLayer, layer).pointwise = ops

    def pack_linears(self, wide_dtype: torch.dtype | None = None) -> None:
        """Switch every projection and the LM head to oneDNN-packed weights (after load_weights); wide_dtype:
        prefill-sized projections in that dtype (see MergedLinear.pack)."""
        for layer in self.layers:
            for name in ("qkv", "o", "gate_up", "down"):
                getattr(layer, name).pack(wide_dtype)
        self.lm_head_packed = pack_linear_weight(self.lm_head_weight.data)
        if not self.args.is_tied_embeddings:
            self.lm_head_weight.data = torch.empty(0, dtype=self.lm_head_weight.dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the merged parameters; raises on unknown or missing names."""
        expected = self._expected_names()
        for name, tensor in weights:
            if name == "lm_head.weight" and self.args.is_tied_embeddings:
                expected.discard(name)
                continue
            if name not in expected:
                if "rotary_emb.inv_freq" in name:
                    continue
                raise ValueError(f"unexpected checkpoint tensor {name!r}")
            self._load_one(name, tensor)
            expected.discard(name)
        if expected:
            raise ValueError(f"checkpoint is missing tensors: {sorted(expected)[:5]}")

    def _expected_names(self) -> set[str]:
        names = {"model.embed_tokens.weight", "model.norm.weight"}
        if not self.args.is_tied_embeddings:
            names.add("lm_head.weight")
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
            for merged, sub in (
                ("qkv", "self_attn"),
                ("o", "self_attn"),
                ("gate_up", "mlp"),
                ("down", "mlp"),
            ):
                linear: MergedLinear = getattr(layer, merged)
                for module in linear.output_slices:
                    names.add(f"{p}{sub}.{module}.weight")
                    if linear.bias is not None:
                        names.add(f"{p}{sub}.{module}.bias")
        return names

    def _load_one(self, name: str, tensor: torch.Tensor) -> None:
        if name == "model.embed_tokens.weight":
            self.embed_tokens.weight.data.copy_(tensor)
        elif name == "model.norm.weight":
            self.norm.weight.data.copy_(tensor)
        elif name == "lm_head.weight":
            self.lm_head_weight.data.copy_(tensor)
        else:
            parts = name.split(".")  # model.layers.{i}.{sub}.{module}.{weight|bias}
            layer = cast(DecoderLayer, self.layers[int(parts[2])])
            if parts[3] in ("input_layernorm", "post_attention_layernorm"):
                getattr(layer, parts[3]).weight.data.copy_(tensor)
                return
            module = parts[4]
            merged = {
                "q_proj": "qkv",
                "k_proj": "qkv",
                "v_proj": "qkv",
                "o_proj": "o",
                "gate_proj": "gate_up",
                "up_proj": "gate_up",
                "down_proj": "down",
            }[module]
            getattr(layer, merged).load(module, tensor, is_bias=parts[5] == "bias")
