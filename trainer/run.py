"""``grpo train``: baseline evaluation, GRPO training, final evaluation on the same held-out tasks, results.

The loop is TRL's GRPOTrainer; this module only wires it to an environment, the sandbox, a run directory and a
cost cap, in the order a reader expects:

    plan -> load model -> baseline (or reuse it) -> train (or resume) -> final evaluation -> results.json
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import shutil
import time
import warnings
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import torch
from nodus.core.environment import Environment, Task
from nodus.core.errors import NodusError, first_line
from nodus.core.grading import Grader
from nodus.core.registry import get_registry
from nodus.trainer.callbacks import CostMeter, RunCallback, format_duration
from nodus.trainer.distributed import FSDP_SETTINGS, in_child, launch
from nodus.trainer.evaluate import Evaluation, check_something_graded, evaluate, render_prompts, score_text
from nodus.trainer.models import (
    ModelNotAvailable,
    hub_arguments,
    load_model_and_tokenizer,
    model_config_path,
    model_fit_problem,
    require_nf4_device,
    resolve_model,
)
from nodus.trainer.optimizer_check import optimizer_problem
from nodus.trainer.pricing import lookup_gpu
from nodus.trainer.progress import Console
from nodus.trainer.ranks import Ranks
from nodus.trainer.results import paired_comparison, plot_rewards, reward_signal, versions
from nodus.trainer.rewards import SandboxReward, merge_reward_states, prompt_dataset
from nodus.trainer.rundir import RunDir, read_json, write_json_atomic
from nodus.trainer.spec import (
    InvalidJobSpec,
    Parameters,
    TrainingJob,
    check_combinations,
    check_cost_cap_rate,
    check_fsdp_share,
    check_trl_fields,
)


@dataclass
class RunOptions:
    output: Path
    gpu: str | None = None
    gpu_rate: Decimal | None = None
    quiet: bool = False
    report_to: list[str] = field(default_factory=list)



def resolve_environment(job: TrainingJob, environment: Environment | None, say: Any) -> tuple[Environment, str]:
    """The environment to train on and the distribution that provides it (for results.json)."""
    if environment is not None:
        return environment, "in-process"
    resolution = get_registry().resolve(job.spec.environment.name)
    if resolution.note:
        say(f"note: {resolution.note}")
    return resolution.spec.make(job.spec.environment.params), resolution.spec.distribution


def hourly_rate(options: RunOptions, gpus: int = 1) -> tuple[Decimal | None, float | None]:
    """The USD/hour the run is charged and the price table's step time for the GPU, if one was named.

    Rates are per GPU (the table's and --gpu-rate): a run over several GPUs (FSDP) is charged for each."""
    gpu = lookup_gpu(options.gpu) if options.gpu else None
    rate = options.gpu_rate if options.gpu_rate is not None else (gpu.usd_per_hour if gpu else None)
    return (None if rate is None else rate * gpus), float(gpu.seconds_per_step) if gpu else None


def quiet_libraries() -> None:
    """Our progress line is the display: silence transformers' log dicts, progress bars and deprecation chatter."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    import datasets

    datasets.disable_progress_bars()  # TRL's SFT data preparation ("Tokenizing train dataset ...")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    logging.getLogger("trl.trainer.grpo_trainer").addFilter(_drop_misleading_trl_warnings)


# TRL warnings that say something false or redundant about a nodus run:
MISLEADING_TRL_WARNINGS = (
    # nodus' reward returns None only for an infrastructure failure, which the sandbox pool logs in one line and the
    # progress line counts; TRL repeats each one over three lines with the task and the raw completion.
    "All reward functions returned None",
    # Said when nodus pins the KL reference's revision (Full, beta > 0, a hub model): TRL does use them for it.
    "You passed `model_init_kwargs` to the `GRPOConfig`, but your model is already instantiated",
)


def _drop_misleading_trl_warnings(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(MISLEADING_TRL_WARNINGS)


def train(job: TrainingJob, options: RunOptions, environment: Environment | None = None) -> dict[str, Any]:
    """Run ``job``; ``environment`` replaces the registry lookup (e.g. a function environment built in Python).

    Under ``distributed.strategy: FSDP`` this process launches the run's processes (nodus.trainer.distributed) and
    returns their results; each of those processes runs this function too, with `Ranks` saying what it does."""
    ranks = Ranks()
    console = Console(options.quiet or not ranks.main)
    say = console.say
    quiet_libraries()
    spec = job.spec
    env, distribution = resolve_environment(job, environment, say)
    train_tasks = env.tasks("train", spec.environment.seed, spec.environment.train_tasks)
    heldout = env.tasks("heldout", spec.environment.seed, spec.environment.held_out_tasks)
    gpus = ranks.world if torch.cuda.is_available() else 1
    rate, table_step_seconds = hourly_rate(options, gpus)
    check_cost_cap_rate(job, rate is not None)
    check_supported(job, function_environment=environment is not None)
    if spec.parameters.sft_warmup_steps:
        from nodus.trainer.sft import reference_answer

        reference_answer(env, train_tasks[0])  # an environment without references fails now, not after the baseline
    source = resolve_model(spec.model.uri)  # parses only: a malformed uri fails before anything is written
    grader = Grader(env, sandbox=spec.sandbox, limits=spec.sandbox_limits)  # checks the limits; starts nothing
    from trl import GRPOConfig

    # TRL's own checks of the settings (e.g. of --trl fields), before any work rather than after the baseline.
    processes = fsdp_processes(job) if spec.distributed.strategy == "FSDP" else 1
    # The launcher is one process to TRL, so it checks the whole batch there, as the child processes together will.
    config = grpo_config(GRPOConfig, job, RunDir(options.output), options, processes if in_child() else 1)
    problem = optimizer_problem(config)  # transformers builds both only once training starts
    if problem is not None:
        raise InvalidJobSpec(problem)
    with contextlib.suppress(ModelNotAvailable):  # a model not available yet is reported when it is loaded
        p = spec.parameters
        problem = model_fit_problem(p.trl, p.max_completion_length, model_config_path(source))
        if problem is not None:
            raise InvalidJobSpec(problem)
    if spec.distributed.strategy == "FSDP" and not in_child():
        return launch(job, options, processes)
    run = RunDir(options.output)
    # What touches the run directory happens on rank 0; the others follow once it is done.
    resuming = ranks.broadcast(run.claim(job.canonical()) if ranks.main else None)
    cost = CostMeter(rate, spec.max_cost_usd, previous_seconds=run.saved_spend())
    previous: dict[str, Any] | None = read_json(run.results) if run.results.exists() else None
    if previous is not None:
        finished = finished_note(previous, spec.max_cost_usd)
        if finished:
            say(f"{finished}; results in {run.results}")
            return previous
    say(
        f"{'resuming' if resuming else 'starting'} {job.name} in {run.path}: {env.id_text()}, "
        f"{len(train_tasks)} train / {len(heldout)} held-out tasks, seed {spec.environment.seed}, "
        f"model {spec.model.uri}, {spec.parameters.method} r={spec.parameters.lora.r}"
        + (f", FSDP over {ranks.world} processes" if ranks.world > 1 else "")
    )
    if ranks.main:
        run.save_spec(job.canonical())  # continuing: now the changed resumable fields (maxCostUSD) apply
    try:
        return train_claimed(
            job, options, run, env, distribution, train_tasks, heldout, source, grader, cost, rate,
            table_step_seconds, gpus, ranks, console,
        )
    except BaseException as error:  # recorded, then raised as it was (a bug keeps its traceback)
        if ranks.main and not isinstance(error, SystemExit):
            try:
                say(record_failure(run, job, distribution, error, previous, cost))
            except Exception as recording:  # e.g. a full disk: the original error is the one to see
                say(f"warning: could not record the failure in {run.results}: {recording}")
            with contextlib.suppress(Exception):  # the time until the stop is billed too (loading, evaluating)
                run.save_spend(cost.spent_seconds)
        raise


def finished_note(previous: dict[str, Any], cap: Decimal | None) -> str | None:
    """Why a re-run on this directory has nothing to do, or None when it should train (resume or continue)."""
    status = previous.get("status")
    if status == "completed":
        return "this run is already finished"
    if status == "stopped_by_cost_cap":
        spent = (previous.get("cost") or {}).get("actualUSD")
        old_cap = (previous.get("cost") or {}).get("maxCostUSD")
        if cap is None or old_cap is None or (cap > Decimal(old_cap) and (spent is None or cap > Decimal(spent))):
            return None  # the cap was raised (or removed): continue from the checkpoint kept at the stop
        return (
            f"this run is already finished: it stopped at its cost cap (maxCostUSD {old_cap}, spent ${spent}); "
            "to continue it, repeat the command with a --max-cost-usd above what it has spent"
        )
    return None  # failed or interrupted: resume


FINISHED = ("completed", "stopped_by_cost_cap")


def record_failure(
    run: RunDir,
    job: TrainingJob,
    distribution: str,
    error: BaseException,
    previous: dict[str, Any] | None,
    cost: CostMeter | None = None,
) -> str:
    """results.json for a run that raised: status failed (or interrupted, for Ctrl-C), the error, where to resume.

    `previous` is the results.json this attempt found: a cost-capped run's record is kept inside the new one. A
    kill -9 leaves no record (nothing can run); the checkpoints are the same either way. Under FSDP only rank 0
    records (a Ctrl-C stops the processes through the launcher, which records nothing)."""
    interrupted = isinstance(error, KeyboardInterrupt)
    now = read_json(run.results) if run.results.exists() else None
    if now is not None and now != previous and now.get("status") in FINISHED:
        return f"stopped after {run.results} was written (status {now['status']}): it stands"
    checkpoints = run.complete_checkpoints()
    message = first_line(error, 500)
    baseline = Evaluation.model_validate(read_json(run.baseline)) if run.baseline.exists() else None
    metrics = run.read_metrics()
    last = checkpoints[-1].name if checkpoints else None
    resume = (
        f"from {last}" if last
        else "from the start of training (no checkpoint yet)" if run.baseline.exists()
        else "from the baseline evaluation"
    )
    summary = None if baseline is None else {"meanScore": baseline.mean_score, "passRate": baseline.pass_rate}
    write_json_atomic(
        run.results,
        {
            "status": "interrupted" if interrupted else "failed",
            "error": None if interrupted else f"{type(error).__name__}: {message}",
            "job": job.canonical(),
            "versions": versions(distribution),
            "baseline": summary,
            "training": {"steps": metrics[-1]["step"] if metrics else 0, "lastCheckpoint": last},
            "resume": f"repeat the command with --output {run.path}: it continues {resume}",
            "cost": None if cost is None else {
                "runSecondsAllAttempts": round(cost.spent_seconds, 2),
                "actualUSD": None if cost.usd() is None else str(cost.usd()),
                "maxCostUSD": None if cost.cap is None else str(cost.cap),
            },
            # What an earlier attempt finished with (a cost-capped run continued with a higher cap): not lost.
            "previous": previous if previous and previous.get("status") in FINISHED else (previous or {}).get(
                "previous"
            ),
        },
    )
    what = "interrupted" if interrupted else "failed"
    return (
        f"run {what}; recorded in {run.results}; repeat the command with --output {run.path} to continue {resume}"
        + disk_space_note(run.path)
    )


LOW_DISK_BYTES = 256 * 1024 * 1024


def disk_space_note(path: Path) -> str:
    """Says when the run's disk is (nearly) full: torch reports a failed save as "basic_ios::clear: iostream error"."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return ""
    if free >= LOW_DISK_BYTES:
        return ""
    return f" (the disk holding {path} has only {free / 2**20:.1f} MiB free: free some space first)"


def train_claimed(
    job: TrainingJob,
    options: RunOptions,
    run: RunDir,
    env: Environment,
    distribution: str,
    train_tasks: list[Task],
    heldout: list[Task],
    source: Any,
    grader: Grader,
    cost: CostMeter,
    rate: Decimal | None,
    table_step_seconds: float | None,
    gpus: int,
    ranks: Ranks,
    console: Console,
) -> dict[str, Any]:
    """The run in a claimed directory: load, baseline (or reuse it), train (or resume), final evaluation, results."""
    spec, say = job.spec, console.say
    on_gpu = torch.cuda.is_available()
    fast = fast_path_on(spec.parameters, ranks)
    model, tokenizer = load_model_and_tokenizer(
        source,
        quantization="nf4" if spec.parameters.method == "QLoRA" else None,
        # On the GPU from the start (the baseline evaluation too); under FSDP on the CPU until accelerate shards it.
        device=f"cuda:{ranks.local_rank}" if on_gpu and ranks.world == 1 else None,
    )
    warn_if_answers_cannot_fit(env, heldout, tokenizer, spec.parameters.max_completion_length, say)
    warn_if_context_overflows(env, heldout, tokenizer, model, spec.parameters, say)
    with grader:
        if ranks.main:
            if on_gpu and ranks.world > 1:
                model.to(f"cuda:{ranks.local_rank}")  # rank 0 grades the baseline on its GPU, then hands back
            baseline = baseline_evaluation(run, model, tokenizer, env, heldout, grader, spec.parameters, fast, say)
            if on_gpu and ranks.world > 1:
                model.to("cpu")
            latest = run.latest_checkpoint()  # removes half-written checkpoints: once, here
        checkpoint_name = ranks.broadcast(str(latest) if ranks.main and latest else None)
        checkpoint = Path(checkpoint_name) if checkpoint_name else None
        if not ranks.main:
            baseline = Evaluation.model_validate(read_json(run.baseline))
        started = time.monotonic()
        warmup: dict[str, Any] | None = None
        if spec.parameters.sft_warmup_steps and checkpoint is None:
            # GRPO has not started: warm up (again, if a kill came before GRPO's first checkpoint).
            model, warmup = run_sft_warmup(
                job, run, env, train_tasks, heldout, model, tokenizer, grader, console, fast
            )
        elif spec.parameters.sft_warmup_steps and run.sft.exists():
            warmup = read_json(run.sft)  # GRPO's checkpoints hold the warmed-up adapter
        if warmup is not None and checkpoint is not None:
            say("the SFT warm-up is in the checkpoints (sft.json has its summary): not repeated")
        starting_point = Evaluation.model_validate(warmup["afterSft"]) if warmup else baseline
        warn_if_no_signal(starting_point, say, after_warmup=warmup is not None)
        trainer, callback, reward = build_trainer(
            job, run, env, train_tasks, model, tokenizer, grader, cost, table_step_seconds, options, console, ranks
        )
        if checkpoint is not None:
            restore_accounting(run, checkpoint, reward, say, ranks)
        elif ranks.main:
            run.truncate_metrics(0)  # an attempt stopped before its first checkpoint: its steps are logged again
        # Stopped after training (during the final evaluation, say): train() would take one step too many.
        finished = checkpoint if checkpoint is not None and training_finished(checkpoint) else None
        try:
            if finished is not None:
                say(f"training finished at {finished.name}: loading it for the final evaluation")
                if ranks.world == 1:
                    trainer._load_from_checkpoint(str(finished))
            else:
                trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        finally:
            console.close()  # the live bar (on a terminal) ends with training
        if finished is not None and ranks.world > 1:
            # FSDP's checkpoint holds the gathered weights; loading its shards would need a prepared trainer.
            save_checkpoint_weights(finished, run, ranks)
        else:
            save_trained_weights(trainer, tokenizer, run, ranks)
        status = "stopped_by_cost_cap" if callback.stopped_by_cost_cap else "completed"
        reward_state = merged_reward_state(reward, ranks)
        # What actually ran (accelerate has been known to fall back from FSDP to DDP without a word).
        distributed = {"processes": ranks.world, "accelerate": str(trainer.accelerator.distributed_type.value)}
        final = None
        if ranks.main:
            final = final_evaluation(
                trainer, tokenizer, callback, baseline, source, run, env, heldout, grader, spec, ranks, say
            )
            run.save_spend(cost.spent_seconds)
        wall = time.monotonic() - started
    if ranks.main:
        results = assemble_results(
            job,
            run,
            env,
            distribution,
            source.display,
            heldout,
            baseline,
            final,
            reward_state,
            callback,
            status,
            wall,
            rate,
            estimated_cost(job, options, gpus),
            warmup,
            distributed,
        )
        write_json_atomic(run.results, results)
        plot_rewards(run.plot, run.read_metrics(), baseline, final)
        say(summary_line(baseline, final, results))
    ranks.barrier()
    written: dict[str, Any] = read_json(run.results)
    return written


def final_evaluation(
    trainer: Any,
    tokenizer: Any,
    callback: RunCallback,
    baseline: Evaluation,
    source: Any,
    run: RunDir,
    env: Environment,
    heldout: list[Task],
    grader: Grader,
    spec: Any,
    ranks: Ranks,
    say: Any,
) -> Evaluation | None:
    """The held-out tasks again, as the baseline was graded (rank 0 only); None when it would pass the cost cap."""
    if callback.cost.would_exceed(baseline.seconds):
        say("skipping the final evaluation: it would pass maxCostUSD")
        return None
    say(f"final evaluation on {len(heldout)} held-out tasks")
    if ranks.world == 1:
        trained = trainer.model
        trainer.release_training_memory()
        gc.collect()  # the sampler and its decode state, and each graph and the backbone, refer to each other
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    else:
        # The trained weights are sharded over the processes: evaluate what was saved, after freeing this
        # process's shard and optimizer state so that the whole model fits beside them.
        trainer.accelerator.free_memory()
        trainer.model = trainer.model_wrapped = trainer.optimizer = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        trained = load_trained(source, run, spec.parameters)
    p = spec.parameters
    # The fast trainer's fused weights serve the final evaluation too: no second copy of the model.
    weights = trainer.fast_weights if ranks.world == 1 else None
    final = evaluate(
        trained, tokenizer, env, heldout, grader, p.max_completion_length, p.eval_batch_size, fast_path_on(p, ranks),
        weights, p.chat_template_kwargs,
    )
    # Nothing to compare: the run fails (not "completed"), and the repeated command evaluates again.
    check_something_graded(final, "final evaluation", env.id_text())
    write_json_atomic(run.final, final.model_dump())
    return final


def fsdp_processes(job: TrainingJob) -> int:
    """How many processes an FSDP run starts: distributed.processes, or one per visible GPU."""
    wanted = job.spec.distributed.processes
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if wanted is None and gpus == 0:
        raise InvalidJobSpec(
            "distributed.strategy FSDP shards the model over several GPUs and none is visible; on CPU (to test the "
            "setup) set distributed.processes, e.g. 2"
        )
    processes = wanted or gpus
    check_fsdp_share(job.spec.parameters.batch_size, processes, "GPU" if gpus else "process")
    if gpus and processes > gpus:
        raise InvalidJobSpec(
            f"distributed.processes is {processes} but only {gpus} GPUs are visible: one process per GPU; "
            f"set it to {gpus} or less"
        )
    return processes


def merged_reward_state(reward: SandboxReward, ranks: Ranks) -> dict[str, Any]:
    """The reward tally over every process (each grades its own share of the completions)."""
    return merge_reward_states(ranks.gather(reward.state()))


def load_trained(source: Any, run: RunDir, parameters: Parameters) -> Any:
    """The trained model as saved in adapter/ (the base model plus the adapter, or the whole model for Full)."""
    device = "cuda:0" if torch.cuda.is_available() else None
    if parameters.method == "Full":
        return load_model_and_tokenizer(resolve_model(str(run.adapter)), device=device)[0]
    from peft import PeftModel

    base = load_model_and_tokenizer(source, device=device)[0]
    return PeftModel.from_pretrained(base, str(run.adapter))


def run_sft_warmup(
    job: TrainingJob,
    run: RunDir,
    env: Environment,
    train_tasks: list[Task],
    heldout: list[Task],
    model: Any,
    tokenizer: Any,
    grader: Grader,
    console: Console,
    fast: bool,
) -> tuple[Any, dict[str, Any]]:
    """SFT on the train tasks' reference answers, then the held-out evaluation GRPO starts from (saved to sft.json)."""
    say = console.say
    from nodus.trainer.sft import DEFAULT_LEARNING_RATE, sft_warmup

    p = job.spec.parameters
    on_gpu = torch.cuda.is_available()
    try:
        model, summary = sft_warmup(
            model,
            tokenizer,
            env,
            train_tasks,
            steps=p.sft_warmup_steps,
            learning_rate=p.sft_learning_rate or DEFAULT_LEARNING_RATE[p.method],
            batch_size=p.batch_size,
            seed=job.spec.environment.seed,
            output_dir=str(run.path / "sft"),
            peft_config=lora_config(p),
            on_gpu=on_gpu,
            bf16=on_gpu and torch.cuda.is_bf16_supported(),
            say=say,
            progress=console.step,
            chat_template_kwargs=p.chat_template_kwargs,
        )
    finally:
        console.close()  # a live bar of the warm-up ends here (or on an error); GRPO's starts afresh
    say(f"evaluation after the SFT warm-up on {len(heldout)} held-out tasks")
    after = evaluate(
        model, tokenizer, env, heldout, grader, p.max_completion_length, p.eval_batch_size, fast,
        chat_template_kwargs=p.chat_template_kwargs,
    )
    say(
        f"after SFT: mean score {score_text(after.mean_score)}, pass rate {score_text(after.pass_rate)}"
        + ungraded_note(after)
    )
    warmup = {**summary.to_json(), "afterSft": after.model_dump()}
    write_json_atomic(run.sft, warmup)
    return model, warmup


def sft_results(warmup: dict[str, Any] | None, final: Evaluation | None, summary: Any) -> dict[str, Any] | None:
    """The warm-up in results.json: its losses, the held-out scores after it, and what GRPO added on top."""
    if warmup is None:
        return None
    after = Evaluation.model_validate(warmup["afterSft"])
    return {
        **{key: value for key, value in warmup.items() if key != "afterSft"},
        "afterSft": summary(after),
        "grpoDifference": paired_comparison(after, final) if final else None,
    }


def check_supported(job: TrainingJob, function_environment: bool = False) -> None:
    """Refuse, before any work, what this version cannot run rather than silently doing something else."""
    check_combinations(job, function_environment)
    if job.spec.distributed.strategy == "FSDP":
        fsdp_processes(job)
    if job.spec.parameters.method == "QLoRA":
        require_nf4_device()
    if job.spec.parameters.trl.get("use_vllm"):
        require_vllm()


def require_vllm() -> None:
    """TRL's vLLM generation (--trl use_vllm=true) imports vLLM only after the baseline evaluation: check now."""
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("vLLM, which is not installed (pip install 'nodus[vllm]'; its wheels pin torch and CUDA)")
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU, and none is available")
    if missing:
        raise InvalidJobSpec(
            f"spec.parameters.trl.use_vllm needs {' and '.join(missing)}; remove --trl use_vllm=true to generate "
            "with nodus' fast path (on a GPU) or model.generate"
        )


def baseline_evaluation(
    run: RunDir,
    model: Any,
    tokenizer: Any,
    env: Environment,
    heldout: list[Task],
    grader: Grader,
    parameters: Parameters,
    fast: bool,
    say: Any,
) -> Evaluation:
    if run.baseline.exists():
        say("reusing the saved baseline evaluation")
        return Evaluation.model_validate(read_json(run.baseline))
    say(f"baseline evaluation on {len(heldout)} held-out tasks (greedy)")
    baseline = evaluate(
        model, tokenizer, env, heldout, grader, parameters.max_completion_length, parameters.eval_batch_size, fast,
        chat_template_kwargs=parameters.chat_template_kwargs,
    )
    # Not saved then: a repeated command, once the grader is fixed, evaluates again instead of reusing it.
    check_something_graded(baseline, "baseline evaluation", env.id_text())
    write_json_atomic(run.baseline, baseline.model_dump())
    say(
        f"baseline: mean score {score_text(baseline.mean_score)}, pass rate {score_text(baseline.pass_rate)} "
        f"({format_duration(baseline.seconds)}){ungraded_note(baseline)}"
    )
    return baseline


def warn_if_answers_cannot_fit(env: Environment, tasks: list[Task], tokenizer: Any, limit: int, say: Any) -> None:
    """A reference answer longer than maxCompletionLength means a correct completion is cut off: say so early."""
    lengths = []
    for task in tasks:
        try:
            lengths.append(len(tokenizer(env.reference(task), add_special_tokens=False)["input_ids"]))
        except NodusError:  # an environment without reference answers (e.g. a function environment)
            return
    too_long = [n for n in lengths if n > limit]
    if too_long:
        say(
            f"warning: the reference answers of {len(too_long)} of {len(tasks)} held-out tasks are longer than "
            f"maxCompletionLength ({max(too_long)} > {limit} tokens), so a correct answer there is cut off; raise "
            f"--max-completion-length to at least {max(lengths)}"
        )


def warn_if_context_overflows(
    env: Environment, tasks: list[Task], tokenizer: Any, model: Any, parameters: Parameters, say: Any
) -> None:
    """A prompt plus maxCompletionLength past the model's context: completions there are generated past it."""
    context = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if not isinstance(context, int):
        return
    limit = parameters.max_completion_length
    texts = render_prompts(tokenizer, [env.prompt(task) for task in tasks], parameters.chat_template_kwargs)
    longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    if longest + limit > context:
        say(
            f"warning: the longest held-out prompt ({longest} tokens) plus maxCompletionLength ({limit}) passes the "
            f"model's context of {context} tokens, where generation degrades; use --max-completion-length "
            f"{max(context - longest, 1)} or less"
        )


def warn_if_no_signal(start: Evaluation, say: Any, after_warmup: bool = False) -> None:
    """Warn when every held-out score GRPO starts from is the same (the baseline, or the SFT warm-up's result)."""
    scores = {t.score for t in start.tasks if t.score is not None}
    if len(scores) == 1:
        (score,) = scores
        which = "score after the SFT warm-up" if after_warmup else "baseline score"
        advice = (
            "consider more warm-up steps (--sft-warmup-steps), or "
            if after_warmup
            else "consider an SFT warm-up on reference answers (--sft-warmup-steps N), or "
        )
        say(
            f"warning: every held-out {which} is {score:g}: if training rewards look the same, every group "
            f"reward is identical and GRPO will not learn; {advice}"
            f"{'harder' if score >= 1 else 'easier'} tasks (or partial credit)"
        )


def build_trainer(
    job: TrainingJob,
    run: RunDir,
    env: Environment,
    train_tasks: list[Task],
    model: Any,
    tokenizer: Any,
    grader: Grader,
    cost: CostMeter,
    table_step_seconds: float | None,
    options: RunOptions,
    console: Console,
    ranks: Ranks,
) -> tuple[Any, RunCallback, SandboxReward]:
    from nodus.trainer.fast_grpo import FastGRPOTrainer
    from transformers import PrinterCallback
    from trl import GRPOConfig

    reward = SandboxReward(grader, tokenizer)
    say = console.say
    callback = RunCallback(
        run,
        reward,
        cost,
        say,
        table_step_seconds,
        console.step,
        ranks,
        lambda: merged_reward_state(reward, ranks),
        steps_per_round=job.spec.parameters.steps_per_round,
    )
    on_gpu = torch.cuda.is_available()
    fast = fast_path_on(job.spec.parameters, ranks)
    trainer = FastGRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=grpo_config(GRPOConfig, job, run, options, ranks.world),
        train_dataset=prompt_dataset(env, train_tasks),
        processing_class=tokenizer,
        # After an SFT warm-up the model already carries its adapter, which GRPO keeps training.
        peft_config=None if hasattr(model, "peft_config") else lora_config(job.spec.parameters),
        callbacks=[callback],
        fast_generation=fast,
        fast_training=fast,
        compile_layers=fast and on_gpu,  # compiling pays off over a GPU run; on CPU it costs more than it saves
        # The update and the prefill are bound by kernel launches; replayed as CUDA graphs they took 0.155 -> 0.053 s
        # and 14.5 -> 4.8 ms on the 0.6B shape (docs/benchmarks.md, run 6). A capture failure runs plainly.
        training_graphs=fast and on_gpu,
        prefill_graphs=fast and on_gpu,
    )
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; RunCallback prints one line per step
    if fast:
        rollouts = trainer.fast_path_reason()
        forward = "written-out" if trainer.backbone else f"the model's own ({trainer.training_fallback_reason})"
        sampler = "static-cache sampler" if rollouts is None else f"TRL generate ({rollouts})"
        say(f"fast path: rollouts {sampler}, training forward {forward}")
    return trainer, callback, reward


