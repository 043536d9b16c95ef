"""The fast GRPO path (static-cache sampler, fused training backbone, FastGRPOTrainer) against the models' own code.

The fast path rewrites the decoder by hand, so every check here compares it with transformers/peft on tiny random
fp32 models (CPU, eager sampler): same greedy tokens as `model.generate`, same log-probabilities and gradients as the
model's own forward, and the sampler following the adapter after it changes. No mocks.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from nodus.trainer import fast_backbone, fast_generation  # noqa: E402
from nodus.trainer.fast_backbone import FastBackbone  # noqa: E402
from nodus.trainer.fast_generation import FastWeights, SamplingSettings, StaticCacheSampler  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import (  # noqa: E402
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 96
PAD = 0
# Left padding matters: rows of different lengths put the prompt and the positions at different columns.
PROMPTS = [[5, 17, 33, 2, 61], [9, 40], [70, 3, 3, 88, 12, 51, 7, 29], [44]]
GREEDY = SamplingSettings(max_new_tokens=12, eos_token_ids=(), do_sample=False, temperature=0)
SHAPE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=PAD,
    bos_token_id=None,
    eos_token_id=None,
    tie_word_embeddings=False,
    initializer_range=0.1,  # sharper than the default so greedy choices have clear margins
)


def tiny_model(kind: str = "qwen3", seed: int = 0) -> Any:
    torch.manual_seed(seed)
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **SHAPE))
    elif kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(head_dim=16, **SHAPE))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))  # q/k/v biases: exercises the fused bias
    else:
        raise ValueError(kind)
    return model.float().eval()


def lora_model(seed: int = 0, **lora: Any) -> Any:
    """Tiny Qwen3 with LoRA on every linear and a nonzero B, so the adapter changes the outputs."""
    model = get_peft_model(
        tiny_model("qwen3", seed), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", **lora)
    )
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    return model.eval()


def left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def hf_greedy(model: Any, prompts: list[list[int]], new_tokens: int, **kwargs: Any) -> torch.Tensor:
    ids, mask = left_pad(prompts)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=PAD,
            **kwargs,
        )
    return out[:, ids.shape[1] :]


def teacher_forced_logprobs(
    model: Any, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0
) -> list[torch.Tensor]:
    """Log-probability of each completion token under the model's own forward (positions as generate sets them)."""
    ids, mask = left_pad([p + c for p, c in zip(prompts, completions, strict=True)])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    logp = (logits / temperature).log_softmax(-1)
    width = ids.shape[1]
    out = []
    for b, completion in enumerate(completions):
        cols = torch.arange(width - len(completion), width)
        out.append(logp[b, cols - 1, ids[b, cols]])
    return out


# -- sampler against model.generate -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen3", "llama", "qwen2"])
def test_greedy_matches_generate(kind: str) -> None:
    """The hand-written decode step must be the model's arithmetic: greedy tokens equal generate's, every row."""
    model = tiny_model(kind)
    sampler = StaticCacheSampler(model, GREEDY, pad_token_id=PAD)
    rollout = sampler.generate(PROMPTS)
    expected = hf_greedy(model, PROMPTS, GREEDY.max_new_tokens)
    assert rollout.tokens.shape == expected.shape
    assert torch.equal(rollout.tokens, expected)
    assert rollout.lengths == [GREEDY.max_new_tokens] * len(PROMPTS)
    # Not a degenerate model that repeats one token forever: the comparison above has something to catch.
    assert len(set(rollout.tokens.flatten().tolist())) > 3


def test_sampled_logprobs_match_teacher_forced_forward() -> None:
    """GRPO's importance ratio needs the sampler's log-probs to be the policy's: equal to a teacher-forced forward."""
    model = tiny_model("qwen3")
    settings = SamplingSettings(max_new_tokens=12, eos_token_ids=(), do_sample=True, temperature=0.7)
    sampler = StaticCacheSampler(model, settings, pad_token_id=PAD)
    torch.manual_seed(123)
    rollout = sampler.generate(PROMPTS)
    completions = rollout.completion_ids()
    reference = teacher_forced_logprobs(model, PROMPTS, completions, temperature=0.7)
    for b, expected in enumerate(reference):
        torch.testing.assert_close(rollout.logprobs[b, : len(completions[b])], expected, atol=1e-4, rtol=0)
    # Sampling, not argmax: at least one token differs from the greedy choice.
    greedy = StaticCacheSampler(model, GREEDY, pad_token_id=PAD).generate(PROMPTS)
    assert not torch.equal(rollout.tokens, greedy.tokens)


