#!/usr/bin/env bash
# One GPU session in one call (at most about 9 minutes on one H200: the parts' limits are 300 + 120 + 90 s after the
# install): everything it measures lands in $OUT.
#
#   device run: command "bash benchmarks/gpu_session.sh", carry [".whl", ".shared"], timeout_s 600
#
# .whl (ignored through .git/info/exclude) holds the wheels a bare CUDA PyTorch image lacks: trl, datasets, dill,
# multiprocess, bitsandbytes (the benchmark and QLoRA) and pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions (nodus.core and nodus.trainer import pydantic at module level). Never put
# torch, transformers, peft or accelerate wheels there: they would shadow the image's own builds.
# .shared is a copy of ../shared/bench (the stock TRL anchor job).
#
# Parts, in order; each has its own timeout and a failing part never stops the next:
#   1. install the carried wheels into /tmp/site; versions and the GPU          -> $SETUP/install.log, env.txt
#   2. the step-time benchmark (stock TRL against the fast paths, no --profile) -> $OUT/bench.jsonl, $OUT/bench.log
#   3. LoRA end to end through nodus' own loop (nodus.trainer.api.train_on_function, the code `grpo train` runs)
#      on a small random-weight Qwen3 built here: the fast path as a GPU run takes it (compiled sampler, written-out
#      training forward, evaluations on the sampler), 3 GRPO steps, baseline and final evaluation. Before it, the
#      held-out greedy decoding on the sampler against model.generate on the same prompts (agreement, seconds)
#                                                    -> $OUT/e2e-LoRA.json, $OUT/e2e-LoRA-results.json, $OUT/e2e-LoRA.log
#   4. the same with QLoRA (NF4 base: rollouts and evaluations fall back to model.generate)
#                                                    -> $OUT/e2e-QLoRA.json, $OUT/e2e-QLoRA-results.json, ...
#   5. (not in the default PARTS) benchmarks/graph_memory.py: training graphs' memory and time over many sequence
#      lengths against the model's own forward           -> $OUT/memory.jsonl, $OUT/memory.log
# Knobs (environment): PARTS, BENCH_PLAN, BENCH_STEPS, EVAL_TIMING (empty: none), MEMORY_MODES, MEMORY_LENGTHS and each
# part's *_TIMEOUT. At most 8 files come back from a device call, so install.log and env.txt stay in $SETUP.
#
# Locally, without a GPU (checks the script and part 3's API call on the CPU, fast path on):
#   OUT=/tmp/gpu-session PYTHON=.venv/bin/python PARTS="3" bash benchmarks/gpu_session.sh
set -u

cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
PARTS=${PARTS:-"1 2 3 4"}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
BENCH_STEPS=${BENCH_STEPS:-"qwen3-0.6b=10,qwen3-8b=8"}
BENCH_PLAN=${BENCH_PLAN:-"qwen3-0.6b=stock,fast-compiled,fast-compiled+graphs;qwen3-8b=fast-compiled+graphs"}
EVAL_TIMING=${EVAL_TIMING-"qwen3-0.6b/fast-compiled"}  # set but empty: none
MEMORY_TIMEOUT=${MEMORY_TIMEOUT:-120}
MEMORY_MODES=${MEMORY_MODES:-"graphs,own"}  # benchmarks/graph_memory.py --modes
MEMORY_LENGTHS=${MEMORY_LENGTHS:-}  # its --lengths; empty: its default
LORA_TIMEOUT=${LORA_TIMEOUT:-120}
QLORA_TIMEOUT=${QLORA_TIMEOUT:-90}
SITE=${SITE:-/tmp/site}
SETUP=${SETUP:-/tmp/gpu-session-setup}  # install.log and env.txt: not in $OUT, whose first 8 files alone come back
mkdir -p "$SETUP"
STARTED=$SECONDS

say() { printf '[%4ds] %s\n' $((SECONDS - STARTED)) "$*"; }

# Keep a line of at most 400 characters, and only those that say what happened (both greps flush every line, so
# nothing is lost if the call is stopped).
keep() { grep --line-buffered -E "$1" | grep --line-buffered -o -E '^.{0,400}'; }

# report_exit RC WHAT LIMIT_S NOTE_IF_STOPPED NOTE_IF_FAILED: one line on how a part ended.
report_exit() {
    case $1 in
        0) say "$2 finished" ;;
        124 | 137) say "$2 STOPPED at its ${3}s limit ($4)" ;;
        *) say "$2 exited with rc=$1 ($5)" ;;
    esac
}