def fast_path_on(parameters: Parameters, ranks: Ranks) -> bool:
    """fastPath on, or auto with a CUDA GPU. The fast path reads whole weight matrices and under FSDP each process
    holds a shard, so FSDP runs use TRL's own path and `model.generate` (evaluations too: memory is what FSDP is
    short of, and the fast path's fused weights would be a full, unsharded copy)."""
    mode = parameters.fast_path
    return ranks.world == 1 and (mode == "on" or (mode == "auto" and torch.cuda.is_available()))


def grpo_config(config_cls: Any, job: TrainingJob, run: RunDir, options: RunOptions, processes: int = 1) -> Any:
    p = job.spec.parameters
    on_gpu = torch.cuda.is_available()
    settings: dict[str, Any] = {
        "output_dir": str(run.checkpoints),
        # batchSize counts the completions of a whole step: under FSDP each process trains on its share.
        "per_device_train_batch_size": p.batch_size // processes,
        "num_generations": p.num_generations,
        "max_completion_length": p.max_completion_length,
        "beta": p.beta,
        "learning_rate": p.learning_rate,
        "temperature": p.temperature,
        "num_train_epochs": p.epochs,
        "max_steps": p.max_steps or -1,
        "loss_type": p.loss_type,
        "save_strategy": "steps",
        "save_steps": p.checkpoint_steps,
        "save_total_limit": 2,  # the newest complete checkpoint survives a kill during the next save
        "logging_steps": 1,
        "report_to": options.report_to,
        "disable_tqdm": True,  # our progress line replaces it
        "seed": job.spec.environment.seed,
        "use_cpu": not on_gpu,
        "bf16": on_gpu and torch.cuda.is_bf16_supported(),
    }
    if p.generation_batch_size is not None:
        settings["generation_batch_size"] = p.generation_batch_size
    source = resolve_model(job.spec.model.uri)
    if p.method == "Full" and p.beta > 0 and source.kind == "hub":
        # TRL loads the KL reference by the policy's config name, which for a hub model is the bare repo id: its
        # default branch, not the revision the policy was loaded at. Pin it (and stay offline as the policy did).
        settings["model_init_kwargs"] = hub_arguments(source)
    if job.spec.distributed.strategy == "FSDP":
        settings.update(FSDP_SETTINGS)
    check_trl_fields(p, config_cls)
    settings.update(p.trl)
    try:
        return config_cls(**settings)
    except (ValueError, TypeError) as error:
        raise InvalidJobSpec(f"TRL rejected the training parameters: {str(error).splitlines()[0]}") from None


