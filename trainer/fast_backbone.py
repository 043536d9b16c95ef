"""The training forward for LoRA on the Llama family, written out like the decode step and sharing its weights.

Why: with rollouts fast, GRPO's update became the slow half of a step, and it is bound by the host, not the GPU:
transformers + peft run several hundred small Python-dispatched operations per decoder layer (each LoRA linear is
a module tree with dtype casts and adapter bookkeeping), three times per step with gradient checkpointing. Here a
decoder layer is one function over fused matrices (q/k/v and gate/up in one product each, the frozen base rows
shared with the sampler, so no second copy of the weights), with LoRA as x W^T + (x A^T) B^T over all of a fused
projection's adapters at once, and optionally compiled with torch.compile (one compilation serves every layer).

Only the backbone is replaced: TRL's fused LM head, log-probabilities, loss and optimizer step run unchanged on the
hidden states it returns. Gradients reach the adapter parameters themselves (the live peft tensors), so the
optimizer, checkpoints and the saved adapter are peft's as before. Positions are 0..T-1 for every row, as
transformers' own training forward uses them. Anything else (full fine-tuning, LoRA dropout, a KV cache, extra
inputs) goes to the model's own forward.
"""

from __future__ import annotations

from types import MethodType
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from nodus.trainer.fast_generation import FastWeights, _heads, _Projection, _rms_norm, _Shape
from torch.utils.checkpoint import checkpoint


class _Adapter(NamedTuple):
    a: torch.Tensor  # live lora_A weight [rank, in]
    b: torch.Tensor  # live lora_B weight [out_part, rank]
    scale: float


class _TrainProjection(NamedTuple):
    base: torch.Tensor  # frozen fused base rows [out, in] (a view into the sampler's matrix)
    bias: torch.Tensor | None
    adapters: tuple[_Adapter | None, ...]  # one per fused part, None where the part has no adapter
    rows: tuple[int, ...]  # output rows of each part


class _TrainLayer(NamedTuple):
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    qkv: _TrainProjection
    o: _TrainProjection
    gate_up: _TrainProjection
    down: _TrainProjection


def unsupported_reason(weights: FastWeights) -> str | None:
    """Why the fast training forward cannot stand in for the model's, or None when it can."""
    for projection in weights.projections:
        if any(base.weight.requires_grad for base in projection.bases):
            return "full fine-tuning (the base weights train)"
        for module in projection.modules:
            for dropout in getattr(module, "lora_dropout", {}).values():
                if isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
                    return "LoRA dropout"
    return None


def _train_projection(projection: _Projection) -> _TrainProjection:
    bias = projection.bias[: projection.out] if projection.bias is not None else None
    adapters = tuple(_Adapter(*part) if part is not None else None for part in projection.lora_parts)
    rows = tuple(int(base.weight.shape[0]) for base in projection.bases)
    return _TrainProjection(projection.base, bias, adapters, rows)


def _lora_linear(x: torch.Tensor, p: _TrainProjection) -> torch.Tensor:
    y = F.linear(x, p.base, p.bias)
    present = [adapter for adapter in p.adapters if adapter is not None]
    if not present:
        return y
    # All of a fused projection's adapters in two products: A stacked, B block-diagonal (zero blocks are tiny).
    a = torch.cat([adapter.a for adapter in present], dim=0).to(x.dtype)
    blocks = []
    for adapter, rows in zip(p.adapters, p.rows, strict=True):
        blocks.append(x.new_zeros(rows, 0) if adapter is None else (adapter.b * adapter.scale).to(x.dtype))
    lora: torch.Tensor = (x @ a.t()) @ torch.block_diag(*blocks).t()  # type: ignore[no-untyped-call]
    return y + lora


def _train_layer(
    x: torch.Tensor, layer: _TrainLayer, shape: _Shape, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    batch, steps, _ = x.shape
    h = _rms_norm(x, layer.input_norm, shape.eps)
    qkv = _lora_linear(h, layer.qkv)
    q, k, v = _heads(qkv, layer.q_norm, layer.k_norm, shape, cos, sin)
    q_size = shape.heads * shape.head_dim
    attn = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, scale=shape.scale, enable_gqa=shape.heads != shape.kv_heads
    )
    x = x + _lora_linear(attn.transpose(1, 2).reshape(batch, steps, q_size), layer.o)
    h = _rms_norm(x, layer.post_norm, shape.eps)
    gate_up = _lora_linear(h, layer.gate_up)
    inter = gate_up.shape[-1] // 2
    return x + _lora_linear(F.silu(gate_up[..., :inter]) * gate_up[..., inter:], layer.down)


