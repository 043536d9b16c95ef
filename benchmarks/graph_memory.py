"""GPU memory and time of CUDA-graph training when a run sees many sequence lengths.

    python3 benchmarks/graph_memory.py --json-out r.jsonl      # GPU: Qwen3-0.6B shape, meant to fit ~90 s on an H200
    SMOKE=1 .venv/bin/python benchmarks/graph_memory.py         # tiny shape on the CPU: checks the script itself

Why: FastBackbone(cuda_graphs=True) captures forward+backward once per padded sequence length (SEQ_BUCKET), keeps at
most MAX_GRAPHS of them in one shared memory pool, and runs other lengths plainly. gpu_step_time.py trains at one
length, so it never sees what the pool costs once a run (GRPO's completions vary) has filled it. Here one model
(random weights, LoRA r=8 on every linear layer, bf16, gradient checkpointing, as gpu_step_time.py) runs fwd+bwd over
`--lengths` (default 9: one more than MAX_GRAPHS) three ways: `own` (transformers + peft), `compiled` (FastBackbone,
compiled layers) and `graphs` (the same, replayed as CUDA graphs). On the CPU, `compiled` runs the layers eagerly and
`graphs` is cuda_graphs="emulate" (the bookkeeping without graphs).

Per mode: peak allocated memory, what stays allocated and reserved after the mode (the graph pool is reserved memory
nobody else can use), what is left once the mode's objects are freed, median ms per fwd+bwd (after a pass that
compiles and captures every length), and the graph bookkeeping. The LoRA gradients of `graphs` are compared with
`compiled` (same kernels: ~0 or bf16 noise) and `compiled` with `own` (bf16 rounding, a few %). Lengths run in the
order given (`--lengths 384,352,...` to see whether the order of captures changes what the shared pool grows to).
"""

from __future__ import annotations