def effective_settings(p: Parameters) -> dict[str, Any]:
    """The values the spec leaves to a default or that follow from it (job.json keeps the spec as written)."""
    from nodus.trainer.sft import DEFAULT_LEARNING_RATE

    return {
        "loraAlpha": None if p.method == "Full" else p.lora.alpha or 2 * p.lora.r,
        "sftLearningRate": (p.sft_learning_rate or DEFAULT_LEARNING_RATE[p.method]) if p.sft_warmup_steps else None,
        "checkpointSteps": p.checkpoint_steps,
        "completionsPerRound": p.completions_per_round,
    }


def lora_config(parameters: Parameters) -> Any:
    if parameters.method == "Full":
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=parameters.lora.r,
        lora_alpha=parameters.lora.alpha or 2 * parameters.lora.r,
        lora_dropout=parameters.lora.dropout,
        target_modules="all-linear",  # every linear layer of the decoder (q, k, v, o, gate, up, down), not lm_head
        task_type="CAUSAL_LM",
    )


def training_finished(checkpoint: Path) -> bool:
    """Whether a checkpoint is the last step of its run (transformers' own record of the step and the plan)."""
    state = read_json(checkpoint / "trainer_state.json")
    return bool(state.get("max_steps")) and int(state.get("global_step", 0)) >= int(state["max_steps"])