def test_rollout_survives_next_generate() -> None:
    """A Rollout is a result handed to the caller: sampling again must not rewrite it (on the CPU, Tensor.cpu() would
    hand out the sampler's own buffers)."""
    model = tiny_model("qwen3")
    sampler = StaticCacheSampler(model, GREEDY, pad_token_id=PAD)
    first = sampler.generate(PROMPTS)
    tokens, logprobs = first.tokens.clone(), first.logprobs.clone()
    second = sampler.generate([[p[0]] for p in PROMPTS])  # other prompts: other completions
    assert not torch.equal(second.tokens, tokens)
    assert torch.equal(first.tokens, tokens)
    assert torch.equal(first.logprobs, logprobs)


def test_lora_sampler_follows_adapter_after_refresh() -> None:
    """LoRA is applied unmerged and copied on refresh(): the sampler must track the adapter as training moves it."""
    model = lora_model()
    sampler = StaticCacheSampler(model, GREEDY, pad_token_id=PAD)
    before = sampler.generate(PROMPTS)
    assert torch.equal(before.tokens, hf_greedy(model, PROMPTS, GREEDY.max_new_tokens))
    with model.disable_adapter():
        without_adapter = hf_greedy(model, PROMPTS, GREEDY.max_new_tokens)
    assert not torch.equal(before.tokens, without_adapter), "the adapter must matter for this test to mean anything"

    torch.manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn_like(param) * 0.1)
    stale = sampler.generate(PROMPTS)
    assert torch.equal(stale.logprobs, before.logprobs), "the sampler reads copies: it changes only on refresh()"

    sampler.refresh()
    after = sampler.generate(PROMPTS)
    assert torch.equal(after.tokens, hf_greedy(model, PROMPTS, GREEDY.max_new_tokens))
    assert not torch.allclose(after.logprobs, before.logprobs, atol=1e-3)
    completions = after.completion_ids()
    for b, expected in enumerate(teacher_forced_logprobs(model, PROMPTS, completions)):
        torch.testing.assert_close(after.logprobs[b], expected, atol=1e-4, rtol=0)


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def test_fused_weights_are_the_models_own_storage_not_a_second_copy() -> None:
    """The fused layout must not double the model's memory: the model's base weights become views of it."""
    model = lora_model()
    ids, mask = left_pad(PROMPTS)
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
    params = [p for _, p in model.named_parameters()]
    ids_before = [id(p) for p in params]
    bytes_before = _storage_bytes(params)

    weights = FastWeights(model)

    fused = [projection.weight for projection in weights.projections]
    for projection in weights.projections:
        for base in projection.bases:
            assert base.weight.untyped_storage().data_ptr() == projection.weight.untyped_storage().data_ptr()
    # The fused rows add only the LoRA A rows (and Qwen3 has no biases): far below a second copy of the weights.
    extra = _storage_bytes(params + fused) - bytes_before
    lora_a_bytes = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "lora_A" in name)
    assert extra == lora_a_bytes, (extra, lora_a_bytes, bytes_before)
    assert [id(p) for _, p in model.named_parameters()] == ids_before, "peft's and the optimizer's parameters"
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, before)


def test_trained_base_weights_reach_the_sampler_in_place_or_replaced(tmp_path: Path) -> None:
    """Full fine-tuning: an optimizer's in-place update is in the shared rows at once; a weight whose storage was
    replaced (a load with assign=True) is copied in by refresh(); the model still saves and loads."""
    model = tiny_model("qwen3")
    sampler = StaticCacheSampler(model, GREEDY, pad_token_id=PAD)
    before = sampler.generate(PROMPTS)
    torch.manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.add_(torch.randn_like(layer.mlp.down_proj.weight) * 0.2)
            layer.self_attn.q_proj.weight.data = layer.self_attn.q_proj.weight.detach() * 1.5
    sampler.refresh()
    after = sampler.generate(PROMPTS)
    assert not torch.equal(after.logprobs, before.logprobs), "the change must matter for this test to mean anything"
    assert torch.equal(after.tokens, hf_greedy(model, PROMPTS, GREEDY.max_new_tokens))
    for b, expected in enumerate(teacher_forced_logprobs(model, PROMPTS, after.completion_ids())):
        torch.testing.assert_close(after.logprobs[b], expected, atol=1e-4, rtol=0)

    model.save_pretrained(tmp_path)  # views of one storage: a full model (Full's adapter/) must still save
    reloaded = Qwen3ForCausalLM.from_pretrained(tmp_path)
    for (name, param), (_, loaded) in zip(model.named_parameters(), reloaded.named_parameters(), strict=True):
        assert torch.equal(param, loaded), name


