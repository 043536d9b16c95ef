"""Fast sampling for GRPO rollouts: a static KV cache and one CUDA graph per decode step.

Why this exists: stock TRL samples with `model.generate`, which on a GPU spends its time launching kernels (a few
hundred per token for a 28-layer model, plus LoRA's extra ones), not computing. Here the decode step is written out
once for the Llama family (Llama, Qwen2, Qwen3: RMSNorm, RoPE, grouped-query attention, SiLU MLP), reads weights
that are laid out for decoding (q/k/v and gate/up fused into one matrix each), keeps every piece of state in
preallocated tensors, samples on the GPU, and is captured as a CUDA graph: a token costs one graph replay and the
host never waits for the device until the whole batch is done.

The policy sampled from is the training model's, exactly: LoRA adapters are applied unmerged (x W + s (x A) B),
as peft does, so even a tiny update is seen by the next rollout (merging into 16-bit weights would round it away).
`refresh()` copies the trainable weights into the decode layout after each optimizer step. Sampling follows
`transformers`' order: minimum-length EOS suppression, temperature, top-k, top-p, then one draw from the
softmax. Anything outside that set (other architectures, repetition penalty, min-p, sliding windows, quantized
weights) is reported by `unsupported_reason` and the caller falls back to `model.generate`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from nodus.core.errors import first_line
from torch import nn

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_new_tokens: int = 0
    do_sample: bool = True

    @classmethod
    def from_generation_config(cls, config: Any, eos_token_ids: list[int]) -> SamplingSettings:
        top_k = config.top_k if config.top_k not in (None, 0) else None
        top_p = config.top_p if config.top_p not in (None, 1.0) else None
        return cls(
            max_new_tokens=int(config.max_new_tokens),
            eos_token_ids=tuple(eos_token_ids),
            temperature=float(config.temperature if config.temperature is not None else 1.0),
            top_k=top_k,
            top_p=top_p,
            min_new_tokens=int(config.min_new_tokens or 0),
            do_sample=bool(config.do_sample),
        )


# What `model.generate` takes from a generation config (logits processors, stopping criteria, other decoding
# strategies) and the sampler does not apply: any of them set means model.generate decodes instead, since skipping
# it would silently decode something else than the user asked for.
GENERATE_ONLY_SETTINGS = (
    "suppress_tokens",
    "begin_suppress_tokens",
    "bad_words_ids",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "encoder_repetition_penalty",
    "sequence_bias",
    "min_length",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "exponential_decay_length_penalty",
    "stop_strings",
    "max_time",
    "guidance_scale",
    "watermarking_config",
    "penalty_alpha",
    "dola_layers",
    "prompt_lookup_num_tokens",
    "token_healing",
)
# Warpers that only act when sampling (a greedy decode ignores them): the sampler does temperature, top-k and top-p.
SAMPLING_ONLY_SETTINGS = ("min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
_TOKEN_ID_SETTINGS = ("forced_bos_token_id", "forced_eos_token_id")  # 0 is a token id here, not "off"
_NEUTRAL_VALUES = {"guidance_scale": 1.0, "typical_p": 1.0}


def unsupported_reason(model: Any, generation_config: Any | None = None, sampling: bool = True) -> str | None:
    """Why the fast path cannot decode for this model and generation config (sampling, or greedy for
    evaluation), or None when it can."""
    causal_lm = _causal_lm(model)
    config = causal_lm.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {config.model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (only silu)"
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return "sliding-window attention layers"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    for module in causal_lm.modules():
        if type(module).__name__ in ("Linear4bit", "Linear8bitLt"):
            return "quantized (bitsandbytes) linear layers"
        if hasattr(module, "lora_A") and not getattr(module, "disable_adapters", False):
            active = [name for name in module.active_adapters if name in module.lora_A]
            if len(active) > 1:
                return "more than one active LoRA adapter"
            if any(getattr(module, "use_dora", {}).get(name, False) for name in active):
                return "DoRA adapters"
    # Only q/k/v biases (Qwen2) are in the decode step; Llama's attention_bias also puts one on o_proj, mlp_bias on
    # the MLP. Every layer has the same architecture, so the first one says it.
    block = causal_lm.model.layers[0]
    named = {"o_proj": block.self_attn.o_proj}
    named.update({name: getattr(block.mlp, name) for name in ("gate_proj", "up_proj", "down_proj")})
    for name, module in named.items():
        if getattr(module, "base_layer", module).bias is not None:
            return f"a bias on {name} (attention_bias or mlp_bias in the model's config)"
    if generation_config is not None:
        return _generate_only_setting(generation_config, sampling)
    return None


def _generate_only_setting(config: Any, sampling: bool) -> str | None:
    if (getattr(config, "repetition_penalty", None) or 1.0) != 1.0:
        return "repetition_penalty != 1"
    if getattr(config, "num_beams", 1) not in (None, 1):
        return "beam search"
    for name in GENERATE_ONLY_SETTINGS + (SAMPLING_ONLY_SETTINGS if sampling else ()):
        value = getattr(config, name, None)
        if value is None:
            continue
        if name not in _TOKEN_ID_SETTINGS and (not value or value == _NEUTRAL_VALUES.get(name)):
            continue  # 0, False, an empty list: written out by older configs, and off
        return f"generation_config.{name}={value!r}"
    return None


def _causal_lm(model: Any) -> Any:
    """The transformers *ForCausalLM inside a peft or accelerate wrapper."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    while not hasattr(inner, "lm_head") and hasattr(inner, "module"):
        inner = inner.module
    return inner


