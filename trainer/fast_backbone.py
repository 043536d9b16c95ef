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

import logging
import warnings
import weakref
from collections.abc import Callable
from types import MethodType
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from nodus.trainer.fast_generation import (
    FastWeights,
    _heads,
    _Projection,
    _rms_norm,
    _Shape,
    compile_shape_static,
    graph_capture,
    side_stream,
)
from torch.utils.checkpoint import checkpoint

log = logging.getLogger(__name__)

SEQ_BUCKET = 32  # CUDA-graph training: sequences are right-padded to a multiple of this, one capture per length
MAX_GRAPHS = 8  # captured sequence lengths kept; longer-tailed length mixes run the rest without graphs


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
        # The stack reads biases from the fused copy, which gets no gradient (peft's bias="all" or "lora_only").
        if any(base.bias is not None and base.bias.requires_grad for base in projection.bases):
            return "trainable biases"
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
    layer_fn: Any = _train_layer,
) -> torch.Tensor:
    """The decoder stack, layer by layer (compiled as a whole, one compilation covers forward and backward)."""
    for layer in layers:
        if checkpointing:
            # No RNG state to preserve (no dropout here), and saving it is not allowed inside a graph capture.
            x = checkpoint(layer_fn, x, layer, shape, cos, sin, mask, use_reentrant=False, preserve_rng_state=False)
        else:
            x = layer_fn(x, layer, shape, cos, sin, mask)
    return x


class _GraphedStack:
    """The decoder stack's forward and backward for one input shape, each captured once as a CUDA graph.

    Why: the update is bound by the host (about 100 kernel launches per layer and step with checkpointing, each some
    microseconds of Python), not by the GPU. A replay launches them all at once. Inputs are copied into static
    buffers; the frozen weights and the LoRA parameters are read in place (the optimizer updates them in place, so
    their addresses never change). With `use_cuda_graph=False` the same object runs eagerly (the CPU tests)."""

    def __init__(
        self,
        run: Any,
        inputs: list[torch.Tensor | None],
        params: list[torch.Tensor],
        use_cuda_graph: bool,
        pool: Any = None,
    ):
        self.run, self.params, self.use_cuda_graph = run, params, use_cuda_graph
        self.static_in = [t.detach().clone() if t is not None else None for t in inputs]
        self.generation = 0  # forwards run so far; a backward must belong to the latest one
        self._awaiting_backward = False
        # The autograd node of the latest forward: if its graph is dropped without a backward (a forward under
        # grad whose result was thrown away, an exception before the backward), nothing can ask for that backward.
        self.owner: Callable[[], Any] | None = None
        self.eager_out: torch.Tensor | None = None
        self.static_out: torch.Tensor | None = None
        if use_cuda_graph:
            self._capture(pool)

    @property
    def pending(self) -> bool:
        """A forward whose backward has not run yet and still can: its activations live in the graph's memory."""
        return self._awaiting_backward and self.owner is not None and self.owner() is not None

    def _grads(self, out: torch.Tensor, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return torch.autograd.grad(out, self.params, grad_out, allow_unused=True)

    def _capture(self, pool: Any) -> None:
        # Warm up (compilation, cuBLAS and cuDNN handles) before capturing.
        with side_stream(), torch.enable_grad():
            for _ in range(2):
                out = self.run(*self.static_in)
                self._grads(out, torch.ones_like(out))
                del out
        self.forward_graph = torch.cuda.CUDAGraph()
        with graph_capture(self.forward_graph, pool=pool), torch.enable_grad():
            static_out: torch.Tensor = self.run(*self.static_in)
        self.static_out = static_out
        self.static_grad_out = torch.empty_like(static_out)
        self.backward_graph = torch.cuda.CUDAGraph()
        with graph_capture(self.backward_graph, pool=pool):
            self.static_grads = self._grads(static_out, self.static_grad_out)

    def forward(self, inputs: list[torch.Tensor | None]) -> torch.Tensor:
        for static, given in zip(self.static_in, inputs, strict=True):
            if static is not None and given is not None and static.data_ptr() != given.data_ptr():
                static.copy_(given)
        self.generation += 1
        self._awaiting_backward = True
        if self.use_cuda_graph:
            assert self.static_out is not None
            self.forward_graph.replay()
            return self.static_out.detach().clone()  # the next replay overwrites static_out
        with torch.enable_grad():
            self.eager_out = self.run(*self.static_in)
        return self.eager_out.detach().clone()

    def backward(self, generation: int, grad_out: torch.Tensor) -> list[torch.Tensor | None]:
        if generation != self.generation or not self.pending:
            raise RuntimeError("a CUDA-graph training forward was run again before the backward of the previous one")
        self._awaiting_backward = False
        if self.use_cuda_graph:
            self.static_grad_out.copy_(grad_out)
            self.backward_graph.replay()
            grads = self.static_grads
        else:
            assert self.eager_out is not None
            grads = self._grads(self.eager_out, grad_out)
            self.eager_out = None
        # Fresh tensors: autograd may keep a returned gradient as the parameter's .grad, and the next replay
        # overwrites the static ones.
        present = [g for g in grads if g is not None]
        copies = iter(torch._foreach_mul(present, 1.0)) if present else iter(())
        return [next(copies) if g is not None else None for g in grads]


class _GraphedStackFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, graphed: _GraphedStack, inputs: list[torch.Tensor | None], *params: torch.Tensor) -> Any:
        ctx.graphed = graphed
        out = graphed.forward(inputs)
        ctx.generation = graphed.generation
        graphed.owner = weakref.ref(ctx)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        return (None, None, *ctx.graphed.backward(ctx.generation, grad_out))