def restore_accounting(run: RunDir, checkpoint: Path, reward: SandboxReward, say: Any, ranks: Ranks) -> None:
    """What our side keeps beyond TRL's checkpoint: the reward tally; metrics after it are logged again."""
    state = run.checkpoint_state(checkpoint)
    if ranks.main:  # the saved tally is every process's; the others count from zero and are added to it
        reward.restore(state.get("rewards", {}))
        run.truncate_metrics(int(state["step"]))
    say(f"resuming from {checkpoint.name} (step {state['step']})")


def save_trained_weights(trainer: Any, tokenizer: Any, run: RunDir, ranks: Ranks) -> None:
    """Save the adapter (or the model, for Full) to adapter/ by rename, so it is never half-written."""
    staging = run.path / ".adapter.tmp"
    if ranks.main:
        shutil.rmtree(staging, ignore_errors=True)
    ranks.barrier()
    trainer.save_model(str(staging))  # every process takes part under FSDP (the full state dict is gathered)
    if ranks.main:
        tokenizer.save_pretrained(str(staging))
        shutil.rmtree(run.adapter, ignore_errors=True)
        staging.rename(run.adapter)
    ranks.barrier()


# What adapter/ keeps of a checkpoint: the weights, their configs, the tokenizer and the model card. The rest is state
# for resuming: the optimizer (optimizer.pt, or FSDP's optimizer.bin and its shards: a full model's worth of fp32
# moments), FSDP's own model file, the schedule, random states and the trainer's records.
WEIGHT_FILE_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model", ".md")
TRAINING_STATE_FILES = {"trainer_state.json", "COMPLETE.json"}