class _Lora(NamedTuple):
    """LoRA of a fused projection for decoding: the A rows sit under the base weight (one GEMM gives x W^T and
    x A^T); y += (x A^T) @ b.T with b block-diagonal over the fused projections and the scale folded in."""

    rank: int  # sum of the ranks: the last `rank` rows of the extended weight are A
    b: torch.Tensor  # [out, rank]


class _Layer(NamedTuple):
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    qkv_lora: _Lora | None
    o_lora: _Lora | None
    gate_up_lora: _Lora | None
    down_lora: _Lora | None


class _Projection:
    """One fused decode matrix built from one or more (possibly LoRA-wrapped) linear layers.

    `weight` is [out (+ sum of LoRA ranks), in]: the frozen base rows, then the LoRA A rows (refreshed every step).
    `base` is the view of the base rows, which the training backbone reads too, and the model's own base weights
    become views of the same rows (one copy of the weights in all).
    """

    def __init__(self, modules: list[Any]):
        self.modules = modules
        self.bases: list[Any] = [getattr(m, "base_layer", m) for m in modules]
        self.lora_parts = [_active_lora(m) for m in modules]
        self.out = sum(b.weight.shape[0] for b in self.bases)
        rank = sum(part[0].shape[0] for part in self.lora_parts if part is not None)
        rows = [b.weight.detach() for b in self.bases]
        if rank:
            rows.append(torch.zeros(rank, rows[0].shape[1], dtype=rows[0].dtype, device=rows[0].device))
        self.weight = torch.cat(rows, dim=0)
        self.base = self.weight[: self.out]
        # The base weights become views of their fused rows, so the model holds one copy of its weights, not two:
        # with two, the 8B shape peaked at 33 GB against stock TRL's 17.6 GB (run 6), and a job `grpo estimate` says
        # fits might not. The parameters stay the same objects (the optimizer's, peft's); an in-place update of a
        # trained base weight (full fine-tuning) is then in the fused rows already.
        row = 0
        for base in self.bases:
            rows = base.weight.shape[0]
            base.weight.data = self.weight[row : row + rows]
            row += rows
        biases = [b.bias for b in self.bases]
        self.bias: torch.Tensor | None = None
        if all(b is not None for b in biases):
            self.bias = torch.cat([*(b.detach() for b in biases if b is not None), self.weight.new_zeros(rank)])
        self.lora: _Lora | None = None
        if rank:
            self.lora = _Lora(rank, self.weight.new_zeros(self.out, rank))
        self.refresh(weights=False)

    def refresh(self, weights: bool = True) -> None:
        """Copy what training may have changed into the decode layout (in place: the CUDA graph keeps pointers)."""
        if weights:
            row = 0
            for base in self.bases:
                rows = base.weight.shape[0]
                # Frozen base weights never change, and a shared one (see __init__) is these rows already; one whose
                # storage was replaced since (a load with assign=True, say) is copied in.
                shared = base.weight.data_ptr() == self.weight[row].data_ptr()
                if base.weight.requires_grad and not shared:
                    self.weight[row : row + rows].copy_(base.weight.detach())
                if self.bias is not None and base.bias is not None and base.bias.requires_grad:
                    self.bias[row : row + rows].copy_(base.bias.detach())
                row += rows
        if self.lora is None:
            return
        row, col = 0, self.out
        for base, part in zip(self.bases, self.lora_parts, strict=True):
            rows = base.weight.shape[0]
            if part is not None:
                a, b, scale = part
                rank = a.shape[0]
                self.weight[col : col + rank].copy_(a.detach())
                self.lora.b[row : row + rows, col - self.out : col - self.out + rank].copy_(b.detach() * scale)
                col += rank
            row += rows