def test_eos_stops_and_min_new_tokens_suppresses_it() -> None:
    """A completion ends right after its first EOS (included); min_new_tokens keeps EOS out of the first N steps."""
    model = tiny_model("qwen3")
    eos = 7
    ids, mask = left_pad(PROMPTS)
    with torch.no_grad():  # make EOS likely: tilt its output row towards the typical final hidden state
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        model.lm_head.weight[eos] += 3.0 * hidden.mean(0) / hidden.mean(0).norm()
    free = StaticCacheSampler(model, GREEDY, pad_token_id=PAD).generate(PROMPTS)
    assert (free.tokens[:, 0] == eos).any(), "some row must want EOS at once for suppression to be tested"

    stopping = StaticCacheSampler(
        model, SamplingSettings(12, eos_token_ids=(eos,), do_sample=False, temperature=0), pad_token_id=PAD
    ).generate(PROMPTS)
    completions = stopping.completion_ids()
    for b, row in enumerate(free.tokens.tolist()):
        first = row.index(eos) + 1 if eos in row else len(row)
        assert stopping.lengths[b] == first
        assert completions[b] == row[:first]  # greedy is deterministic: identical up to and including the EOS
    assert min(stopping.lengths) == 1 and max(stopping.lengths) == 12

    n = 5
    settings = SamplingSettings(12, eos_token_ids=(eos,), do_sample=False, temperature=0, min_new_tokens=n)
    held = StaticCacheSampler(model, settings, pad_token_id=PAD).generate(PROMPTS)
    assert all(eos not in row[:n] for row in held.tokens.tolist())
    assert all(length > n for length in held.lengths)
    ended = [b for b, length in enumerate(held.lengths) if length < 12]
    assert ended, "some row must stop at EOS once it is allowed"
    expected = hf_greedy(model, PROMPTS, 12, eos_token_id=eos, min_new_tokens=n)
    for b, completion in enumerate(held.completion_ids()):
        assert completion == expected[b, : len(completion)].tolist()
        assert completion.count(eos) == (1 if b in ended else 0)
        if b in ended:
            assert completion[-1] == eos


# -- the training backbone ---------------------------------------------------------------------------------------


def _forward(model: Any, ids: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> dict[str, Any]:
    """Hidden states, next-token log-probs at valid positions and LoRA gradients of a loss over them."""
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        hidden = model.get_base_model().model(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = model(input_ids=ids, attention_mask=mask).logits
    logp = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    scored = mask[:, :-1].bool() & mask[:, 1:].bool()
    (logp[scored] * weights[scored]).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {"hidden": hidden[mask.bool()], "logp": logp.detach()[scored], "grads": grads}


@pytest.mark.parametrize(
    ("padded", "graphs", "compiled"),
    [(False, False, False), (True, False, False), (False, "emulate", False), (True, "emulate", False),
     (True, "emulate", True)],
)
def test_backbone_matches_model_forward_and_gradients(padded: bool, graphs: bool | str, compiled: bool) -> None:
    """The fused backbone stands in for peft+transformers in training: same hidden states, log-probs and gradients.

    graphs="emulate" runs the CUDA-graph path's bookkeeping on the CPU: right padding to the captured length,
    static input buffers, the autograd function that hands back fresh gradient tensors. compiled: the layer
    function through torch.compile, as on a GPU (checkpointing stops its recomputation early with an exception of
    its own, which the compile fallback must let through)."""
    model = lora_model()
    model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if padded:
        ids, mask = left_pad([[*p, 11, 12, 13] for p in PROMPTS])
    else:
        ids = torch.randint(1, VOCAB, (3, 10), generator=torch.Generator().manual_seed(3))
        mask = torch.ones_like(ids)
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(4))

    reference = _forward(model, ids, mask, weights)
    backbone = FastBackbone(FastWeights(model), cuda_graphs=graphs, compile_layers=compiled)
    backbone.install()
    try:
        fast = _forward(model, ids, mask, weights)
        assert backbone.calls == 2, "both forwards must have gone through the fast backbone"
        assert backbone.graph_calls == (1 if graphs else 0), "only the forward with gradients uses the graph path"
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=True)
            model(input_ids=ids, attention_mask=mask, past_key_values=transformers.DynamicCache())
        assert backbone.calls == 2, "cached forwards belong to the model's own code"
    finally:
        backbone.uninstall()

    torch.testing.assert_close(fast["hidden"], reference["hidden"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast["logp"], reference["logp"], atol=1e-5, rtol=1e-5)
    assert reference["grads"].keys() == fast["grads"].keys() and reference["grads"]
    for name, grad in reference["grads"].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(fast["grads"][name], grad, atol=1e-5, rtol=1e-5, msg=name)
    # Uninstalled: the model's own forward again.
    model(input_ids=ids, attention_mask=mask)
    assert backbone.calls == 2


def reference_grads_then_emulated_backbone(model: Any, loss: Any) -> tuple[dict[str, Any], FastBackbone]:
    """The gradients of `loss()` through the model's own forward, then (gradients zeroed) a backbone installed that
    runs the CUDA-graph path's bookkeeping eagerly ("emulate")."""
    loss().backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    backbone = FastBackbone(FastWeights(model), cuda_graphs="emulate")
    backbone.install()
    return reference, backbone


def assert_grads(model: Any, reference: dict[str, Any], scale: float = 1.0) -> None:
    params = dict(model.named_parameters())
    assert reference
    for name, grad in reference.items():
        torch.testing.assert_close(params[name].grad, scale * grad, atol=1e-5, rtol=1e-5, msg=name)


def test_backbone_graph_path_survives_two_forwards_before_a_backward() -> None:
    """Two training forwards, then one backward over both: the second runs plainly (the first one's activations
    live in the graph), and the gradients are those of the model's own forward."""
    model = lora_model()
    model.train()
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(6))

    def loss() -> Any:
        first = model(input_ids=ids).logits.float().log_softmax(-1)[..., 3].sum()
        second = model(input_ids=ids.flip(1)).logits.float().log_softmax(-1)[..., 5].sum()
        return first + 2 * second

    reference, backbone = reference_grads_then_emulated_backbone(model, loss)
    try:
        loss().backward()
        loss().backward()  # accumulates: the graph path's gradients must not alias the previous .grad
    finally:
        backbone.uninstall()
    assert backbone.graph_calls == 2 and backbone.calls == 4
    assert_grads(model, reference, scale=2.0)