def save_checkpoint_weights(checkpoint: Path, run: RunDir, ranks: Ranks) -> None:
    """adapter/ from a checkpoint's own copy of the weights and tokenizer (rank 0), by rename as above."""
    if ranks.main:
        staging = run.path / ".adapter.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for path in checkpoint.iterdir():
            if path.is_file() and path.name.endswith(WEIGHT_FILE_SUFFIXES) and path.name not in TRAINING_STATE_FILES:
                shutil.copy2(path, staging / path.name)
        shutil.rmtree(run.adapter, ignore_errors=True)
        staging.rename(run.adapter)
    ranks.barrier()


def assemble_results(
    job: TrainingJob,
    run: RunDir,
    env: Environment,
    distribution: str,
    model_display: str,
    heldout: list[Task],
    baseline: Evaluation,
    final: Evaluation | None,
    reward_state: dict[str, Any],
    callback: RunCallback,
    status: str,
    wall_seconds: float,
    rate: Decimal | None,
    estimated_usd: str | None,
    warmup: dict[str, Any] | None = None,
    distributed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    metrics = run.read_metrics()
    tokens = next((row["num_tokens"] for row in reversed(metrics) if "num_tokens" in row), None)

    def summary(evaluation: Evaluation | None) -> dict[str, Any] | None:
        if evaluation is None:
            return None
        return {
            "meanScore": evaluation.mean_score,
            "passRate": evaluation.pass_rate,
            "scored": evaluation.scored,
            "infrastructureFailures": evaluation.infrastructure_failures,
            "seconds": round(evaluation.seconds, 2),
            "perTask": evaluation.scores_by_id(),
        }

    return {
        "status": status,
        "job": job.canonical(),
        "effectiveSettings": effective_settings(job.spec.parameters),
        "versions": versions(distribution),
        "model": model_display,
        "environment": env.id_text(),
        "heldOutTaskIds": [t.id for t in heldout],
        "baseline": summary(baseline),
        "final": summary(final),
        "difference": paired_comparison(baseline, final) if final else None,
        "sftWarmup": sft_results(warmup, final, summary),
        "training": {
            "steps": metrics[-1]["step"] if metrics else 0,
            "wallSeconds": round(wall_seconds, 2),
            "runSecondsAllAttempts": round(callback.cost.spent_seconds, 2),
            "tokens": tokens,
            "distributed": distributed,
            # The steps that sampled a round of completions (every step unless a round spans several).
            "rewardPerStep": [{"step": row["step"], "reward": row["reward"]} for row in metrics if "reward" in row],
        },
        "diagnostics": reward_signal(reward_state, metrics),
        "cost": {
            "estimatedUSD": estimated_usd,
            "usdPerHour": None if rate is None else str(rate),
            "actualUSD": None if callback.cost.usd() is None else str(callback.cost.usd()),
            "maxCostUSD": None if job.spec.max_cost_usd is None else str(job.spec.max_cost_usd),
        },
    }


def estimated_cost(job: TrainingJob, options: RunOptions, gpus: int = 1) -> str | None:
    """The dry run's projection (planned steps x the price table's step time), when a GPU was named."""
    if options.gpu is None:
        return None
    from nodus.trainer.plan import planned_steps
    from nodus.trainer.pricing import project_cost

    rate, step_seconds = hourly_rate(options, gpus)
    assert rate is not None and step_seconds is not None  # a GPU was named
    return str(project_cost(planned_steps(job), Decimal(str(step_seconds)), rate).usd)


def p_value(comparison: dict[str, Any]) -> str:
    """A paired comparison's sign-test p for a summary line."""
    return "n/a" if comparison["signTestP"] is None else f"{comparison['signTestP']:.3g}"


def summary_line(baseline: Evaluation, final: Evaluation | None, results: dict[str, Any]) -> str:
    if final is None:
        return f"done ({results['status']}): baseline {score_text(baseline.mean_score)}, no final evaluation"
    warmup = results.get("sftWarmup")
    grpo_part = ""
    if warmup and warmup.get("grpoDifference"):
        # With a warm-up, the baseline -> final difference is mostly SFT's: say what GRPO itself added.
        grpo = warmup["grpoDifference"]
        difference = "n/a" if grpo["meanDifference"] is None else f"{grpo['meanDifference']:+.3f}"
        grpo_part = (
            f"; after the SFT warm-up {score_text(warmup['afterSft']['meanScore'])}, so GRPO's own difference "
            f"{difference} (sign test p={p_value(grpo)})"
        )
    failures = {
        "training": results["diagnostics"]["infrastructureFailures"],
        "baseline": baseline.infrastructure_failures,
        "final": final.infrastructure_failures,
    }
    failed = ", ".join(f"{count} in {where}" for where, count in failures.items() if count)
    return (
        f"done ({results['status']}): held-out mean score {score_text(baseline.mean_score)} -> "
        f"{score_text(final.mean_score)} (pass rate {score_text(baseline.pass_rate)} -> {score_text(final.pass_rate)}; "
        f"sign test p={p_value(results['difference'])}){grpo_part}; "
        f"{results['diagnostics']['rewardSignal']}"
        + (f"; grading infrastructure failures (left out, never scored): {failed}" if failed else "")
    )


def ungraded_note(evaluation: Evaluation) -> str:
    """For an evaluation line: how many tasks the means leave out because grading them failed."""
    if not evaluation.infrastructure_failures:
        return ""
    return (
        f"; over the {evaluation.scored} of {len(evaluation.tasks)} tasks graded "
        f"({evaluation.infrastructure_failures} grading infrastructure failures, left out)"
    )


class TrainingUnavailable(NodusError):
    """The training extras (torch, transformers, trl, peft) are not installed."""