def _active_lora(module: Any) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(A weight, B weight, scaling) of a peft LoRA linear with one active adapter, or None for a plain Linear."""
    if not hasattr(module, "lora_A"):
        return None
    if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return None
    active = [name for name in module.active_adapters if name in module.lora_A]
    if not active:
        return None
    if len(active) > 1:
        raise ValueError("fast generation supports one active LoRA adapter")
    name = active[0]
    if getattr(module, "use_dora", {}).get(name, False):
        raise ValueError("fast generation does not support DoRA")
    return module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name])


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same arithmetic as transformers' LlamaRMSNorm/Qwen3RMSNorm: float32 statistics, cast back, then scale.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora: _Lora | None) -> torch.Tensor:
    y = F.linear(x, weight, bias)
    if lora is None:
        return y
    out = lora.b.shape[0]
    base, xa = y[..., :out], y[..., out:]
    if torch.compiler.is_compiling() and y.shape[-2] == 1:
        # Decoding, compiled: B's product over the few LoRA ranks as a reduction that inductor fuses into the kernel
        # that consumes it. As a GEMM (addmm) it cost two more kernels per projection (a copy of `base`, then a
        # GEMM with M = batch size), about a quarter of a decode step on the 0.6B shape.
        return base + (xa.unsqueeze(-2) * lora.b).sum(-1)
    return torch.addmm(base.reshape(-1, out), xa.reshape(-1, lora.rank), lora.b.t()).reshape(*y.shape[:-1], out)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class _Shape:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    scale: float


def _heads(
    qkv: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    shape: _Shape,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a fused q/k/v projection into [B, heads, T, head_dim] tensors, per-head norms (Qwen3) and RoPE applied."""
    batch, steps, _ = qkv.shape
    q_size, kv_size = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    q = qkv[..., :q_size].view(batch, steps, shape.heads, shape.head_dim)
    k = qkv[..., q_size : q_size + kv_size].view(batch, steps, shape.kv_heads, shape.head_dim)
    v = qkv[..., q_size + kv_size :].view(batch, steps, shape.kv_heads, shape.head_dim)
    if q_norm is not None and k_norm is not None:
        q = _rms_norm(q, q_norm, shape.eps)
        k = _rms_norm(k, k_norm, shape.eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos_, sin_ = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos_ + _rotate_half(q) * sin_, k * cos_ + _rotate_half(k) * sin_, v


def _layer_forward(
    x: torch.Tensor,  # [B, T, hidden]
    layer: _Layer,
    shape: _Shape,
    cos: torch.Tensor,  # [B, T, head_dim]
    sin: torch.Tensor,
    mask: torch.Tensor,  # [B, 1, T, L] bool
    k_cache: torch.Tensor,  # [B, kv_heads, L, head_dim]
    v_cache: torch.Tensor,
    slot: torch.Tensor,  # [T] long: cache slots the T new positions are written to
) -> torch.Tensor:
    batch, steps, _ = x.shape
    h = _rms_norm(x, layer.input_norm, shape.eps)
    qkv = _linear(h, layer.qkv, layer.qkv_bias, layer.qkv_lora)
    q, k, v = _heads(qkv, layer.q_norm, layer.k_norm, shape, cos, sin)
    q_size = shape.heads * shape.head_dim
    k_cache.index_copy_(2, slot, k)
    v_cache.index_copy_(2, slot, v)
    if steps == 1:
        # One query per row: grouped-query attention as two small batched products over the whole static cache,
        # `mask` an additive [B, 1, 1, L] bias (0 or -inf). SDPA would take its math fallback here (GQA plus a
        # mask) and copy the cache to repeat its heads.
        groups = shape.heads // shape.kv_heads
        qg = q.reshape(batch, shape.kv_heads, groups, shape.head_dim)
        scores = torch.matmul(qg, k_cache.transpose(2, 3)).float() * shape.scale + mask
        probs = scores.softmax(-1).to(v_cache.dtype)
        attn = torch.matmul(probs, v_cache).reshape(batch, steps, q_size)
    else:
        attn = F.scaled_dot_product_attention(
            q, k_cache, v_cache, attn_mask=mask, scale=shape.scale, enable_gqa=shape.heads != shape.kv_heads
        )
        attn = attn.transpose(1, 2).reshape(batch, steps, q_size)
    x = x + _linear(attn, layer.o, None, layer.o_lora)
    h = _rms_norm(x, layer.post_norm, shape.eps)
    gate_up = _linear(h, layer.gate_up, None, layer.gate_up_lora)
    inter = gate_up.shape[-1] // 2
    h = F.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    return x + _linear(h, layer.down, None, layer.down_lora)


def _prefill_layer(
    x: torch.Tensor,
    layer: _Layer,
    shape: _Shape,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot: torch.Tensor,
) -> torch.Tensor:
    # A code object of its own, so the prompt-length buckets it is compiled for do not count against the decode
    # step's compilations (torch.compile caps recompilations per code object).
    return _layer_forward(x, layer, shape, cos, sin, mask, k_cache, v_cache, slot)


def _decoder_stack(
    x: torch.Tensor,
    layers: list[_Layer],
    shape: _Shape,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor,
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    slot: torch.Tensor,
    layer_fn: Any = _layer_forward,
) -> torch.Tensor:
    """The decoder stack, layer by layer (compiled as a whole, one compilation can fuse across layer boundaries)."""
    for layer, k_cache, v_cache in zip(layers, k_caches, v_caches, strict=True):
        x = layer_fn(x, layer, shape, cos, sin, mask, k_cache, v_cache, slot)
    return x


PROMPT_BUCKET = 64  # compiled prefill: prompts are left-padded to a multiple of this, one compilation per bucket
MAX_PREFILL_GRAPHS = 8  # captured prompt lengths per decode state; other lengths prefill without a graph


@contextmanager
def side_stream() -> Iterator[None]:
    """Run the body on a fresh stream (the warm-up before a capture, as torch.cuda.graphs asks); the caller's stream
    waits for it even when the body raises, so nothing that follows overlaps a half-finished warm-up."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        torch.cuda.current_stream().wait_stream(stream)


@contextmanager
def graph_capture(graph: torch.cuda.CUDAGraph, pool: Any = None) -> Iterator[None]:
    """torch.cuda.graph that leaves the caller's stream current and names the real cause when a capture fails.

    When ending a capture raises (something inside invalidated it), torch's context manager skips restoring the
    caller's stream, and its error ("operation failed due to a previous error during capture") hides the cause,
    which Python keeps as __context__."""
    previous = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    except RuntimeError as error:
        torch.cuda.set_stream(previous)
        cause = error.__context__
        if isinstance(cause, Exception):
            raise RuntimeError(f"CUDA graph capture failed: {type(cause).__name__}: {cause}") from cause
        raise
RECOMPILE_LIMIT = 64  # compilations per function (torch's default, 8, is a hard failure with fullgraph=True)


def compile_shape_static(fn: Any, mode: str | None = None) -> Any:
    """torch.compile for one shape at a time (a compilation per new shape), falling back to `fn` for good if torch
    refuses to compile it again or cannot compile it at all: slower from then on, never a failed run."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    compiled: Any = torch.compile(fn, fullgraph=True, dynamic=False, mode=mode)
    state = {"eager": False}

    def call(*args: Any) -> Any:
        if not state["eager"]:
            try:
                return compiled(*args)
            except torch._dynamo.exc.FailOnRecompileLimitHit as error:
                state["eager"] = True
                log.warning("%s: too many shapes to compile (%s); running it uncompiled", fn.__name__, error)
            except torch._dynamo.exc.TorchDynamoException as error:
                # A compiler failure (dynamo, or inductor and Triton under BackendCompilerFailed) on a new torch or
                # GPU: the function itself is plain PyTorch, so run it as written. Only this family: checkpointing
                # stops its recomputation with an exception of its own, which must pass through. Inside a CUDA graph
                # capture the capture is already broken: re-raise and let the caller go on without the graph.
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    raise
                state["eager"] = True
                log.warning("%s could not be compiled (%s: %s); running it uncompiled", fn.__name__,
                            type(error).__name__, first_line(error))
        return fn(*args)

    return call


@dataclass
class Rollout:
    """Sampled completions: `tokens[b, :lengths[b]]` is completion b, ending with its EOS when it has one."""

    tokens: torch.Tensor  # [B, max_new_tokens] on the host
    logprobs: torch.Tensor  # [B, max_new_tokens] log-probability of each sampled token (after temperature)
    lengths: list[int]

    def completion_ids(self) -> list[list[int]]:
        return [self.tokens[b, :n].tolist() for b, n in enumerate(self.lengths)]


class FastWeights:
    """The model's weights in the fused decode layout, shared by the sampler and the training backbone."""

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"fast generation does not support {reason}")
        self.model = _causal_lm(model)
        config = self.model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.shape = _Shape(
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            eps=config.rms_norm_eps,
            scale=head_dim**-0.5,
        )
        self.projections: list[_Projection] = []
        self.layers: list[_Layer] = []
        with torch.no_grad():
            for block in self.model.model.layers:
                attn, mlp = block.self_attn, block.mlp
                qkv = _Projection([attn.q_proj, attn.k_proj, attn.v_proj])
                o = _Projection([attn.o_proj])
                gate_up = _Projection([mlp.gate_proj, mlp.up_proj])
                down = _Projection([mlp.down_proj])
                self.projections += [qkv, o, gate_up, down]
                q_norm = getattr(attn, "q_norm", None)
                k_norm = getattr(attn, "k_norm", None)
                self.layers.append(
                    _Layer(
                        input_norm=block.input_layernorm.weight,
                        post_norm=block.post_attention_layernorm.weight,
                        q_norm=q_norm.weight if q_norm is not None else None,
                        k_norm=k_norm.weight if k_norm is not None else None,
                        qkv=qkv.weight,
                        qkv_bias=qkv.bias,
                        o=o.weight,
                        gate_up=gate_up.weight,
                        down=down.weight,
                        qkv_lora=qkv.lora,
                        o_lora=o.lora,
                        gate_up_lora=gate_up.lora,
                        down_lora=down.lora,
                    )
                )

    def refresh(self) -> None:
        """Pick up the training model's current weights (call after every optimizer step)."""
        with torch.no_grad():
            for projection in self.projections:
                projection.refresh()