# The LoRA parameters' gradient accumulators are made on the capture's side stream; the next backward on the default
# stream then warns (8 lines, once per GPU run: runs 6, 7 and 8) that they may cost a synchronization. The gradients
# are the same (run 6: replayed against eager, relative error 0.0). The warning comes at that later backward, inside
# TRL's step, so a filter scoped to the capture missed it (run 8): it is filtered by its message, for the process.
STREAM_MISMATCH_WARNING = "The AccumulateGrad node's stream does not match"


def ignore_stream_mismatch_warning() -> None:
    warnings.filterwarnings("ignore", message=STREAM_MISMATCH_WARNING, category=UserWarning)


class FastBackbone:
    """Stands in for `model.model.forward` (the decoder stack) in training forwards; see the module docstring."""

    def __init__(
        self,
        weights: FastWeights,
        *,
        compile_layers: bool = False,
        compile_stack: bool = False,
        compile_mode: str | None = None,
        cuda_graphs: bool | str = False,
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
        self.compiled = compile_layers or compile_stack
        self.layer_fn: Any = compile_shape_static(_train_layer, compile_mode) if compile_layers else _train_layer
        # compile_stack (an experiment the benchmark measures): the whole stack, checkpointing included, as one graph.
        self.stack_fn: Any = compile_shape_static(_train_stack, compile_mode) if compile_stack else None
        self.original_forward = self.model.model.forward
        self.calls = 0  # forwards this backbone handled (the rest went to the model's own)
        # cuda_graphs=True: training forwards and backwards replayed as CUDA graphs (CUDA only; `grpo train` turns it
        # on with a GPU: the 0.6B update took 0.155 -> 0.053 s, docs/benchmarks.md run 6); "emulate" runs the same
        # bookkeeping eagerly, which is what the CPU tests check.
        self.cuda_graphs = cuda_graphs
        self.graph_error: str | None = None
        if cuda_graphs is True and self.model.lm_head.weight.device.type != "cuda":
            # grpo train asks for graphs on a GPU host, but the Trainer may have put the model elsewhere
            # (--trl use_cpu=true): then the same stack runs without graphs, as after a failed capture.
            self.graph_error = f"the model is on {self.model.lm_head.weight.device.type}, not a CUDA device"
            log.warning("Training forwards run without CUDA graphs: %s.", self.graph_error)
        self.graph_calls = 0  # forwards that replayed a captured graph
        self.graph_skips = 0  # forwards with gradients that ran plainly because another one awaited its backward
        self._graphs: dict[tuple[Any, ...], _GraphedStack] = {}
        # One memory pool for every captured length, as torch.cuda.make_graphed_callables shares one: a length's
        # temporaries (checkpoint recompute, attention workspaces) reuse the others' instead of each length keeping
        # its own. Safe because at most one graph has a forward awaiting its backward (see _graphed): a replay may
        # overwrite another graph's temporaries and its static outputs, never the saved activations of a pending one,
        # and static outputs are copied out right after each replay.
        self._pool = torch.cuda.graph_pool_handle() if cuda_graphs is True and self.graph_error is None else None
        if self._pool is not None:
            ignore_stream_mismatch_warning()
        params: dict[int, torch.Tensor] = {}
        for layer in self.layers:
            for projection in (layer.qkv, layer.o, layer.gate_up, layer.down):
                for adapter in projection.adapters:
                    if adapter is not None:
                        params.setdefault(id(adapter.a), adapter.a)
                        params.setdefault(id(adapter.b), adapter.b)
        self.params = list(params.values())
        # A replayed graph hands gradients to these LoRA parameters alone (see _GraphedStackFunction), none to its
        # input: any other trainable weight the stack reads (peft's modules_to_save, a trained norm or embedding)
        # would silently stop training. Such a model runs the same written-out stack without graphs.
        stack = self.model.model
        captured = {id(param) for param in self.params}
        others = [
            name
            for part in ("layers", "embed_tokens")
            for name, param in getattr(stack, part).named_parameters(prefix=part)
            if param.requires_grad and id(param) not in captured
        ]
        if cuda_graphs and others and self.graph_error is None:
            more = f" and {len(others) - 2} more" if len(others) > 2 else ""
            self.graph_error = f"trainable weights outside the LoRA adapters ({', '.join(others[:2])}{more})"
            log.warning("Training forwards run without CUDA graphs: %s.", self.graph_error)

    def install(self) -> None:
        backbone = self

        def forward(module: Any, input_ids: Any = None, attention_mask: Any = None, **kwargs: Any) -> Any:
            if input_ids is None or not backbone.handles(kwargs):
                return backbone.original_forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            return backbone(input_ids, attention_mask)

        self.model.model.forward = MethodType(forward, self.model.model)

    def release_graphs(self) -> None:
        """Drop the captured training graphs and their memory pool (after training: nothing replays them again)."""
        self._graphs.clear()
        self.cuda_graphs = False

    def uninstall(self) -> None:
        self.model.model.__dict__.pop("forward", None)

    def handles(self, kwargs: dict[str, Any]) -> bool:
        """Only plain forwards with the adapter on: no cache, no precomputed embeddings or positions, no extra
        outputs. With peft's `disable_adapter()` (TRL's reference model when beta > 0) the model's own forward runs."""
        if kwargs.get("use_cache"):
            return False
        for projection in self.weights.projections[:1]:
            for module, part in zip(projection.modules, projection.lora_parts, strict=True):
                if getattr(module, "disable_adapters", False):
                    return False
                # Another adapter switched on (TRL's "ref" adapter for the KL term of a PeftModel it was given):
                # this backbone computes with the one it captured, so the model's own forward must run.
                active = [name for name in getattr(module, "active_adapters", []) if name in module.lora_A]
                if part is not None and (len(active) != 1 or module.lora_A[active[0]].weight is not part[0]):
                    return False
        return all(value is None or key == "use_cache" for key, value in kwargs.items())

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPast

        self.calls += 1
        model = self.model.model
        steps = input_ids.shape[1]
        # Left padding (rows of different prompt lengths) needs a mask; without it SDPA runs causal-only, its fastest.
        left_padded = attention_mask is not None and not bool(attention_mask.all())
        graphs = bool(self.cuda_graphs) and torch.is_grad_enabled() and self.graph_error is None
        if (graphs or self.compiled) and steps % SEQ_BUCKET:
            # Right padding keeps the captured (or compiled) lengths few; causal attention keeps the real positions
            # unchanged.
            extra = SEQ_BUCKET - steps % SEQ_BUCKET
            input_ids = F.pad(input_ids, (0, extra), value=0)
            if attention_mask is not None:
                attention_mask = F.pad(attention_mask, (0, extra), value=0)
        length = input_ids.shape[1]
        x = F.embedding(input_ids, model.embed_tokens.weight)
        positions = torch.arange(length, device=input_ids.device)[None]
        cos, sin = model.rotary_emb(x, positions)
        mask = None
        if left_padded and attention_mask is not None:
            valid = attention_mask.bool()
            causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
            # A pad query sees no valid key; let it see itself (its output is never scored) instead of NaN.
            mask = (causal[None] & valid[:, None, :]) | torch.eye(length, dtype=torch.bool, device=x.device)[None]
            mask = mask[:, None]
        checkpointing = torch.is_grad_enabled() and getattr(model, "gradient_checkpointing", False)
        out = self._graphed(x, cos, sin, mask, checkpointing) if graphs else None
        x = (out if out is not None else self._stack(x, cos, sin, mask, checkpointing))[:, :steps]
        return BaseModelOutputWithPast(last_hidden_state=_rms_norm(x, model.norm.weight, self.weights.shape.eps))

    def _stack(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, checkpointing: bool
    ) -> torch.Tensor:
        shape = self.weights.shape
        if self.stack_fn is not None:
            out: torch.Tensor = self.stack_fn(x, self.layers, shape, cos, sin, mask, checkpointing)
            return out
        return _train_stack(x, self.layers, shape, cos, sin, mask, checkpointing, self.layer_fn)

    def _graphed(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, checkpointing: bool
    ) -> torch.Tensor | None:
        """The stack through a captured graph for this shape, or None to run it plainly."""
        # Autocast is part of what a graph replays: a graph captured under bf16 autocast must not serve fp32.
        device = x.device.type
        autocast = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device)
        key = (tuple(x.shape), None if mask is None else tuple(mask.shape), checkpointing, x.dtype, autocast)
        if any(other.pending for other in self._graphs.values()):
            self.graph_skips += 1
            return None  # a forward's backward has not run: its activations in the shared pool must stay
        graphed = self._graphs.get(key)
        if graphed is None:
            if len(self._graphs) >= MAX_GRAPHS:
                return None

            def run(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None) -> Any:
                return self._stack(x, cos, sin, mask, checkpointing)

            try:
                graphed = _GraphedStack(run, [x, cos, sin, mask], self.params, self.cuda_graphs is True, self._pool)
            except Exception as error:  # noqa: BLE001 - any capture failure: still correct without graphs
                # Only slower without graphs: say so once instead of failing the run.
                self.graph_error = f"{type(error).__name__}: {error}"[:500]
                log.warning("CUDA graph capture of the training forward failed, running plainly: %s", self.graph_error)
                return None
            self._graphs[key] = graphed
        self.graph_calls += 1
        out: torch.Tensor = _GraphedStackFunction.apply(graphed, [x, cos, sin, mask], *self.params)
        return out