import argparse
import contextlib
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
SMOKE = os.environ.get("SMOKE") == "1"
# Qwen3-0.6B's config.json values, as ../shared/bench/trl_stock_grpo.py SHAPES (not imported: it needs trl).
SHAPE = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16)
SHAPE.update(num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
SMOKE_SHAPE = dict(SHAPE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
SMOKE_SHAPE.update(num_key_value_heads=2, head_dim=16)
VOCAB = 1000 if SMOKE else 151936
# Lengths land in 9 different SEQ_BUCKETs; the SMOKE ones are not multiples of 32, so right padding runs too.
LENGTHS = "30,62,94,126,158,190,222,254,286" if SMOKE else "128,160,192,224,256,288,320,352,384"
KEEP = 65  # logits_to_keep as TRL passes it (64 completion tokens + 1): the LM head stays off the peak
MODES = ("own", "compiled", "graphs")


def import_modules() -> None:
    """Exit 2 naming a missing module; make `nodus.trainer` importable from a plain checkout (no pip install)."""
    for name in ("torch", "transformers", "peft"):
        if importlib.util.find_spec(name) is None:
            print(f"error: missing Python module {name!r} (pip install {name})", flush=True)
            sys.exit(2)
    if importlib.util.find_spec("nodus") is None:
        shim = Path(tempfile.mkdtemp(prefix="nodus-shim-")) / "nodus"
        shim.mkdir()
        for package in ("core", "sandbox", "trainer"):  # pyproject's package-dir mapping
            (shim / package).symlink_to(REPO / package)
        sys.path.insert(0, str(shim.parent))
        importlib.invalidate_caches()
    try:
        importlib.import_module("nodus.trainer.fast_backbone")
    except ModuleNotFoundError as error:
        print(f"error: missing Python module {error.name!r} (needed by nodus.trainer.fast_backbone)", flush=True)
        sys.exit(2)


def build_model(torch: Any, device: str) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shape = SMOKE_SHAPE if SMOKE else SHAPE  # no generation here: no pad/eos ids needed
    cfg = Qwen3Config(vocab_size=VOCAB, max_position_embeddings=4096, rope_theta=1e6, bos_token_id=None, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.float32 if SMOKE else torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()  # as TRL does for a PEFT model with checkpointing
    # LoRA B starts at zero, where the A gradients are zero too and a graph reading stale memory would go unseen.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model.train()
    return model


def run_mode(torch: Any, model: Any, weights: Any, mode: str, inputs: dict[int, Any], repeats: int) -> tuple[Any, Any]:
    from nodus.trainer.fast_backbone import FastBackbone

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    backbone = None
    if mode != "own":
        graphs = (True if cuda else "emulate") if mode == "graphs" else False
        backbone = FastBackbone(weights, compile_layers=cuda, cuda_graphs=graphs)
        backbone.install()

    def step(ids: Any) -> None:
        # As TRL's update: the causal LM under bf16 autocast (accelerate's), logits of the completion only.
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
        with autocast:
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=KEEP).logits
        logits.float().logsumexp(-1).mean().backward()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    grads, ms = {}, {}
    try:
        for length, ids in inputs.items():  # first pass: compile and capture, then a replay whose gradients we keep
            for _ in range(2):
                model.zero_grad(set_to_none=True)
                step(ids)
            named = [(n, p) for n, p in model.named_parameters() if "lora_" in n and p.grad is not None]
            grads[length] = torch.cat([p.grad.detach().float().flatten().cpu() for _, p in named])
            model.zero_grad(set_to_none=True)
        for length, ids in inputs.items():  # second pass: every length warm
            times = []
            for _ in range(repeats):
                sync()
                begin = time.perf_counter()
                step(ids)
                sync()
                times.append((time.perf_counter() - begin) * 1e3)
                model.zero_grad(set_to_none=True)
            ms[length] = statistics.median(times)
    finally:
        if backbone is not None:
            backbone.uninstall()
    row: dict[str, Any] = {"mode": mode, "wall_s": round(time.perf_counter() - started, 1)}
    if cuda:  # allocated after the mode, before freeing: the model, the fused weights, what the graphs keep
        row.update(peak_gb=gb(torch.cuda.max_memory_allocated()), allocated_after_gb=gb(torch.cuda.memory_allocated()))
        torch.cuda.empty_cache()  # what stays reserved now is held by live objects (graph pools among them)
        row["reserved_after_gb"] = gb(torch.cuda.memory_reserved())
    short, long = min(ms), max(ms)
    row.update(ms_short=round(ms[short], 2), ms_long=round(ms[long], 2), ms_mean=round(statistics.mean(ms.values()), 2))
    row["ms"] = {str(k): round(v, 2) for k, v in ms.items()}
    if backbone is not None:
        row.update(fast_calls=backbone.calls, graph_calls=backbone.graph_calls, graph_skips=backbone.graph_skips)
        # FastBackbone has no counter for forwards that ran plainly because MAX_GRAPHS was reached; every forward here
        # has gradients, so those are the rest.
        row["over_cap_calls"] = backbone.calls - backbone.graph_calls - backbone.graph_skips if mode == "graphs" else 0
        row["captured"] = sorted(key[0][1] for key in backbone._graphs)
        row["graph_error"] = backbone.graph_error
    del backbone
    return row, grads


def gb(n: int) -> float:
    return round(n / 1e9, 3)


def rel_err(a: Any, b: Any) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default=LENGTHS, help="comma-separated sequence lengths (tokens per row)")
    parser.add_argument("--batch", type=int, default=2 if SMOKE else 8)
    parser.add_argument("--repeats", type=int, default=3, help="timed fwd+bwd per length (median reported)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json-out", type=Path, help="append one JSON line per mode here")
    args = parser.parse_args()
    import_modules()
    import peft
    import torch
    import transformers
    from nodus.trainer.fast_backbone import MAX_GRAPHS, SEQ_BUCKET
    from nodus.trainer.fast_generation import FastWeights

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    meta = dict(device=torch.cuda.get_device_name(0) if cuda else "cpu", date=time.strftime("%Y-%m-%d"))
    meta.update(torch=torch.__version__, transformers=transformers.__version__, peft=peft.__version__)
    meta.update(smoke=SMOKE, batch=args.batch)
    print(f"{json.dumps(meta)} SEQ_BUCKET {SEQ_BUCKET} MAX_GRAPHS {MAX_GRAPHS}", flush=True)
    lengths = [int(n) for n in args.lengths.split(",")]
    inputs = {}
    for n in lengths:  # the same tokens in every mode
        ids = torch.randint(0, VOCAB - 3, (args.batch, n), generator=torch.Generator().manual_seed(n))
        inputs[n] = ids.to(device)
    model = build_model(torch, device)
    weights = FastWeights(model)  # once: the base weights become views into its fused matrices, for every mode
    base = gb(torch.cuda.memory_allocated()) if cuda else None
    print(f"model + fused weights allocated: {base} GB; lengths {lengths}", flush=True)
    rows, grads = [], {}
    for mode in args.modes.split(","):
        row = None
        try:
            row, grads[mode] = run_mode(torch, model, weights, mode, inputs, args.repeats)
        except Exception as error:  # keep going: the other modes still report
            print(f"FAILED {mode}: {type(error).__name__}: {str(error)[:800]}", flush=True)
        model.zero_grad(set_to_none=True)
        gc.collect()  # the backbone's graphs and their pool go here (closures make cycles)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        if row is None:
            continue
        row.update(model_gb=base, left_after_free_gb=gb(torch.cuda.memory_reserved()) if cuda else None)
        print("ROW", json.dumps(row), flush=True)
        rows.append(row)
    for mode, ref in (("graphs", "compiled"), ("compiled", "own"), ("graphs", "own")):
        if mode in grads and ref in grads:
            errs = {n: rel_err(grads[mode][n], grads[ref][n]) for n in lengths}
            check = {"short": errs[min(lengths)], "long": errs[max(lengths)], "max": max(errs.values())}
            for row in rows:
                if row["mode"] == mode:
                    row[f"grad_rel_err_vs_{ref}"] = check
            print(f"LoRA grad rel L2 {mode} vs {ref}: " + " ".join(f"{k} {v:.2e}" for k, v in check.items()))
    if args.json_out:
        with args.json_out.open("a") as handle:
            handle.writelines(json.dumps({**meta, **r}) + "\n" for r in rows)
    # held GB: reserved after the mode (empty_cache cannot return a live graph pool); freed GB: once its objects went.
    columns = [("mode", "mode"), ("peak GB", "peak_gb"), ("alloc GB", "allocated_after_gb")]
    columns += [("held GB", "reserved_after_gb"), ("freed GB", "left_after_free_gb"), ("ms short", "ms_short")]
    columns += [("ms long", "ms_long"), ("ms mean", "ms_mean"), ("wall s", "wall_s")]
    header = " ".join(f"{title:>9}" for title, _ in columns) + "  graphs: calls/skips/over-cap captured error"
    print(header + "\n" + "-" * len(header))
    for r in rows:
        graph = "/".join(str(r.get(key)) for key in ("graph_calls", "graph_skips", "over_cap_calls"))
        graph = f"  {graph} {r.get('captured')} {r.get('graph_error')}" if r["mode"] == "graphs" else ""
        print(" ".join(f"{r.get(key)!s:>9}" for _, key in columns) + graph)


if __name__ == "__main__":
    main()