def test_backbone_graphs_step_aside_for_trained_weights_outside_the_adapter(caplog: Any) -> None:
    """A replayed graph returns gradients for the LoRA parameters alone: with another trainable weight in the stack
    (a norm here, peft's modules_to_save in general) it must run without graphs, and that weight must still train."""
    model = lora_model()
    model.train()
    norm = model.get_base_model().model.layers[1].post_attention_layernorm.weight
    norm.requires_grad_(True)
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(8))

    def loss() -> Any:
        return model(input_ids=ids).logits.float().log_softmax(-1)[..., 3].sum()

    with caplog.at_level("WARNING", logger="nodus.trainer.fast_backbone"):
        reference, backbone = reference_grads_then_emulated_backbone(model, loss)
    try:
        loss().backward()
    finally:
        backbone.uninstall()
    expected = "trainable weights outside the LoRA adapters (layers.1.post_attention_layernorm.weight)"
    assert backbone.graph_error == expected
    assert "Training forwards run without CUDA graphs: trainable weights outside" in caplog.text
    assert backbone.graph_calls == 0 and backbone.calls == 1
    assert any("post_attention_layernorm" in name for name in reference)
    assert_grads(model, reference)


def test_backbone_asked_for_graphs_on_a_cpu_model_runs_without_them(caplog: Any) -> None:
    """grpo train asks for graphs on a GPU host; with the model elsewhere (--trl use_cpu=true) the run must train
    without graphs, not fail while the trainer is built."""
    model = lora_model()
    model.train()
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(9))
    model(input_ids=ids).logits.float().log_softmax(-1)[..., 3].sum().backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    with caplog.at_level("WARNING", logger="nodus.trainer.fast_backbone"):
        backbone = FastBackbone(FastWeights(model), cuda_graphs=True)
    backbone.install()
    try:
        model(input_ids=ids).logits.float().log_softmax(-1)[..., 3].sum().backward()
    finally:
        backbone.uninstall()
    assert backbone.graph_error == "the model is on cpu, not a CUDA device"
    assert "Training forwards run without CUDA graphs: the model is on cpu" in caplog.text
    assert backbone.calls == 1 and backbone.graph_calls == 0
    assert_grads(model, reference)


def test_the_stream_mismatch_warning_is_filtered_for_the_process_once_graphs_are_used() -> None:
    """torch warns at the first backward after a capture (inside TRL's step, not the capture); the filter must be
    process-wide and only for that message."""
    message = fast_backbone.STREAM_MISMATCH_WARNING + " the stream of the node that produced the incoming gradient."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast_backbone.ignore_stream_mismatch_warning()
        warnings.warn(message, UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]


def test_trainable_biases_send_training_to_the_models_own_forward() -> None:
    """The written-out stack reads q/k/v biases from the fused copy, which no gradient reaches: a model whose biases
    train (peft's bias="all") must keep its own training forward."""
    model = get_peft_model(tiny_model("qwen2"), LoraConfig(r=4, target_modules="all-linear", bias="all"))
    assert fast_backbone.unsupported_reason(FastWeights(model)) == "trainable biases"
    frozen = get_peft_model(tiny_model("qwen2"), LoraConfig(r=4, target_modules="all-linear"))
    assert fast_backbone.unsupported_reason(FastWeights(frozen)) is None