class StaticCacheSampler:
    """Samples a batch of completions for left-padded prompts with a preallocated KV cache.

    On CUDA the decode step is captured once per (batch size, cache length) as a CUDA graph; on the CPU the same code
    runs eagerly (used by the tests to check the arithmetic against `model.generate`).
    """

    def __init__(
        self,
        model: nn.Module,
        sampling: SamplingSettings,
        *,
        pad_token_id: int,
        use_cuda_graph: bool | None = None,
        compile_layers: bool = False,
        compile_stack: bool = False,
        compile_mode: str | None = None,
        check_every: int = 16,
        weights: FastWeights | None = None,
        prefill_graphs: bool = False,
    ) -> None:
        self.sampling = sampling
        self.pad_token_id = pad_token_id
        self.check_every = check_every
        self.weights = weights if weights is not None else FastWeights(model)
        self.model = self.weights.model
        self.shape = self.weights.shape
        self.layers = self.weights.layers
        self.device = self.model.lm_head.weight.device
        self.dtype = self.model.lm_head.weight.dtype
        self.use_cuda_graph = (self.device.type == "cuda") if use_cuda_graph is None else use_cuda_graph
        # compile_stack: the decode step's whole decoder stack as one compiled graph (longer compilation, fewer
        # kernels); compile_mode: torch.compile's mode (e.g. "max-autotune-no-cudagraphs"). Both are experiments the
        # benchmark measures; the default is one compiled layer function serving every layer.
        compile_layers = compile_layers or compile_stack
        per_layer = compile_layers and not compile_stack
        self.layer_fn = compile_shape_static(_layer_forward, compile_mode) if per_layer else None
        self.stack_fn = compile_shape_static(_decoder_stack, compile_mode) if compile_stack else None
        self.prefill_fn = compile_shape_static(_prefill_layer, compile_mode) if compile_layers else None
        # prefill_graphs: the prefill of each prompt length also replayed as a CUDA graph (in the decode graph's
        # memory pool). It is a few hundred launches per rollout: 14.5 ms eagerly, 4.8 ms replayed for Qwen3-0.6B on
        # an H200 (docs/benchmarks.md, run 6). `grpo train` turns it on with a GPU; a CPU has no CUDA graphs.
        self.prefill_graphs = prefill_graphs
        self.prefill_graph_error: str | None = None
        self._eos = torch.tensor(sampling.eos_token_ids or [-1], device=self.device)
        self._has_eos = bool(sampling.eos_token_ids)
        self._state: _DecodeState | None = None
        self.capture_error: str | None = None

    def refresh(self) -> None:
        self.weights.refresh()

    def prompt_length(self, longest: int) -> int:
        """The length prompts are left-padded to: compiled or graph-replayed prefills round it up to a bucket, so that
        one compilation and one prefill graph serve a bucket of lengths rather than each length."""
        if self.prefill_fn is not None or self.prefill_graphs:
            return -(-longest // PROMPT_BUCKET) * PROMPT_BUCKET
        return longest

    # ---- sampling ----
    def generate(self, prompts: list[list[int]]) -> Rollout:
        batch, prompt_len = len(prompts), self.prompt_length(max(len(p) for p in prompts))
        capacity = prompt_len + self.sampling.max_new_tokens
        state = self._state
        if state is None or state.batch != batch or state.capacity < capacity:
            # Round the cache up so that prompts of slightly different lengths reuse one captured graph.
            state = self._state = _DecodeState(self, batch, -(-capacity // 128) * 128)
        with torch.no_grad():
            state.prefill(prompts, prompt_len)
            finished = self.sampling.max_new_tokens <= 1
            for step in range(1, self.sampling.max_new_tokens):
                if finished:
                    break
                state.decode()
                # Ask the device whether every row has ended only now and then: each question is a host sync.
                if self._has_eos and step % self.check_every == 0 and step >= self.sampling.min_new_tokens:
                    finished = bool(state.done.all())
            # A copy even on the CPU (where .cpu() would alias): the buffers are reused by the next generate().
            tokens = state.out_tokens.to("cpu", copy=True)
            logprobs = state.out_logprobs.to("cpu", copy=True)
        lengths = []
        eos = set(self.sampling.eos_token_ids)
        for row in tokens.tolist():
            end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            lengths.append(end)
        return Rollout(tokens=tokens, logprobs=logprobs, lengths=lengths)


class _DecodeState:
    """Preallocated tensors for one batch size and cache length, and the captured decode graph."""

    def __init__(self, sampler: StaticCacheSampler, batch: int, capacity: int) -> None:
        self.sampler, self.batch, self.capacity = sampler, batch, capacity
        s, device = sampler.shape, sampler.device
        n_new = sampler.sampling.max_new_tokens
        self.k_cache = [
            torch.zeros(batch, s.kv_heads, capacity, s.head_dim, dtype=sampler.dtype, device=device)
            for _ in sampler.layers
        ]
        self.v_cache = [torch.zeros_like(k) for k in self.k_cache]
        positions = torch.arange(capacity, device=device)[None]
        probe = torch.zeros(1, dtype=sampler.dtype, device=device)
        cos, sin = sampler.model.model.rotary_emb(probe, positions)
        self.cos_table, self.sin_table = cos[0], sin[0]  # [capacity, head_dim]
        # Decode inputs, advanced in place by the captured step.
        self.token = torch.zeros(batch, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        # Additive attention bias over the cache slots: 0 where a key is valid, -inf elsewhere.
        self.key_bias = torch.full((batch, 1, 1, capacity), float("-inf"), device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.out_tokens = torch.zeros(batch, n_new, dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros(batch, n_new, dtype=torch.float32, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        # Prompt length -> (graph, static tokens, static pad counts); see StaticCacheSampler's prefill_graphs.
        self.prefill_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        if sampler.use_cuda_graph:
            try:
                self._capture()
            except RuntimeError as error:
                # Still correct without the graph, only slower: say so once instead of failing the run.
                sampler.capture_error = f"{type(error).__name__}: {error}"[:500]
                log.warning("CUDA graph capture failed, decoding eagerly: %s", sampler.capture_error)
                self.graph = None

    def _forward(
        self,
        tokens: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        slots: torch.Tensor,
        layer_fn: Any = _layer_forward,
        stack_fn: Any = None,
    ) -> torch.Tensor:
        """Hidden state after the final norm for the last position of each row."""
        sampler = self.sampler
        x = F.embedding(tokens, sampler.model.model.embed_tokens.weight)
        if stack_fn is not None:
            x = stack_fn(x, sampler.layers, sampler.shape, cos, sin, mask, self.k_cache, self.v_cache, slots)
        else:
            caches = (self.k_cache, self.v_cache)
            x = _decoder_stack(x, sampler.layers, sampler.shape, cos, sin, mask, *caches, slots, layer_fn)
        return _rms_norm(x[:, -1], sampler.model.model.norm.weight, sampler.shape.eps)

    def _sample(self, hidden: torch.Tensor) -> None:
        """Draw the next token from the last hidden state and write it to out_tokens[:, step] (no host sync)."""
        sampler, settings = self.sampler, self.sampler.sampling
        logits = F.linear(hidden, sampler.model.lm_head.weight).float()
        if settings.do_sample and settings.temperature > 0:
            logits = logits / settings.temperature
        # The log-probability TRL's loss uses: temperature applied, before any suppression or truncation.
        logprobs = logits.log_softmax(-1)
        if settings.min_new_tokens > 0 and sampler._has_eos:
            suppress = self.step < settings.min_new_tokens  # [1] bool, evaluated on the device
            eos_logits = logits.index_select(1, sampler._eos)
            logits = logits.index_copy(1, sampler._eos, torch.where(suppress, float("-inf"), eos_logits))
        if not settings.do_sample or settings.temperature == 0:
            token = logits.argmax(-1)
        else:
            filtered = logits
            if settings.top_k is not None:
                kth = torch.topk(filtered, settings.top_k, dim=-1).values[:, -1:]
                filtered = filtered.masked_fill(filtered < kth, float("-inf"))
            if settings.top_p is not None:
                sorted_logits, order = torch.sort(filtered, descending=False, dim=-1)
                cumulative = sorted_logits.softmax(-1).cumsum(-1)
                remove_sorted = cumulative <= (1 - settings.top_p)
                remove_sorted[:, -1] = False  # always keep the most likely token
                remove = remove_sorted.scatter(1, order, remove_sorted)
                filtered = filtered.masked_fill(remove, float("-inf"))
            probs = filtered.softmax(-1)
            # Exponential race (Gumbel-max): argmax(p / E) with E ~ Exp(1) is a draw from p, without the host
            # sync that torch.multinomial needs, so it can live inside the CUDA graph.
            token = (probs / torch.empty_like(probs).exponential_()).argmax(-1)
        if sampler._has_eos:
            # Rows that already ended keep emitting EOS, so `done` stays a plain OR over steps.
            token = torch.where(self.done, sampler._eos[0], token)
            self.done |= (token[:, None] == sampler._eos[None]).any(-1)
        self.out_tokens.index_copy_(1, self.step, token[:, None])
        self.out_logprobs.index_copy_(1, self.step, logprobs.gather(1, token[:, None]))
        self.token.copy_(token)

    def _decode_step(self) -> None:
        self.key_bias.index_fill_(3, self.slot, 0.0)
        mask = self.key_bias
        cos = self.cos_table.index_select(0, self.position)[:, None]
        sin = self.sin_table.index_select(0, self.position)[:, None]
        sampler = self.sampler
        hidden = self._forward(
            self.token[:, None], cos, sin, mask, self.slot, sampler.layer_fn or _layer_forward, sampler.stack_fn
        )
        self._sample(hidden)
        self.position += 1
        self.slot += 1
        self.step += 1

    def _capture(self) -> None:
        # Warm up (cuBLAS handles, compiled kernels) before capturing.
        with side_stream(), torch.no_grad():
            for _ in range(2):
                self.slot.zero_()
                self.step.zero_()
                self._decode_step()
        self.slot.zero_()
        self.step.zero_()
        graph = torch.cuda.CUDAGraph()
        with graph_capture(graph), torch.no_grad():
            self._decode_step()
        self.graph = graph

    def decode(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._decode_step()

    def prefill(self, prompts: list[list[int]], length: int | None = None) -> None:
        """Run the prompts (left-padded to `length`, default the longest) through the model and sample token 0."""
        sampler, device = self.sampler, self.sampler.device
        length = max(len(p) for p in prompts) if length is None else length
        padded = [[sampler.pad_token_id] * (length - len(p)) + list(p) for p in prompts]
        tokens = torch.tensor(padded, dtype=torch.long, device=device)
        pads = torch.tensor([length - len(p) for p in prompts], device=device)
        if self.graph is not None and sampler.prefill_graphs and sampler.prefill_graph_error is None:
            captured = self.prefill_graphs.get(length)
            if captured is None and len(self.prefill_graphs) < MAX_PREFILL_GRAPHS:
                captured = self._capture_prefill(tokens, pads)
            if captured is not None:
                graph, static_tokens, static_pads = captured
                static_tokens.copy_(tokens)
                static_pads.copy_(pads)
                graph.replay()
                return
        self._prefill(tokens, pads)

    def _capture_prefill(
        self, tokens: torch.Tensor, pads: torch.Tensor
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor] | None:
        assert self.graph is not None
        static_tokens, static_pads = tokens.clone(), pads.clone()
        try:
            # Warm up (compiles the prefill for this length), then capture into the decode graph's pool: prefill and
            # decode replays never overlap, so their temporaries may share memory.
            with side_stream(), torch.no_grad():
                self._prefill(static_tokens, static_pads)
            graph = torch.cuda.CUDAGraph()
            with graph_capture(graph, pool=self.graph.pool()), torch.no_grad():
                self._prefill(static_tokens, static_pads)
        except RuntimeError as error:
            # Still correct without it, only slower: say so once, and prefill eagerly from now on.
            self.sampler.prefill_graph_error = f"{type(error).__name__}: {error}"[:500]
            log.warning("CUDA graph capture of the prefill failed, prefilling eagerly: %s", error)
            return None
        self.prefill_graphs[tokens.shape[1]] = (graph, static_tokens, static_pads)
        return self.prefill_graphs[tokens.shape[1]]

    def _prefill(self, tokens: torch.Tensor, pads: torch.Tensor) -> None:
        """The prefill on the device, from left-padded tokens [B, T] and each row's pad count [B] (no host sync)."""
        sampler, device = self.sampler, self.sampler.device
        length = tokens.shape[1]
        columns = torch.arange(length, device=device)
        valid = columns[None] >= pads[:, None]  # [B, T]
        positions = (columns[None] - pads[:, None]).clamp(min=0)
        self.key_bias.fill_(float("-inf"))
        self.key_bias[:, 0, 0, :length].masked_fill_(valid, 0.0)
        self.done.zero_()
        self.out_tokens.fill_(sampler.pad_token_id)
        self.out_logprobs.zero_()
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        mask = causal[None] & valid[:, None, :]
        # A left-pad query sees no valid key; let it see itself so softmax never divides by zero (its output is
        # never read, but a NaN in the cache would poison every later attention product).
        mask |= torch.eye(length, dtype=torch.bool, device=device)[None]
        full_mask = torch.zeros(self.batch, 1, length, self.capacity, dtype=torch.bool, device=device)
        full_mask[:, 0, :, :length] = mask
        cos = self.cos_table[positions]
        sin = self.sin_table[positions]
        slots = columns
        self.step.zero_()
        hidden = self._forward(tokens, cos, sin, full_mask, slots, sampler.prefill_fn or _layer_forward)
        self._sample(hidden)
        self.position.copy_(positions[:, -1] + 1)
        self.slot.fill_(length)
        self.step.fill_(1)
