"""GRPO step time on one GPU: stock TRL against nodus' fast rollouts, side by side in one call.

    python benchmarks/gpu_step_time.py                      # both shapes: stock and grpo train's path
    SMOKE=1 .venv/bin/python benchmarks/gpu_step_time.py    # tiny shapes on the CPU: checks the script itself
    python benchmarks/gpu_step_time.py --plan "qwen3-0.6b=stock,fast,fast-compiled+graphs" --json-out r.jsonl

The job is the shared anchor `../shared/bench/trl_stock_grpo.py` (override with --stock-script or NODUS_SHARED):
random weights of the Qwen3 shape (same FLOPs and bytes as trained ones), 4 generations x 8 completions per step,
96-token prompts, 64 new tokens forced (EOS suppressed), LoRA r=8 on every linear layer, bf16, gradient
checkpointing, beta 0. This script runs that very function once per path, swapping only the trainer class:
`stock` is TRL's GRPOTrainer, `fast` is nodus.trainer.fast_grpo.FastGRPOTrainer (TRL's loss, advantages and
optimizer step; rollouts from a static KV cache replayed as a CUDA graph; the training forward's decoder stack
written out over the sampler's fused weights), `fast-compiled` additionally compiles both decoder-layer functions
with torch.compile. Every setting of the job is the anchor's, by construction.

Printed per path: median/min/max seconds per step (first 3 steps dropped as warm-up), the ratio to stock measured in
this run, peak GPU memory, and where the time goes (sampling, the rest of the rollout: decoding, rewards and
advantages; the update). Then a fidelity check on the trained fast model: the sampler's per-token
log-probabilities against the training model's own (TRL's `_get_per_token_logps_and_entropies`) on the same tokens.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Variations of the anchor's settings, appended to a path as +NAME (reported as separate rows, never as the headline);
# +hf-forward keeps the fast sampler but trains through the model's own (transformers + peft) forward.
CONFIG_OPTIONS: dict[str, dict[str, Any]] = {
    "nogc": {"gradient_checkpointing": False},  # trade memory for one forward pass less per step
    "tc": {"torch_compile": True},  # transformers compiles the training model's forward
}
# Compilation experiments for the fast paths: +stack compiles the whole decoder stack as one graph (decode step and
# training forward) instead of one layer function; +autotune lets inductor benchmark GEMM kernels (slow to compile).
COMPILE_OPTIONS: dict[str, dict[str, Any]] = {
    "stack": {"compile_stack": True},
    "autotune": {"compile_mode": "max-autotune-no-cudagraphs"},
    # The training forward/backward and the rollouts' prefill replayed as CUDA graphs (what grpo train runs on a GPU
    # since run 7; docs/benchmarks.md).
    "graphs": {"training_graphs": True, "prefill_graphs": True},
}
REQUIRED = ("torch", "transformers", "peft", "accelerate", "trl", "datasets")


def check_imports() -> None:
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(
            f"error: missing Python packages: {', '.join(missing)}; install them (pip install {' '.join(missing)})"
            " or carry their wheels to this machine"
        )


def import_nodus_trainer() -> None:
    """Make `nodus.trainer` importable from a plain checkout (no pip install on a bare GPU machine)."""
    try:
        importlib.import_module("nodus.trainer.fast_grpo")
        return
    except ModuleNotFoundError:
        pass
    shim = Path(tempfile.mkdtemp(prefix="nodus-shim-")) / "nodus"
    shim.mkdir()
    for package in ("core", "sandbox", "trainer"):
        (shim / package).symlink_to(REPO / package)
    sys.path.insert(0, str(shim.parent))
    importlib.invalidate_caches()


def load_stock_module(path: Path) -> Any:
    if not path.is_file():
        sys.exit(
            f"error: stock benchmark {path} not found; pass --stock-script PATH or set NODUS_SHARED to the "
            "folder that holds bench/trl_stock_grpo.py"
        )
    spec = importlib.util.spec_from_file_location("trl_stock_grpo", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def profile_callback(out_dir: Path, label: str, first_step: int = 5, steps: int = 2) -> Any:
    """A TrainerCallback that runs torch.profiler over `steps` training steps and writes what the time went to.

    Writes `<label>.txt` (busy time of the GPU against wall time, the top operators by device time and by host time)
    and `<label>.trace.json.gz` (a Chrome/Perfetto trace) into `out_dir`."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    class ProfileSteps(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.profiler: Any = None
            self.started = 0.0

        def first(self, args: Any) -> int:
            return max(0, min(first_step, args.max_steps - steps))  # SMOKE runs only a few steps

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == self.first(args) and self.profiler is None:
                sync()
                self.profiler = profile(activities=activities)
                self.profiler.__enter__()
                self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.profiler is None or state.global_step != self.first(args) + steps:
                return
            sync()
            wall = time.perf_counter() - self.started
            prof, self.profiler = self.profiler, None
            prof.__exit__(None, None, None)
            out_dir.mkdir(parents=True, exist_ok=True)
            averages = prof.key_averages()
            sort = "self_device_time_total" if cuda else "self_cpu_time_total"
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy = sum(e.device_time for e in kernels) / 1e6
            lines = [
                f"{label}: {steps} steps, wall {wall:.3f} s, GPU kernel time {busy:.3f} s "
                f"({busy / wall:.0%} busy), {len(kernels)} kernels",
                averages.table(sort_by=sort, row_limit=30, max_name_column_width=70),
                averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70),
                averages.table(sort_by="cpu_time_total", row_limit=40, max_name_column_width=70),
            ]
            (out_dir / f"{label}.txt").write_text("\n".join(lines))
            print(lines[0], flush=True)
            try:
                prof.export_chrome_trace(str(out_dir / f"{label}.trace.json"))
                import gzip
                import shutil

                trace = out_dir / f"{label}.trace.json"
                with trace.open("rb") as src, gzip.open(out_dir / f"{label}.trace.json.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                (out_dir / f"{label}.trace.json").unlink()
            except Exception as error:  # the summary above is what matters
                print(f"trace export failed: {error}", flush=True)

    return ProfileSteps()


def decode_timing(trainer: Any) -> dict[str, Any]:
    """Milliseconds per decode step (one graph replay) and per prefill, measured on the trained fast sampler."""
    import torch

    sampler = trainer._sampler
    if sampler is None or sampler._state is None:
        return {}
    state = sampler._state
    prompts = [list(range(10, 10 + 96))] * state.batch
    length = sampler.prompt_length(96)  # what the rollouts prefilled: another length would compile (and capture) anew
    times: dict[str, list[float]] = {"prefill_ms": [], "decode_ms_per_token": [], "generate_ms": []}
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.no_grad():
            state.prefill(prompts, length)
        torch.cuda.synchronize()
        times["prefill_ms"].append((time.perf_counter() - started) * 1e3)
        started = time.perf_counter()
        for _ in range(sampler.sampling.max_new_tokens - 1):
            state.decode()
        torch.cuda.synchronize()
        per_token = (time.perf_counter() - started) * 1e3 / (sampler.sampling.max_new_tokens - 1)
        times["decode_ms_per_token"].append(per_token)
        started = time.perf_counter()
        sampler.generate(prompts)
        times["generate_ms"].append((time.perf_counter() - started) * 1e3)
    return {key: round(statistics.median(values), 3) for key, values in times.items()}


def eval_timing(trainer: Any, prompts: int = 16, new_tokens: int = 64) -> dict[str, Any]:
    """Held-out-style greedy decoding of the trained model: `model.generate` (what evaluations used before) against
    the sampler with the trainer's fused weights (what `grpo train` evaluations use with the fast path on). Seconds
    for one batch of `prompts` x `new_tokens` (the sampler twice: its first call compiles this batch shape) and how
    many completions agree (bf16 can flip a near-tie)."""
    import torch
    from nodus.trainer.evaluate import greedy_completions

    model = trainer.accelerator.unwrap_model(trainer.model)
    texts = [trainer.train_dataset[i]["prompt"] for i in range(prompts)]
    outputs: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    for label, fast in (("generate", False), ("sampler_first", True), ("sampler", True)):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        outputs[label] = greedy_completions(
            model, trainer.processing_class, texts, new_tokens, prompts, fast=fast, weights=trainer.fast_weights
        )
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds[label] = round(time.perf_counter() - started, 3)
    return {
        "prompts": prompts,
        "new_tokens": new_tokens,
        "seconds": seconds,
        "speedup": round(seconds["generate"] / seconds["sampler"], 1) if seconds["sampler"] else None,
        "agree": sum(a == b for a, b in zip(outputs["generate"], outputs["sampler"], strict=True)),
    }


def make_trainer_class(
    fast: bool,
    compile_layers: bool,
    fast_training: bool,
    profile_dir: Path | None = None,
    label: str = "",
    compile_options: dict[str, Any] | None = None,
) -> Any:
    import torch
    from nodus.trainer.fast_grpo import FastGRPOTrainer

    class ProfiledTrainer(FastGRPOTrainer):  # type: ignore[misc]
        """Records the rollout time (sampling + decoding + rewards + advantages) of every step."""

        instances: list[Any] = []

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(
                *args,
                fast_generation=fast,
                fast_training=fast and fast_training,
                compile_layers=compile_layers,
                **(compile_options or {}),
                **kwargs,
            )
            self.rollout_times: list[float] = []
            ProfiledTrainer.instances.append(self)
            # Fast paths only: stock TRL launches ~400,000 kernels in two steps, and writing that trace took minutes
            # of GPU time on an H200 (the call ran out of time).
            if profile_dir is not None and fast:
                self.add_callback(profile_callback(profile_dir, label))

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            started = time.perf_counter()
            result = super()._generate_and_score_completions(inputs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.rollout_times.append(time.perf_counter() - started)
            return result

    return ProfiledTrainer


def _lora_grads(trainer: Any, inputs: Any) -> tuple[float, Any]:
    import torch

    trainer.model.zero_grad(set_to_none=True)
    with trainer.accelerator.autocast():
        loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [
        p.grad.detach().float().flatten()
        for n, p in trainer.model.named_parameters()
        if "lora_" in n and p.grad is not None
    ]
    trainer.model.zero_grad(set_to_none=True)
    return float(loss.detach()), torch.cat(grads)


def fidelity(trainer: Any) -> dict[str, Any]:
    """Same GRPO on one fixed batch: the fast path against the model's own (transformers + peft) forward.

    LoRA B is first set to random values of a trained adapter's size (a few benchmark steps at lr 1e-5 leave it
    near zero, where an adapter read wrongly, e.g. a stale copy, would change nothing). One rollout batch (2 prompts
    x num_generations, sampled by the fast sampler, rewarded and normalised by TRL) is then scored three ways: the
    sampler's own log-probabilities, TRL's per-token log-probabilities through the fast training backbone, and
    through the model's own forward (the stock path). Relative L2 errors; then TRL's loss and the LoRA gradients
    through both forwards. Rewards and advantages are the same tensors for both, since they are computed once by
    TRL's code. With training graphs, the gradients through the replayed graphs are also compared with the same
    compiled stack run without graphs (same kernels: only capture and replay differ, so they must agree closely)."""
    import torch

    with torch.no_grad():
        generator = torch.Generator(device="cpu").manual_seed(0)
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    trainer._sampler_step = -1  # the sampler refreshes its copy of the adapter before the next rollout
    gens = trainer.num_generations
    rows = [trainer.train_dataset[i // gens] for i in range(2 * gens)]
    inputs = trainer._generate_and_score_completions(rows)
    rollout = trainer.last_rollout
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    keep = inputs["completion_ids"].shape[1]
    completion_mask = inputs["completion_mask"].bool()

    def logps() -> Any:
        with torch.no_grad():
            return trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0][completion_mask]

    def rel(a: Any, b: Any) -> float:
        return round(((a.double() - b.double()).norm() / b.double().norm()).item(), 6)

    backbone = trainer.backbone
    fast_logps = logps()
    graph_calls = backbone.graph_calls if backbone is not None else 0
    fast_loss, fast_grads = _lora_grads(trainer, inputs)
    graph_check: dict[str, Any] = {}
    if backbone is not None and backbone.cuda_graphs:
        graph_check["graph_replayed"] = backbone.graph_calls > graph_calls
        backbone.cuda_graphs = False
        try:
            eager_loss, eager_grads = _lora_grads(trainer, inputs)
        finally:
            backbone.cuda_graphs = trainer.training_graphs
        graph_check["graph_vs_eager_grad_rel_err"] = rel(fast_grads, eager_grads)
        graph_check["graph_vs_eager_loss_abs_diff"] = abs(fast_loss - eager_loss)
    if backbone is not None:
        backbone.uninstall()
    try:
        stock_logps = logps()
        stock_loss, stock_grads = _lora_grads(trainer, inputs)
    finally:
        if backbone is not None:
            backbone.install()
    sampler_logps = rollout.logprobs[:, :keep].to(stock_logps.device)[completion_mask.cpu()] if rollout else None
    result = {
        "tokens": int(completion_mask.sum()),
        "advantages_nonzero": int((inputs["advantages"] != 0).sum()),
        "train_logps_rel_err": rel(fast_logps, stock_logps),
        "sampler_logps_rel_err": rel(sampler_logps, stock_logps) if sampler_logps is not None else None,
        "loss_fast": round(fast_loss, 6),
        "loss_stock": round(stock_loss, 6),
        "loss_abs_diff": abs(fast_loss - stock_loss),
        "lora_grad_rel_err": rel(fast_grads, stock_grads),
        "lora_B_norm": round(
            sum(float(p.detach().float().norm()) for n, p in trainer.model.named_parameters() if "lora_B" in n), 6
        ),
        **graph_check,
    }
    # The criterion: per-token log-probabilities (sampler and training forward) within bf16 tolerance
    # (relative 1e-2). The loss is reported, but with beta 0 its value does not depend on the log-probabilities
    # (on policy it is -mean(A) exp(0) = 0 for both), so it proves nothing: the gradients carry the check of the
    # backward. Against transformers + peft in bf16 they differ by rounding alone (2% on 0.6B, 8.8% on 8B so far,
    # docs/benchmarks.md), so they are judged only for gross errors (<= 0.15; the CPU tests check the same backward in
    # float32 to 1e-5). Training graphs must replay and give the eager compiled stack's gradients: the same kernels
    # give ~0, a capture may pick other cuBLAS algorithms (bf16 noise well under 1e-2), while a graph reading stale
    # or overwritten memory is off by far more than 1e-2 once LoRA B is as large as above.
    errors = [result["train_logps_rel_err"], result["sampler_logps_rel_err"] or 0.0]
    checks = [e <= 1e-2 for e in errors] + [result["lora_grad_rel_err"] <= 0.15]
    if graph_check:
        checks += [graph_check["graph_replayed"], graph_check["graph_vs_eager_grad_rel_err"] <= 1e-2]
    result["pass"] = all(checks)
    return result


def run_path(
    stock: Any,
    shape: str,
    path: str,
    steps: int,
    check_fidelity: bool,
    profile_dir: Path | None = None,
    time_evaluation: bool = False,
) -> dict[str, Any]:
    import torch

    engine, *options = path.split("+")
    unknown = set(options) - set(CONFIG_OPTIONS) - set(COMPILE_OPTIONS) - {"hf-forward"}
    if engine not in ("stock", "fast", "fast-compiled") or unknown:
        raise ValueError(
            f"unknown path {path!r}: use stock, fast or fast-compiled, optionally +nogc, +tc, +hf-forward, +stack, "
            "+autotune, +graphs"
        )
    compile_options = {k: v for option in options for k, v in COMPILE_OPTIONS.get(option, {}).items()}
    if compile_options.get("training_graphs") and not torch.cuda.is_available():
        compile_options["training_graphs"] = "emulate"  # the graphs' bookkeeping, run eagerly (SMOKE on a CPU)
        compile_options["prefill_graphs"] = False  # a CPU has no CUDA graphs (the decode step runs eagerly too)
    trainer_class = make_trainer_class(
        fast=engine != "stock",
        compile_layers=engine == "fast-compiled",
        fast_training="hf-forward" not in options,
        profile_dir=profile_dir,
        label=f"{shape}-{path}".replace("+", "_"),
        compile_options=compile_options,
    )
    results: list[dict[str, Any]] = []
    config_class = stock.GRPOConfig
    overrides: dict[str, Any] = {}
    for option in options:
        overrides.update(CONFIG_OPTIONS.get(option, {}))

    def config_with_overrides(*args: Any, **kwargs: Any) -> Any:
        return config_class(*args, **{**kwargs, **overrides})

    def capture(*args: Any, **kwargs: Any) -> None:
        if args and args[0] == "RESULT":
            results.append(json.loads(args[1]))
        else:
            print(*args, **kwargs)

    stock.GRPOTrainer = trainer_class
    stock.GRPOConfig = config_with_overrides
    stock.print = capture
    started = time.perf_counter()
    try:
        stock.run(shape, steps)
    except BaseException:
        trainer_class.instances.clear()  # free the failed run's model before the next one
        gc.collect()
        raise
    finally:
        del stock.print
        stock.GRPOConfig = config_class
    if not results:
        raise RuntimeError(f"{shape}/{path}: the stock run() reported nothing")
    row = dict(results[0], path=path, call_s=round(time.perf_counter() - started, 1))
    trainer = trainer_class.instances[-1]
    warm = slice(3, None) if len(trainer.rollout_times) > 5 else slice(None)
    gen, rollout = trainer.generation_times[warm], trainer.rollout_times[warm]
    row["sampling_s_median"] = round(statistics.median(gen), 4) if gen else None
    row["rollout_s_median"] = round(statistics.median(rollout), 4) if rollout else None
    if gen and rollout:
        row["scoring_s_median"] = round(statistics.median(r - g for r, g in zip(rollout, gen, strict=False)), 4)
        row["update_s_median"] = round(row["step_s_median"] - row["rollout_s_median"], 4)
    row["fast_path"] = trainer.fast_path_reason() or "used"
    row["fast_training"] = trainer.training_fallback_reason or f"used ({trainer.backbone.calls} forwards)"
    if trainer.backbone is not None:
        row["training_graph_calls"] = trainer.backbone.graph_calls
        row["training_graph_skips"] = trainer.backbone.graph_skips
        row["training_graph_error"] = trainer.backbone.graph_error
    if trainer._sampler is not None:
        row["cuda_graph"] = trainer._sampler.use_cuda_graph and trainer._sampler.capture_error is None
        row["capture_error"] = trainer._sampler.capture_error
        if trainer._sampler.prefill_graphs:
            state = trainer._sampler._state
            row["prefill_graphs"] = sorted(state.prefill_graphs) if state is not None else []
            row["prefill_graph_error"] = trainer._sampler.prefill_graph_error
    if engine != "stock" and torch.cuda.is_available():
        row["decode_timing"] = decode_timing(trainer)
    if check_fidelity and engine != "stock":
        try:
            row["fidelity"] = fidelity(trainer)
        except Exception as error:  # report and go on: the timing rows still matter
            row["fidelity"] = {"error": f"{type(error).__name__}: {error}"[:300]}
    if time_evaluation and engine != "stock":
        try:
            row["eval_timing"] = eval_timing(trainer, new_tokens=8 if stock.SMOKE else 64)
        except Exception as error:  # report and go on
            row["eval_timing"] = {"error": f"{type(error).__name__}: {error}"[:300]}
    trainer_class.instances.clear()
    del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def qlora_memory(stock: Any, shape: str = "qwen3-8b") -> dict[str, Any]:
    """Peak GPU memory of a QLoRA GRPO step's parts on the random-weight shape: NF4 base (every decoder linear layer
    as bitsandbytes Linear4bit with double quantization, embeddings and lm_head 16-bit), LoRA r=8 on all linear
    layers, one forward+backward over 8 x (96 + 64) tokens with gradient checkpointing, and sampling 8 x 64 tokens."""
    import bitsandbytes as bnb
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab = stock.VOCAB
    cfg = Qwen3Config(
        vocab_size=vocab,
        max_position_embeddings=4096,
        rope_theta=1e6,
        pad_token_id=vocab - 3,
        eos_token_id=vocab - 2,
        bos_token_id=None,
        **stock.SHAPES[shape],
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and name != "lm_head":
                quantized = bnb.nn.Linear4bit(
                    child.in_features,
                    child.out_features,
                    bias=False,
                    compute_dtype=torch.bfloat16,
                    compress_statistics=True,
                    quant_type="nf4",
                )
                quantized.weight = bnb.nn.Params4bit(
                    child.weight.data.cpu(), requires_grad=False, compress_statistics=True, quant_type="nf4"
                )
                setattr(parent, name, quantized.cuda())
                del child
    gc.collect()
    torch.cuda.empty_cache()
    base_gb = torch.cuda.memory_allocated() / 1e9
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    lora_gb = torch.cuda.memory_allocated() / 1e9
    torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(0, vocab - 3, (8, 160), device="cuda")
    out = model(input_ids=ids, logits_to_keep=65)
    logps = out.logits[:, :-1].float().log_softmax(-1).gather(2, ids[:, -64:, None])
    (-logps.mean()).backward()
    train_peak = torch.cuda.max_memory_allocated() / 1e9
    del out, logps
    model.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        model.generate(
            input_ids=ids[:, :96],
            attention_mask=torch.ones_like(ids[:, :96]),
            max_new_tokens=64,
            min_new_tokens=64,
            do_sample=True,
            pad_token_id=vocab - 3,
        )
    generate_peak = torch.cuda.max_memory_allocated() / 1e9
    lora_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {
        "shape": shape,
        "nf4_base_gb": round(base_gb, 3),
        "with_lora_gb": round(lora_gb, 3),
        "train_step_peak_gb": round(train_peak, 3),
        "generate_peak_gb": round(generate_peak, 3),
        "lora_params": lora_params,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    stock_median = {r["config"]: r["step_s_median"] for r in rows if r["path"] == "stock"}
    header = (
        f"{'shape':<11} {'path':<14} {'median s':>9} {'min':>7} {'max':>7} {'x stock':>8} {'peak GB':>8} "
        f"{'sample s':>9} {'score s':>8} {'update s':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        base = stock_median.get(r["config"])
        ratio = f"{base / r['step_s_median']:.1f}" if base and r["step_s_median"] else "-"
        print(
            f"{r['config']:<11} {r['path']:<14} {r['step_s_median']:>9.3f} {r['step_s_min']:>7.3f} "
            f"{r['step_s_max']:>7.3f} {ratio:>8} {str(r.get('peak_mem_gb')):>8} "
            f"{str(r.get('sampling_s_median')):>9} {str(r.get('scoring_s_median')):>8} "
            f"{str(r.get('update_s_median')):>9}"
        )
    for r in rows:
        if "fidelity" in r:
            print(f"fidelity {r['config']}/{r['path']}: {json.dumps(r['fidelity'])}")
        if "eval_timing" in r:
            print(f"eval-timing {r['config']}/{r['path']}: {json.dumps(r['eval_timing'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = Path(os.environ.get("NODUS_SHARED", REPO.parent / "shared"))
    parser.add_argument("--stock-script", type=Path, default=shared / "bench" / "trl_stock_grpo.py")
    parser.add_argument(
        "--plan",
        default="qwen3-0.6b=stock,fast-compiled+graphs;qwen3-8b=stock,fast-compiled+graphs",
        help="SHAPE=PATH,PATH;SHAPE=...: paths are stock, fast, fast-compiled, each optionally "
        "+nogc (no gradient checkpointing) and/or +tc (torch_compile of the training model); the fast ones also "
        "+graphs (training and prefill CUDA graphs: grpo train's path on a GPU), +stack, +autotune",
    )
    parser.add_argument("--qlora-memory", action="store_true", help="also measure QLoRA memory on the 8B shape")
    parser.add_argument(
        "--steps", default="qwen3-0.6b=12,qwen3-8b=8", help="steps per shape (the first 3 are dropped as warm-up)"
    )
    parser.add_argument("--json-out", type=Path, help="append one JSON line per path here")
    parser.add_argument(
        "--eval-timing",
        action="append",
        default=[],
        metavar="SHAPE/PATH",
        help="after that row, time greedy evaluation decoding: model.generate against the sampler (repeatable)",
    )
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="profile steps 5-6 of every fast path (torch.profiler) into DIR"
    )
    args = parser.parse_args()
    check_imports()
    import_nodus_trainer()
    stock = load_stock_module(args.stock_script)
    import peft
    import torch
    import transformers
    import trl

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(
        f"versions torch {torch.__version__} transformers {transformers.__version__} trl {trl.__version__} "
        f"peft {peft.__version__} device {device} smoke {stock.SMOKE}",
        flush=True,
    )
    steps = {k: int(v) for k, v in (item.split("=") for item in args.steps.split(","))}
    rows = []
    plan = [(shape, paths.split(",")) for shape, paths in (item.split("=") for item in args.plan.split(";"))]
    for shape, paths in plan:
        for path in paths:
            try:
                row = run_path(
                    stock,
                    shape,
                    path,
                    steps.get(shape, 8),
                    check_fidelity=True,
                    profile_dir=args.profile,
                    time_evaluation=f"{shape}/{path}" in args.eval_timing,
                )
            except Exception as error:  # keep going: the other paths still report
                print(f"FAILED {shape}/{path}: {type(error).__name__}: {str(error)[:800]}", flush=True)
                continue
            row.update(
                device=device,
                torch=torch.__version__,
                transformers=transformers.__version__,
                trl=trl.__version__,
                peft=peft.__version__,
                date=time.strftime("%Y-%m-%d"),
            )
            print("ROW", json.dumps(row), flush=True)
            if args.json_out:
                with args.json_out.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
            rows.append(row)
    print_table(rows)
    if args.qlora_memory:
        try:
            print("QLORA", json.dumps(qlora_memory(stock)), flush=True)
        except Exception as error:
            print(f"FAILED qlora-memory: {type(error).__name__}: {str(error)[:800]}", flush=True)


if __name__ == "__main__":
    main()