def test_backbone_graphs_of_two_lengths_are_never_pending_together() -> None:
    """All lengths' graphs share one memory pool, so a forward of another length while one awaits its backward must
    run plainly (a replay could overwrite the pending one's temporaries); afterwards it gets its own graph."""
    model = lora_model()
    model.train()
    short = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(9))
    long = torch.randint(1, VOCAB, (2, 40), generator=torch.Generator().manual_seed(10))  # another 32-token bucket

    def loss() -> Any:
        first = model(input_ids=short).logits.float().log_softmax(-1)[..., 3].sum()
        second = model(input_ids=long).logits.float().log_softmax(-1)[..., 5].sum()
        return first + 2 * second

    reference, backbone = reference_grads_then_emulated_backbone(model, loss)
    try:
        loss().backward()
        assert backbone.graph_calls == 1 and len(backbone._graphs) == 1
        model(input_ids=long).logits.float().sum().backward()
        assert backbone.graph_calls == 2 and len(backbone._graphs) == 2
        model.zero_grad(set_to_none=True)
        loss().backward()
    finally:
        backbone.uninstall()
    assert backbone.graph_calls == 3 and backbone.graph_skips == 2
    assert_grads(model, reference)


def test_backbone_graph_is_reused_after_a_forward_whose_backward_never_comes() -> None:
    """A training forward whose result is dropped (a diagnostic under grad, an error before the backward) must not
    leave its graph marked busy: the next forward replays it, with the model's own gradients. Autocast is part of
    what a graph replays, so a forward under autocast gets a graph of its own."""
    model = lora_model()
    model.train()
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(7))

    def loss() -> Any:
        return model(input_ids=ids).logits.float().log_softmax(-1)[..., 3].sum()

    reference, backbone = reference_grads_then_emulated_backbone(model, loss)
    try:
        dropped = loss()
        del dropped  # no backward will ever come for it
        loss().backward()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss()
    finally:
        backbone.uninstall()
    assert backbone.graph_calls == 3, "the abandoned forward must not keep the graph busy"
    assert len(backbone._graphs) == 2  # one without autocast, one under bf16 autocast
    assert_grads(model, reference)