# -- 1. wheels, versions, GPU ----------------------------------------------------------------------------------------
part1() {
    say "part 1: install the carried wheels into $SITE"
    if compgen -G ".whl/*.whl" >/dev/null; then
        ls -s .whl >"$SETUP/install.log"
        if timeout -k 5 150 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .whl/*.whl >>"$SETUP/install.log" 2>&1; then
            say "wheels installed: $(cd .whl && ls -- *.whl | sed 's/-py.*//; s/-cp.*//' | tr '\n' ' ')"
        else
            say "WARNING: installing all wheels at once failed (tail of install.log below); one at a time now"
            tail -n 3 "$SETUP/install.log"
            cp "$SETUP/install.log" "$OUT/install.log"
            for wheel in .whl/*.whl; do
                timeout -k 5 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                    --target "$SITE" "$wheel" >>"$SETUP/install.log" 2>&1 || say "WARNING: $wheel did not install"
            done
        fi
    else
        say "WARNING: no .whl/*.whl here (carry .whl): trl, datasets, bitsandbytes, pydantic are probably missing"
    fi
    # Set even when the install failed: whatever did install is still wanted (parts 2 and 3 inherit it).
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    SITE="$SITE" timeout -k 5 90 "$PY" - <<'PYEOF' 2>&1 | tee "$SETUP/env.txt" | keep '.'
import importlib, importlib.metadata as md, os, sys
print(f"python {sys.version.split()[0]} at {sys.executable}; PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
names = ["torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets", "pydantic", "triton",
         "matplotlib", "pluggy", "click", "yaml", "typing_extensions"]
site = os.environ.get("SITE", "/tmp/site")
found = []
for name in names:
    try:
        module = importlib.import_module(name)
        try:
            version = md.version({"yaml": "PyYAML"}.get(name, name))
        except md.PackageNotFoundError:
            version = getattr(module, "__version__", "?")
        where = "carried" if (getattr(module, "__file__", "") or "").startswith(site) else "image"
        found.append(f"{name} {version} ({where})")
    except Exception as error:  # report and go on
        found.append(f"{name} MISSING ({type(error).__name__}: {str(error)[:60]})")
for start in range(0, len(found), 5):
    print("versions: " + "; ".join(found[start : start + 5]))
try:
    import torch
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        print(f"gpu: {torch.cuda.get_device_name(0)}, {total / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free, "
              f"capability {torch.cuda.get_device_capability(0)}, cuda {torch.version.cuda}")
    else:
        print("gpu: none (torch.cuda.is_available() is False)")
except Exception as error:
    print(f"gpu: check failed: {type(error).__name__}: {error}")
PYEOF
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/nvidia-smi: /'
}

# -- 2. step-time benchmark ------------------------------------------------------------------------------------------
part2() {
    say "part 2: step-time benchmark (timeout ${BENCH_TIMEOUT}s)"
    if [ ! -f .shared/bench/trl_stock_grpo.py ]; then
        say "WARNING: .shared/bench/trl_stock_grpo.py is missing (carry .shared): the benchmark will refuse"
    fi
    timeout -k 10 "$BENCH_TIMEOUT" "$PY" -u benchmarks/gpu_step_time.py \
        --stock-script .shared/bench/trl_stock_grpo.py --steps "$BENCH_STEPS" --plan "$BENCH_PLAN" \
        ${EVAL_TIMING:+--eval-timing "$EVAL_TIMING"} --json-out "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.log" |
        keep '^(versions|FAILED|fidelity |eval-timing |shape |qwen3-|Traceback)|^[A-Za-z_.]*(Error|Exception): '
    report_exit "${PIPESTATUS[0]}" benchmark "$BENCH_TIMEOUT" "rows so far are in bench.jsonl" "see bench.log"
    # One short line per row, from the rows written so far (the table above is missing when the limit was hit).
    timeout -k 5 30 "$PY" - "$OUT/bench.jsonl" <<'PYEOF'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
print(f"bench rows: {len(rows)}")
stock = {r["config"]: r["step_s_median"] for r in rows if r.get("path") == "stock"}
for r in rows:
    ratio = stock.get(r["config"])
    ratio = f"{ratio / r['step_s_median']:.1f}x stock" if ratio and r.get("step_s_median") else "no stock row"
    timing = r.get("decode_timing") or {}
    fid = r.get("fidelity") or {}
    fid_text = fid.get("error") or (
        f"pass={fid.get('pass')} train {fid.get('train_logps_rel_err')} sampler {fid.get('sampler_logps_rel_err')} "
        f"grad {fid.get('lora_grad_rel_err')}" if fid else "-")
    print(f"ROW {r['config']}/{r['path']}: median {r.get('step_s_median')} s (min {r.get('step_s_min')}, max "
          f"{r.get('step_s_max')}), {ratio}, peak {r.get('peak_mem_gb')} GB, sampling {r.get('sampling_s_median')} "
          f"update {r.get('update_s_median')}, decode {timing.get('decode_ms_per_token')} ms/token, prefill "
          f"{timing.get('prefill_ms')} ms, call {r.get('call_s')} s")
    print(f"    fast_path {r.get('fast_path')}; training {r.get('fast_training')}; graphs "
          f"{r.get('training_graph_calls')} calls, {r.get('training_graph_skips')} skips, error "
          f"{r.get('training_graph_error')}; cuda_graph "
          f"{r.get('cuda_graph')} {r.get('capture_error') or ''}; fidelity {fid_text}"[:400])
    if r.get("eval_timing"):
        print(f"    eval timing {json.dumps(r['eval_timing'])}"[:400])
PYEOF
}

# -- 5. training graphs over many sequence lengths ------------------------------------------------------------------
part5() {
    say "part 5: training graphs over many lengths (timeout ${MEMORY_TIMEOUT}s)"
    timeout -k 10 "$MEMORY_TIMEOUT" "$PY" -u benchmarks/graph_memory.py --modes "$MEMORY_MODES" \
        ${MEMORY_LENGTHS:+--lengths "$MEMORY_LENGTHS"} --json-out "$OUT/memory.jsonl" 2>&1 | tee "$OUT/memory.log" |
        keep '^(\{|model|ROW|FAILED|LoRA grad| +(mode|own|compiled|graphs) |error|Traceback)|^[A-Za-z_.]*(Error|Exception): '
    report_exit "${PIPESTATUS[0]}" "graph memory" "$MEMORY_TIMEOUT" "rows so far are in memory.jsonl" "see memory.log"
}

# -- 3 and 4. LoRA / QLoRA through nodus' own training loop ----------------------------------------------------------
end_to_end() {
    local method=$1 limit=$2
    say "$method end to end through nodus.trainer.api.train_on_function (timeout ${limit}s)"
    # nodus is not installed on the bare image: the same shim as benchmarks/gpu_step_time.py (package-dir mapping
    # nodus.core -> core, nodus.sandbox -> sandbox, nodus.trainer -> trainer).
    local shim
    shim=$(mktemp -d /tmp/nodus-shim-XXXXXX)
    mkdir -p "$shim/nodus"
    for package in core sandbox trainer; do ln -s "$PWD/$package" "$shim/nodus/$package"; done
    local check=/tmp/nodus_e2e_check.py
    cat >"$check" <<'PYEOF'
"""LoRA or QLoRA GRPO through nodus' Python API on a small random-weight Qwen3 model built here, offline."""
import json, os, sys, tempfile, time, traceback
from pathlib import Path

OUT = Path(os.environ["OUT"])
METHOD = os.environ["E2E_METHOD"]
started = time.time()
summary = {"method": METHOD, "ok": False}


def finish(code: int) -> None:
    summary["seconds"] = round(time.time() - started, 1)
    (OUT / f"e2e-{METHOD}.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    keys = ("ok", "method", "device", "status", "steps", "seconds", "peak_gpu_gb", "baseline_mean", "final_mean",
            "eval_seconds", "graphs", "greedy_check", "skipped", "error")
    print("E2E SUMMARY " + json.dumps({k: summary[k] for k in keys if k in summary}, default=str)[:1500])
    sys.exit(code)


try:
    import torch

    summary["cuda"] = torch.cuda.is_available()
    summary["device"] = torch.cuda.get_device_name(0) if summary["cuda"] else "cpu"
    if METHOD == "QLoRA" and not summary["cuda"]:
        summary["skipped"] = "no CUDA device: QLoRA needs a CUDA GPU (bitsandbytes NF4)"
        print(f"E2E SKIPPED: {summary['skipped']}")
        finish(0)
    import nodus.trainer.run as run_module
    from nodus.trainer import api
    from nodus.trainer.tiny_model import build_tiny_tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    print(f"E2E imports done ({time.time() - started:.1f} s): nodus from {Path(api.__file__).parent}")
    # A small random-weight Qwen3 (hidden 256, 2 layers) with nodus' offline tokenizer and chat template; bf16 on
    # a GPU like real checkpoints, float32 on the CPU.
    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16 if summary["cuda"] else torch.float32)
    model.generation_config.pad_token_id = config.pad_token_id
    work = Path(tempfile.mkdtemp(prefix="nodus-e2e-"))
    model_dir = work / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    summary["model"] = {"dir": str(model_dir), "params": sum(p.numel() for p in model.parameters()),
                        "vocab": len(tokenizer), "chat_template": bool(tokenizer.chat_template)}
    del model

    # What the API hides: the trainer it built (quantized layers, which rollout and training paths it took).
    build_trainer = run_module.build_trainer

    built = []

    def inspecting_build_trainer(*args, **kwargs):
        trainer, callback, reward = build_trainer(*args, **kwargs)
        built.append(trainer)
        try:
            model = trainer.model
            kinds = {}
            for module in model.modules():
                name = type(module).__module__.split(".")[0] + "." + type(module).__name__
                if "Linear" in name:
                    kinds[name] = kinds.get(name, 0) + 1
            summary["trainer"] = {
                "class": type(trainer).__name__,
                "linear_modules": kinds,
                "params4bit": sum(type(p).__name__ == "Params4bit" for p in model.parameters()),
                "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
                "fast_path_reason": trainer.fast_path_reason(),
                "training_fallback_reason": trainer.training_fallback_reason,
                "is_loaded_in_4bit": getattr(getattr(model, "base_model", model), "is_loaded_in_4bit", None),
            }
            print("E2E trainer " + json.dumps(summary["trainer"])[:600])
        except Exception as error:  # the run matters more than this report
            summary["trainer"] = {"inspect_error": f"{type(error).__name__}: {error}"}
        return trainer, callback, reward

    run_module.build_trainer = inspecting_build_trainer

    def share_of_a(prompt: str, completion: str) -> float:
        letters = [c for c in completion if not c.isspace()]
        return letters.count("a") / len(letters) if letters else 0.0

    # Prompt lengths from 12 to 222 tokens: real runs see many sequence lengths, which the training graphs (one
    # capture per length, at most 8) and the prefill graphs (one per 64-token bucket) must handle.
    prompts = [f"Task {i}: write a" + " please" * ((i % 8) * 6) for i in range(40)]
    if METHOD == "LoRA":
        # Held-out greedy decoding on the sampler (what evaluations use with the fast path on) against
        # model.generate, on the same 32 prompts: how many completions agree, and the seconds of each (the sampler
        # twice: its first call compiles). bf16 on a GPU can flip a near-tie, so agreement is reported, not required.
        from nodus.trainer.evaluate import generate_greedy
        from nodus.trainer.models import load_model_and_tokenizer, resolve_model

        import logging

        class Keep(logging.Handler):  # a fallback to model.generate warns here: then nothing was compared
            def emit(self, record):
                said.append(record.getMessage()[:300])

        said = []
        logging.getLogger("nodus.trainer.evaluate").addHandler(Keep())
        device = "cuda:0" if summary["cuda"] else None
        check_model, check_tokenizer = load_model_and_tokenizer(resolve_model(str(model_dir)), device=device)
        messages = [[{"role": "user", "content": f"Task {i}: write a"}] for i in range(32)]
        timings, outputs = {}, {}
        for label, fast in (("generate", False), ("sampler_first", True), ("sampler", True)):
            clock = time.perf_counter()
            outputs[label] = generate_greedy(check_model, check_tokenizer, messages, 64, 16, fast=fast)
            if summary["cuda"]:
                torch.cuda.synchronize()
            timings[label] = round(time.perf_counter() - clock, 3)
        summary["greedy_check"] = {
            "agree": sum(a == b for a, b in zip(outputs["generate"], outputs["sampler"])),
            "of": len(messages),
            "distinct": len(set(outputs["generate"])),
            "seconds": timings,
            "first_mismatch": next(([a, b] for a, b in zip(outputs["generate"], outputs["sampler"]) if a != b), None),
            "fallback_warnings": list(said),
        }
        print("E2E greedy check " + json.dumps(summary["greedy_check"])[:600])
        del check_model
        if summary["cuda"]:
            torch.cuda.empty_cache()
    if summary["cuda"]:
        torch.cuda.reset_peak_memory_stats()
    output = work / "run"
    results = api.train_on_function(
        prompts,
        share_of_a,
        name=f"{METHOD.lower()}-check",
        output=output,
        model=str(model_dir),
        method=METHOD,
        max_steps=3,
        save_steps=2,
        num_generations=4,
        batch_size=8,
        max_completion_length=16,
        learning_rate=1e-3,
        fast_path="auto" if summary["cuda"] else "on",
    )
    if built:  # what the run's CUDA graphs did (grpo train turns them on with a GPU since run 7)
        trainer = built[-1]
        backbone, sampler = trainer.backbone, trainer._sampler
        state = getattr(sampler, "_state", None)
        summary["graphs"] = {
            "training_graphs": trainer.training_graphs,
            "prefill_graphs": trainer.prefill_graphs,
            "training_calls": getattr(backbone, "graph_calls", None),
            "training_skips": getattr(backbone, "graph_skips", None),
            "training_captured": len(backbone._graphs) if backbone is not None else None,
            "training_error": getattr(backbone, "graph_error", None),
            "decode_graph": getattr(sampler, "use_cuda_graph", None),
            "capture_error": getattr(sampler, "capture_error", None),
            "prefill_captured": sorted(state.prefill_graphs) if state is not None else None,
            "prefill_error": getattr(sampler, "prefill_graph_error", None),
        }
        print("E2E graphs " + json.dumps(summary["graphs"], default=str)[:600])
    summary["ok"] = results.get("status") == "completed"
    summary["status"] = results.get("status")
    summary["steps"] = results.get("training", {}).get("steps")
    summary["reward_per_step"] = results.get("training", {}).get("rewardPerStep")
    summary["baseline_mean"] = (results.get("baseline") or {}).get("meanScore")
    summary["final_mean"] = (results.get("final") or {}).get("meanScore")
    summary["eval_seconds"] = [(results.get(k) or {}).get("seconds") for k in ("baseline", "final")]
    summary["diagnostics"] = results.get("diagnostics")
    summary["spec_method"] = results.get("job", {}).get("spec", {}).get("parameters", {}).get("method")
    summary["run_files"] = sorted(p.name for p in output.iterdir())
    summary["adapter_files"] = sorted(p.name for p in (output / "adapter").iterdir()) if (output / "adapter").is_dir() else None
    summary["checkpoints"] = sorted(p.name for p in (output / "checkpoints").iterdir()) if (output / "checkpoints").is_dir() else None
    if summary["cuda"]:
        summary["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
    (OUT / f"e2e-{METHOD}-results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    finish(0 if summary["ok"] else 1)
except SystemExit:
    raise
except BaseException as error:
    summary["error"] = f"{type(error).__name__}: {error}"[:2000]
    summary["traceback"] = traceback.format_exc()[-6000:]
    print(summary["traceback"][-2500:], file=sys.stderr)
    finish(1)
PYEOF
    OUT="$OUT" E2E_METHOD="$method" PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" \
        HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
        timeout -k 10 "$limit" "$PY" -u "$check" 2>&1 | tee "$OUT/e2e-$method.log" |
        keep '^(E2E|starting|resuming|baseline|fast path|step|final evaluation|done|warning: every|Traceback)|^[A-Za-z_.]*(Error|Exception): '
    local rc=${PIPESTATUS[0]}
    report_exit "$rc" "$method end to end" "$limit" "see e2e-$method.log" "see e2e-$method.json / .log"
    if [ ! -f "$OUT/e2e-$method.json" ]; then
        printf '{"method": "%s", "ok": false, "error": "no summary written: rc=%s (124/137 = stopped at %ss)"}\n' \
            "$method" "$rc" "$limit" >"$OUT/e2e-$method.json"
    fi
}

say "gpu_session.sh: parts $PARTS, output in $OUT, python $PY"
for part in $PARTS; do
    case $part in
        1) part1 ;;
        2) part2 ;;
        3) say "part 3"; end_to_end LoRA "$LORA_TIMEOUT" ;;
        4) say "part 4"; end_to_end QLoRA "$QLORA_TIMEOUT" ;;
        5) part5 ;;
        *) say "unknown part $part" ;;
    esac
done
ls -l "$OUT" | sed 's/^/out: /'
say "done"