def _train_stack(
    x: torch.Tensor,
    layers: list[_TrainLayer],
    shape: _Shape,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    checkpointing: bool,
) -> torch.Tensor:
    """Every layer in one function, so that one compilation covers the whole stack (forward and backward)."""
    for layer in layers:
        if checkpointing:
            x = checkpoint(_train_layer, x, layer, shape, cos, sin, mask, use_reentrant=False)
        else:
            x = _train_layer(x, layer, shape, cos, sin, mask)
    return x


class FastBackbone:
    """Stands in for `model.model.forward` (the decoder stack) in training forwards; see the module docstring."""

    def __init__(
        self,
        weights: FastWeights,
        *,
        compile_layers: bool = False,
        compile_stack: bool = False,
        compile_mode: str | None = None,
    ) -> None:
        self.weights = weights
        self.model = weights.model
        self.layers = [
            _TrainLayer(
                input_norm=layer.input_norm,
                post_norm=layer.post_norm,
                q_norm=layer.q_norm,
                k_norm=layer.k_norm,
                qkv=_train_projection(weights.projections[4 * i]),
                o=_train_projection(weights.projections[4 * i + 1]),
                gate_up=_train_projection(weights.projections[4 * i + 2]),
                down=_train_projection(weights.projections[4 * i + 3]),
            )
            for i, layer in enumerate(weights.layers)
        ]
        # dynamic=False: with symbolic sizes the layer's head counts turn into SymInts that SDPA's enable_gqa rejects
        # (seen on the 8B shape); each new sequence length compiles once instead.
        options: dict[str, Any] = {"fullgraph": True, "dynamic": False, "mode": compile_mode}
        self.layer_fn: Any = torch.compile(_train_layer, **options) if compile_layers else _train_layer
        # compile_stack (an experiment the benchmark measures): the whole stack, checkpointing included, as one graph.
        self.stack_fn: Any = torch.compile(_train_stack, **options) if compile_stack else None
        self.original_forward = self.model.model.forward
        self.calls = 0  # forwards this backbone handled (the rest went to the model's own)

    def install(self) -> None:
        backbone = self

        def forward(module: Any, input_ids: Any = None, attention_mask: Any = None, **kwargs: Any) -> Any:
            if input_ids is None or not backbone.handles(kwargs):
                return backbone.original_forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            return backbone(input_ids, attention_mask)

        self.model.model.forward = MethodType(forward, self.model.model)

    def uninstall(self) -> None:
        self.model.model.__dict__.pop("forward", None)

    @staticmethod
    def handles(kwargs: dict[str, Any]) -> bool:
        """Only plain training forwards: no cache, no precomputed embeddings or positions, no extra outputs."""
        if kwargs.get("use_cache"):
            return False
        return all(value is None or key == "use_cache" for key, value in kwargs.items())

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPast

        self.calls += 1
        model = self.model.model
        batch, steps = input_ids.shape
        x = F.embedding(input_ids, model.embed_tokens.weight)
        positions = torch.arange(steps, device=input_ids.device)[None]
        cos, sin = model.rotary_emb(x, positions)
        mask = None  # causal only: lets SDPA take its fastest kernel
        if attention_mask is not None and not bool(attention_mask.all()):
            valid = attention_mask.bool()
            causal = torch.ones(steps, steps, dtype=torch.bool, device=x.device).tril()
            # A left-pad query sees no valid key; let it see itself (its output is never scored) instead of NaN.
            mask = (causal[None] & valid[:, None, :]) | torch.eye(steps, dtype=torch.bool, device=x.device)[None]
            mask = mask[:, None]
        checkpointing = torch.is_grad_enabled() and getattr(model, "gradient_checkpointing", False)
        if self.stack_fn is not None:
            x = self.stack_fn(x, self.layers, self.weights.shape, cos, sin, mask, checkpointing)
            return BaseModelOutputWithPast(last_hidden_state=_rms_norm(x, model.norm.weight, self.weights.shape.eps))
        for layer in self.layers:
            if checkpointing:
                x = checkpoint(self.layer_fn, x, layer, self.weights.shape, cos, sin, mask, use_reentrant=False)
            else:
                x = self.layer_fn(x, layer, self.weights.shape, cos, sin, mask)
        return BaseModelOutputWithPast(last_hidden_state=_rms_norm(x, model.norm.weight, self.weights.shape.eps))