def test_backbone_steps_aside_when_the_adapter_is_disabled() -> None:
    """TRL's reference log-probs (beta > 0 with peft) come from `disable_adapter()`: that is the base model."""
    model = lora_model()
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(8))
    with torch.no_grad(), model.disable_adapter():
        reference = model(input_ids=ids).logits
    backbone = FastBackbone(FastWeights(model))
    backbone.install()
    try:
        with torch.no_grad():
            with model.disable_adapter():
                base = model(input_ids=ids).logits
            adapted = model(input_ids=ids).logits
    finally:
        backbone.uninstall()
    assert backbone.calls == 1, "only the forward with the adapter on goes through the fast backbone"
    torch.testing.assert_close(base, reference)
    assert not torch.allclose(adapted, reference), "the adapter must change the outputs"

    # A second adapter made active (TRL copies a given PeftModel's adapter as "ref" for the KL term with beta > 0).
    model.add_adapter("ref", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    backbone.install()
    try:
        with torch.no_grad():
            model.set_adapter("ref")
            with_ref = model(input_ids=ids).logits
            model.set_adapter("default")
            again = model(input_ids=ids).logits
    finally:
        backbone.uninstall()
    assert backbone.calls == 2, "the 'ref' adapter's forward is the model's own"
    torch.testing.assert_close(with_ref, reference)  # a fresh LoRA (B = 0) is the base model
    torch.testing.assert_close(again, adapted)


def test_compiled_sampler_matches_eager() -> None:
    """The GPU default compiles the layer functions: prompts padded to a bucket, LoRA's B product as a fused
    reduction in decoding. Same greedy tokens and log-probs as the eager sampler (torch.compile on the CPU)."""
    model = lora_model()
    eager = StaticCacheSampler(model, GREEDY, pad_token_id=PAD).generate(PROMPTS)
    compiled_sampler = StaticCacheSampler(model, GREEDY, pad_token_id=PAD, compile_layers=True)
    compiled = compiled_sampler.generate(PROMPTS)
    assert compiled_sampler._state is not None and compiled_sampler._state.capacity >= 64 + GREEDY.max_new_tokens
    assert compiled.tokens.tolist() == eager.tokens.tolist()
    torch.testing.assert_close(compiled.logprobs, eager.logprobs, atol=1e-4, rtol=0)


def test_unsupported_configurations_are_named() -> None:
    """Unsupported setups must be reported (so callers fall back), and supported ones must not be."""
    assert fast_backbone.unsupported_reason(FastWeights(lora_model())) is None
    dropout = fast_backbone.unsupported_reason(FastWeights(lora_model(lora_dropout=0.1)))
    assert dropout is not None and "dropout" in dropout.lower()
    full = fast_backbone.unsupported_reason(FastWeights(tiny_model("qwen3").train()))
    assert full is not None and "full fine-tuning" in full

    assert fast_generation.unsupported_reason(tiny_model("qwen3"), GenerationConfig()) is None
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    reason = fast_generation.unsupported_reason(gpt2)
    assert reason is not None and "gpt2" in reason
    with pytest.raises(ValueError, match="gpt2"):
        FastWeights(gpt2)
    penalty = fast_generation.unsupported_reason(tiny_model("qwen3"), GenerationConfig(repetition_penalty=1.2))
    assert penalty is not None and "repetition_penalty" in penalty
    # Biases the decode step does not apply would make it silently sample another model: named, never decoded.
    for flag, where in (("attention_bias", "o_proj"), ("mlp_bias", "gate_proj")):
        torch.manual_seed(0)
        biased = LlamaForCausalLM(LlamaConfig(head_dim=16, **SHAPE, **{flag: True}))
        assert fast_generation.unsupported_reason(biased) == (
            f"a bias on {where} (attention_bias or mlp_bias in the model's config)"
        )
    assert fast_generation.unsupported_reason(lora_model(use_dora=True)) == "DoRA adapters"
    two = lora_model()
    two.add_adapter("second", LoraConfig(r=2, target_modules="all-linear"))
    two.base_model.set_adapter(["default", "second"])
    assert fast_generation.unsupported_reason(two) == "more than one active LoRA adapter"


# -- FastGRPOTrainer end to end -----------------------------------------------------------------------------------


def word_tokenizer(vocab_size: int) -> Any:
    """Whitespace word-level tokenizer over w0..w{n-4}, <pad>, <eos>, <unk> (as the benchmark scripts build it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size - 3)}
    vocab.update({"<pad>": vocab_size - 3, "<eos>": vocab_size - 2, "<unk>": vocab_size - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def even_word_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """Deterministic and almost never tied between two completions: the fraction of even-numbered words."""
    rewards = []
    for completion in completions:
        words = completion.split()
        rewards.append(sum(w.startswith("w") and w[1:].isdigit() and int(w[1:]) % 2 == 0 for w in words) / 8)
    return rewards


def grpo_trainer(
    tmp_path: Path, generation_kwargs: dict[str, Any] | None = None, lora: dict[str, Any] | None = None, **fast: Any
) -> Any:
    from nodus.trainer.fast_grpo import FastGRPOTrainer
    from trl import GRPOConfig

    tok = word_tokenizer(VOCAB)
    torch.manual_seed(0)
    config = Qwen3Config(
        head_dim=16,
        **{**SHAPE, "initializer_range": 0.02, "pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id},
    )
    model = Qwen3ForCausalLM(config)
    prompts = [" ".join(f"w{(i * 7 + j * 13) % (VOCAB - 3)}" for j in range(2 + i % 5)) for i in range(16)]
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        # TRL defaults to bf16, i.e. CPU autocast around the training forward, while the sampler runs in the weights'
        # dtype: the two would then differ by ~4e-3 for precision alone. fp32 throughout makes 1e-4 meaningful.
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        report_to=[],
        save_strategy="no",
        learning_rate=1e-2,
        beta=0.0,
        disable_tqdm=True,
        logging_steps=1,
        seed=0,
        generation_kwargs=generation_kwargs,
    )
    return FastGRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=even_word_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", **(lora or {})),
        **fast,
    )


def test_fast_grpo_trainer_trains_and_sampler_tracks_updates(tmp_path: Path) -> None:
    """Two real GRPO steps on the fast path; afterwards the refreshed sampler still samples the trained policy."""
    trainer = grpo_trainer(tmp_path)
    assert trainer.fast_path_reason() is None
    assert trainer.training_fallback_reason is None
    assert trainer.backbone is not None
    model = trainer.accelerator.unwrap_model(trainer.model)
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    assert lora_before

    trainer.train()

    assert trainer.backbone.calls > 0
    assert len(trainer.generation_times) == 2
    assert trainer.last_rollout is not None
    changed = [n for n, p in model.named_parameters() if "lora_" in n and not torch.equal(p, lora_before[n])]
    assert changed, "the optimizer must have moved the adapter"

    sampler = trainer._sampler_for_step()  # refreshes: the optimizer stepped since the last rollout
    prompts = [[3, 8, 21], [50, 4], [9, 9, 30, 2, 77]]
    torch.manual_seed(5)
    rollout = sampler.generate(prompts)
    completions = rollout.completion_ids()
    trainer.backbone.uninstall()  # the reference is the model's own forward
    model.eval()
    reference = teacher_forced_logprobs(model, prompts, completions, temperature=sampler.sampling.temperature)
    for b, expected in enumerate(reference):
        torch.testing.assert_close(rollout.logprobs[b, : len(completions[b])], expected, atol=1e-4, rtol=0)


def test_zero_variance_groups_are_the_groups_that_teach_nothing() -> None:
    from nodus.trainer.fast_grpo import zero_variance_fraction

    nan = float("nan")
    rewards = torch.tensor(
        [
            [0.5, 0.5, 0.5],  # all equal: teaches nothing
            [0.0, 1.0, 0.0],  # varied
            [1.0, nan, nan],  # one graded (TRL's NaN std counted it as varied): teaches nothing
            [nan, nan, nan],  # none graded
            [0.2, nan, 0.7],  # two graded, different: varied
            [0.3, 0.3, nan],  # two graded, equal: teaches nothing
        ]
    ).flatten()
    assert zero_variance_fraction(rewards, 3) == pytest.approx(4 / 6)


@pytest.mark.parametrize(
    ("generation_kwargs", "reason"),
    [
        ({"no_repeat_ngram_size": 2}, "generation_config.no_repeat_ngram_size=2"),
        ({"suppress_tokens": [5]}, "generation_config.suppress_tokens=[5]"),
        ({"typical_p": 0.9}, "generation_config.typical_p=0.9"),  # sampling-only warpers count for rollouts
        ({"repetition_penalty": 1.1}, "repetition_penalty != 1"),
        ({"typical_p": 1.0, "no_repeat_ngram_size": 0}, None),  # neutral values are off
    ],
)
def test_rollouts_fall_back_for_generation_kwargs_the_sampler_does_not_apply(
    tmp_path: Path, generation_kwargs: dict[str, Any], reason: str | None
) -> None:
    """spec.parameters.trl.generation_kwargs reach TRL's generation config; the sampler must not silently skip them."""
    assert grpo_trainer(tmp_path, generation_kwargs).fast_path_reason() == reason


def test_training_memory_is_released_before_the_final_evaluation(tmp_path: Path) -> None:
    """After the last step the rollout sampler and the training graphs go (the final evaluation builds its own
    sampler beside them); the fused weights stay, and greedy decoding on them still matches the model's own."""
    from nodus.trainer.evaluate import greedy_sampler

    trainer = grpo_trainer(tmp_path, training_graphs="emulate")
    trainer.train()
    assert trainer._sampler is not None and trainer.backbone._graphs, "training must have used both"
    trainer.release_training_memory()
    assert trainer._sampler is None and trainer.last_rollout is None and not trainer.backbone._graphs
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.eval()
    sampler = greedy_sampler(model, trainer.processing_class, GREEDY.max_new_tokens, trainer.fast_weights)
    assert sampler is not None
    assert torch.equal(sampler.generate(PROMPTS).tokens, hf_greedy(model, PROMPTS, GREEDY.max_new_tokens))


def test_fast_generation_switched_off_is_reported(tmp_path: Path) -> None:
    """With both fast paths off the trainer is stock TRL, and says why rollouts don't use the sampler."""
    trainer = grpo_trainer(tmp_path, fast_generation=False, fast_training=False)
    assert trainer.fast_path_reason() == "fast generation switched off"
    assert trainer.backbone is None


def test_a_model_the_fast_path_cannot_read_is_named_for_both_halves(tmp_path: Path) -> None:
    """`grpo train` prints the training forward's reason: a DoRA (or NF4) model must say so, not "switched off"."""
    trainer = grpo_trainer(tmp_path, lora={"use_dora": True})
    assert trainer.fast_path_reason() == "DoRA adapters"
    assert trainer.training_fallback_reason == "DoRA adapters"
    assert trainer.backbone is None


def _double(x: Any) -> Any:
    return x * 2


def test_compiled_functions_fall_back_to_eager_when_torch_stops_compiling(caplog: Any) -> None:
    """fullgraph=True makes torch's recompile limit a hard failure: a run with many shapes must slow down, not die."""
    import torch._dynamo

    compiled = fast_generation.compile_shape_static(_double)
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = 1  # as if this function had seen its 64 shapes already
    try:
        assert compiled(torch.ones(2)).tolist() == [2.0, 2.0]
        with caplog.at_level("WARNING"):
            assert compiled(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]  # a new shape: eager from now on
            assert compiled(torch.ones(4)).tolist() == [2.0] * 4
    finally:
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.reset()
    assert caplog.text.count("_double: too many shapes to compile") == 1


# -- held-out evaluation on the sampler ---------------------------------------------------------------------------


def test_held_out_evaluation_on_the_sampler_matches_generate(tiny_model: Path, caplog: Any) -> None:
    """Greedy evaluation decoded by the sampler gives model.generate's completions: chat prompts of five lengths in
    batches of two (the last one filled up), rows ending at EOS on different steps, a generation config's
    min_new_tokens, and weights lent by a fast trainer that went stale when the adapter moved."""
    from nodus.trainer.evaluate import generate_greedy, greedy_completions, greedy_sampler
    from nodus.trainer.models import load_model_and_tokenizer, resolve_model

    model, tokenizer = load_model_and_tokenizer(resolve_model(str(tiny_model)))
    torch.manual_seed(0)
    with torch.no_grad():  # the saved tiny model answers "\n" forever: sharper weights give the test something to catch
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(std=0.1)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    lent = FastWeights(model)  # built before the adapter moves, as a trainer's are before its last step
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    messages = [[{"role": "user", "content": "colour the graph " * i}] for i in range(1, 6)]
    texts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    # Tilt EOS's output row towards the final hidden state until some rows end early and some run to the limit.
    causal_lm, eos, limit = model.get_base_model(), tokenizer.eos_token_id, 24
    with torch.no_grad():
        hidden = causal_lm.model(input_ids=torch.tensor([prompts[-1]])).last_hidden_state[0].mean(0)
        row = causal_lm.lm_head.weight[eos].clone()
        for tilt in torch.linspace(0.05, 1.0, 20).tolist():
            causal_lm.lm_head.weight[eos] = row + tilt * hidden / hidden.norm()
            sampler = greedy_sampler(model, tokenizer, limit)
            assert sampler is not None
            lengths = sampler.generate(prompts).lengths
            if max(lengths) == limit and min(lengths) < limit:
                break
    assert max(lengths) == limit and min(lengths) < limit, f"no tilt made some rows (not all) end early: {lengths}"

    expected = generate_greedy(model, tokenizer, messages, limit, batch_size=2)
    assert len(set(expected)) > 2, "degenerate completions would make the comparison vacuous"
    with caplog.at_level("INFO", logger="nodus.trainer.evaluate"):
        assert generate_greedy(model, tokenizer, messages, limit, batch_size=2, fast=True) == expected
        assert generate_greedy(model, tokenizer, messages, limit, batch_size=2, fast=True, weights=lent) == expected
        model.generation_config.min_new_tokens = 3  # generate applies it when greedy too: so must the sampler
        held = generate_greedy(model, tokenizer, messages, limit, batch_size=2)
        assert held != expected, "min_new_tokens must change some completion for this check to mean anything"
        assert generate_greedy(model, tokenizer, messages, limit, batch_size=2, fast=True) == held
        assert greedy_completions(model, tokenizer, [], limit, batch_size=2, fast=True) == []
    # The sampler decoded every fast=True call above: a fallback to model.generate would have said so.
    assert [r.getMessage() for r in caplog.records if r.name == "nodus.trainer.evaluate"] == []


def test_held_out_evaluation_falls_back_to_generate_and_says_why_once(caplog: Any) -> None:
    """Settings model.generate applies even when greedy, and the sampler does not, send evaluation to generate."""
    from nodus.trainer import evaluate
    from nodus.trainer.evaluate import greedy_sampler

    evaluate._said.clear()  # this process may have said some reason already
    tokenizer = word_tokenizer(VOCAB)
    with caplog.at_level("WARNING", logger="nodus.trainer.evaluate"):
        model = tiny_model("qwen3")
        model.generation_config.repetition_penalty = 1.2
        assert greedy_sampler(model, tokenizer, 8) is None
        assert greedy_sampler(model, tokenizer, 8) is None  # the baseline and the final evaluation: said once
        model = tiny_model("qwen3")
        model.generation_config.no_repeat_ngram_size = 2
        assert greedy_sampler(model, tokenizer, 8) is None
        model.generation_config.no_repeat_ngram_size = 0  # written out by older configs, and off
        model.generation_config.forced_eos_token_id = 0  # a token id: 0 is not "off"
        assert greedy_sampler(model, tokenizer, 8) is None
    assert [r.getMessage() for r in caplog.records] == [
        "Held-out evaluation decodes with model.generate (slower): repetition_penalty != 1.",
        "Held-out evaluation decodes with model.generate (slower): generation_config.no_repeat_ngram_size=2.",
        "Held-out evaluation decodes with model.generate (slower): generation_config.forced_eos_token_id=0.",
    ]


def _breaks_the_graph(x: Any) -> Any:
    torch._dynamo.graph_break()  # fullgraph=True cannot compile this: a real compiler failure
    return x * 3


def test_a_function_the_compiler_fails_on_runs_uncompiled(caplog: Any) -> None:
    """A compiler failure (dynamo, inductor, Triton) must cost speed, not the run: the function runs as written."""
    compiled = fast_generation.compile_shape_static(_breaks_the_graph)
    with caplog.at_level("WARNING"):
        assert compiled(torch.ones(2)).tolist() == [3.0, 3.0]
        assert compiled(torch.ones(3)).tolist() == [3.0] * 3
    messages = [r.getMessage() for r in caplog.records if "could not be compiled" in r.getMessage()]
    assert len(messages) == 1 and messages[0].startswith("_breaks_the_graph could not be compiled (")
