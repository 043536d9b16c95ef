"""The job spec: the issue's YAML form, flags over the file, and one-line messages that say the rule and the fix."""

from pathlib import Path

import pytest
from nodus.trainer.spec import InvalidJobSpec, load_job

ISSUE_EXAMPLE = """\
apiVersion: nodus.dev/v1beta1
kind: TrainingJob
metadata: {name: my-grpo-lora}
spec:
  runtime: nodus/grpo-lora
  model: {uri: "hf://Qwen/Qwen3-0.6B@c1899de289a04d12100db370d81485cdf75e47ca"}
  environment: {name: nodus/graph-coloring@1, trainTasks: 200, heldOutTasks: 64, seed: 42}
  maxCostUSD: "5.00"
  parameters: {numGenerations: 4, beta: 0, maxCompletionLength: 64, lora: {r: 8}, method: LoRA, saveSteps: 25}
"""


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(ISSUE_EXAMPLE)
    return path


def test_the_issue_example_loads(job_file: Path) -> None:
    job = load_job(job_file, {})
    assert job.name == "my-grpo-lora"
    assert str(job.spec.max_cost_usd) == "5.00"
    assert job.spec.parameters.lora.r == 8 and job.spec.parameters.method == "LoRA"
    assert job.canonical()["spec"]["environment"]["heldOutTasks"] == 64


def test_flags_win_over_the_file(job_file: Path) -> None:
    job = load_job(job_file, {"spec.parameters.numGenerations": 8, "spec.environment.seed": 7})
    assert job.spec.parameters.num_generations == 8
    assert job.spec.environment.seed == 7
    assert job.spec.parameters.save_steps == 25  # untouched fields keep the file's values


def test_defaults_without_a_file() -> None:
    job = load_job(None, {"spec.environment.name": "graph-coloring@1"})
    assert job.spec.model.uri == "default"
    assert job.spec.parameters.beta == 0 and job.spec.parameters.num_generations == 4
    assert job.spec.parameters.max_completion_length == 64 and job.spec.parameters.save_steps == 25
    assert job.name == "graph-coloring-v1-seed42"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"spec.parameters.numGenerations": 1},
            "invalid job spec (flags): spec.parameters.numGenerations (--num-generations) = 1: "
            "Input should be greater than or equal to 2; use 2 or more",
        ),
        (
            {"spec.parameters.generationBatchSize": 10},
            "invalid job spec (flags): spec.parameters: generationBatchSize=10 must be a multiple of both batchSize "
            "(8) and numGenerations (4), because each generation round holds whole groups and is split into whole "
            "training batches; use e.g. 8",
        ),
        (
            {"spec.parameters.numGenerations": 3},
            "invalid job spec (flags): spec.parameters: batchSize=8 must be a multiple of numGenerations (3), "
            "because a generation round (batchSize completions unless generationBatchSize is set) holds whole "
            "groups; change batchSize, or set generationBatchSize to a common multiple such as 24",
        ),
        (
            {"spec.distributed.strategy": "ZeRO-3"},
            "invalid job spec (flags): spec.distributed.strategy (--distributed-strategy) = 'ZeRO-3': strategy "
            "'ZeRO-3' (DeepSpeed ZeRO) is not supported: nodus shards with PyTorch FSDP through accelerate, which "
            "covers the same memory savings; use strategy: FSDP",
        ),
        (
            {"spec.parameters.lora.rank": 4},
            "invalid job spec (flags): unknown field 'spec.parameters.lora.rank'; allowed here: alpha, dropout, r",
        ),
        (
            {"spec.parameters.numGeneration": 4},
            "invalid job spec (flags): unknown field 'spec.parameters.numGeneration'; did you mean 'numGenerations'? "
            "allowed here: batchSize, beta, epochs, evalBatchSize, fastPath, generationBatchSize, learningRate, lora, "
            "lossType, maxCompletionLength, maxSteps, method, numGenerations, saveSteps, sftLearningRate, "
            "sftWarmupSteps, temperature, trl",
        ),
        (
            {"spec.parameters.method": "QLORA"},
            "invalid job spec (flags): spec.parameters.method (--method) = 'QLORA': Input should be 'LoRA', 'QLoRA' "
            "or 'Full'; did you mean 'QLoRA'?",
        ),
        (
            {"spec.maxCostUSD": "five"},
            "invalid job spec (flags): spec.maxCostUSD (--max-cost-usd) = 'five': Input should be a valid decimal; "
            'write an amount in US dollars, e.g. "5.00"',
        ),
        (
            {"spec.parameters.lossType": "bogus"},
            "invalid job spec (flags): spec.parameters.lossType (--loss-type) = 'bogus': Input should be 'grpo', "
            "'bnpo', 'dr_grpo', 'dapo', 'luspo', 'cispo', 'sapo' or 'vespo'; use one of these",
        ),
        (
            {"metadata.name": "my run"},
            "invalid job spec (flags): metadata.name (--name) = 'my run': String should match pattern "
            "'^[A-Za-z0-9][A-Za-z0-9._-]*$'; use letters, digits, '.', '_' and '-', starting with a letter or digit, "
            "e.g. my-grpo-run",
        ),
        (
            {"spec.environment.seed": 2**32},
            "invalid job spec (flags): spec.environment.seed (--seed) = 4294967296: Input should be less than or "
            "equal to 4294967295; use 4294967295 or less",
        ),
        (
            {"spec.parameters.beta": float("inf")},
            "invalid job spec (flags): spec.parameters.beta (--beta) = inf: Input should be a finite number; use a "
            "finite number",
        ),
        (
            {"spec.parameters.epochs": 1e30},
            "invalid job spec (flags): spec.parameters.epochs (--epochs) = 1e+30: Input should be less than or equal "
            "to 10000; use 10000.0 or less",
        ),
        (
            {"spec.parameters.method": "Full", "spec.parameters.lora.r": 16},
            "invalid job spec (flags): spec.parameters: lora (--lora-r, --lora-alpha, --lora-dropout) applies to "
            "methods LoRA and QLoRA; method Full trains every weight and has no adapter, so remove the lora settings "
            "or use method LoRA",
        ),
    ],
)
def test_messages_name_the_field_its_flag_and_the_rule(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidJobSpec) as error:
        load_job(None, {"spec.environment.name": "graph-coloring@1", **overrides})
    assert str(error.value) == message


def test_no_environment_says_which_flag() -> None:
    with pytest.raises(InvalidJobSpec, match=r"^no environment given: pass --env ID \(e.g. --env graph-coloring@1\)"):
        load_job(None, {})


def test_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec:\n  environment: {name: x\n")
    with pytest.raises(InvalidJobSpec, match=rf"^job file {bad} is not valid YAML at line 3: "):
        load_job(bad, {})
    bad.write_text("- a\n- b\n")
    with pytest.raises(InvalidJobSpec, match="must be a YAML mapping with apiVersion, kind and spec"):
        load_job(bad, {})
    wrong_api = tmp_path / "api.yaml"
    wrong_api.write_text("apiVersion: nodus.dev/v2\nspec: {environment: {name: graph-coloring@1}}\n")
    with pytest.raises(InvalidJobSpec, match=r"apiVersion = 'nodus.dev/v2': Input should be 'nodus.dev/v1beta1'"):
        load_job(wrong_api, {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("spec: null\n", "invalid job spec ({path}): spec = None: must be a mapping of key: value lines"),
        ("spec: [1, 2]\n", "invalid job spec ({path}): spec = [1, 2]: must be a mapping of key: value lines"),
        (
            "spec: {environment: graph-coloring@1}\n",
            "invalid job spec ({path}): spec.environment = 'graph-coloring@1': must be a mapping of key: value lines",
        ),
        (
            "spec: {environment: {name: graph-coloring@1}}\nspec: {environment: {name: math-answer@1}}\n",
            "job file {path} is not valid YAML at line 2: the key 'spec' is given twice; keep one",
        ),
    ],
)
def test_a_file_of_the_wrong_shape_is_named_not_a_traceback(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(InvalidJobSpec) as error:
        load_job(path, {"spec.environment.seed": 7})  # a flag that must not paper over the file's mistake
    assert str(error.value) == message.format(path=path)


def test_a_job_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"spec: {environment: {name: \xff}}\n")
    with pytest.raises(InvalidJobSpec) as error:
        load_job(path, {})
    assert str(error.value) == f"job file {path} is not UTF-8 text (byte 27); save it as UTF-8"


def test_mapping_flags_merge_into_the_files_mappings_key_by_key(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "spec:\n  environment: {name: graph-coloring@1, params: {num_vertices: 30, num_colors: 3}}\n"
        "  parameters: {trl: {top_p: 0.9}}\n  sandboxLimits: {wall_time_s: 20}\n"
    )
    job = load_job(
        path,
        {
            "spec.environment.params": {"num_colors": 4},
            "spec.parameters.trl": {"top_k": 5},
            "spec.sandboxLimits": {"memory_mb": 512},
        },
    )
    assert job.spec.environment.params == {"num_vertices": 30, "num_colors": 4}  # the flag wins for its key only
    assert job.spec.parameters.trl == {"top_p": 0.9, "top_k": 5}
    assert job.spec.sandbox_limits == {"wall_time_s": 20, "memory_mb": 512}


@pytest.mark.parametrize(
    ("trl", "message"),
    [
        (
            {"top_p": "abc"},
            "spec.parameters.trl.top_p = 'abc': Input should be a valid number (GRPOConfig's top_p is float); fix "
            "the value (in YAML, quote text and leave numbers unquoted)",
        ),
        (
            {"top_k": 2.5},
            "spec.parameters.trl.top_k = 2.5: Input should be a valid integer (GRPOConfig's top_k is int); fix the "
            "value (in YAML, quote text and leave numbers unquoted)",
        ),
        (
            {"top_p": 5.0},
            "spec.parameters.trl.top_p = 5.0 is out of range: use a probability mass above 0 and at most 1 (1.0 "
            "keeps every token)",
        ),
        (
            {"repetition_penalty": -1},
            "spec.parameters.trl.repetition_penalty = -1 is out of range: use a value above 0 (1.0 is off)",
        ),
        (
            {"bf16": 1},
            "spec.parameters.trl.bf16 = 1: Input should be a valid boolean (GRPOConfig's bf16 is bool | None); fix "
            "the value (in YAML, quote text and leave numbers unquoted)",
        ),
    ],
)
def test_trl_values_are_checked_against_grpoconfigs_types_and_ranges(trl: dict[str, object], message: str) -> None:
    from nodus.trainer.spec import check_combinations

    job = load_job(None, {"spec.environment.name": "graph-coloring@1", "spec.parameters.trl": trl})
    with pytest.raises(InvalidJobSpec) as error:
        check_combinations(job)
    assert str(error.value) == message


def test_valid_trl_values_pass() -> None:
    from nodus.trainer.spec import check_combinations

    trl = {
        "top_p": 1,
        "top_k": 5,
        "min_p": None,
        "optim": "adamw_torch",
        # do_sample true is what TRL sets anyway (specs that said so must keep working)
        "generation_kwargs": {"no_repeat_ngram_size": 3, "suppress_tokens": [5], "typical_p": 0.95, "do_sample": True},
    }
    check_combinations(load_job(None, {"spec.environment.name": "graph-coloring@1", "spec.parameters.trl": trl}))


GK = "spec.parameters.trl.generation_kwargs"


@pytest.mark.parametrize(
    ("generation_kwargs", "message"),
    [
        # A typo was silently kept as an unused attribute; the suggestion may be a key nodus sets elsewhere.
        (
            {"repetiton_penalty": 1.1},
            f"{GK}.repetiton_penalty is not a GenerationConfig setting; did you mean "
            "'repetition_penalty'? see transformers' GenerationConfig",
        ),
        (
            {"repetition_penalty": 1.1},
            f"{GK}.repetition_penalty is set by spec.parameters.trl.repetition_penalty; "
            "set it there, not through generation_kwargs",
        ),
        (
            {"max_new_tokens": 5},
            f"{GK}.max_new_tokens is set by spec.parameters.maxCompletionLength "
            "(--max-completion-length); set it there, not through generation_kwargs",
        ),
        # num_beams 0 divided by zero at the first sampling, after the baseline evaluation.
        (
            {"num_beams": 0},
            f"{GK}.num_beams selects a decoding strategy other than sampling, and GRPO trains on "
            "completions sampled from the policy; remove it",
        ),
        (
            {"output_scores": True},
            f"{GK}.output_scores changes what generate returns, and TRL reads its result as token ids; remove it",
        ),
        (
            {"stop_strings": ["\n"]},
            f"{GK}.stop_strings needs a tokenizer passed to generate, and TRL passes none "
            "(completions end at EOS); remove it",
        ),
        (
            {"token_healing": True},
            f"{GK}.token_healing needs a tokenizer passed to generate, and TRL passes none; remove it",
        ),
        ({"do_sample": False}, f"{GK}.do_sample must stay true: GRPO trains on sampled completions; remove it"),
        ({"pad_token_id": 0}, f"{GK}.pad_token_id is the tokenizer's, which TRL passes; remove it"),
        ({"typical_p": 0}, f"{GK}.typical_p = 0 is out of range: use a probability mass above 0 and at most 1"),
        (
            {"no_repeat_ngram_size": 2.5},
            f"{GK}.no_repeat_ngram_size = 2.5 is not 0 (off) or a whole number; fix the value",
        ),
        (
            {"suppress_tokens": [1, -2]},
            f"{GK}.suppress_tokens = [1, -2] is out of range: use a list of token ids (whole numbers, 0 or more)",
        ),
        ({"bad_words_ids": [[]]}, f"{GK}.bad_words_ids = [[]] is out of range: use a list of non-empty token-id lists"),
        (
            '{"typical_p": ',
            f"{GK} is text that is not JSON (Expecting value); write it as a mapping, e.g. {{no_repeat_ngram_size: 3}}",
        ),
        ("[1, 2]", f"{GK} must be a mapping of GenerationConfig settings, not list"),
    ],
)
def test_generation_kwargs_are_checked_before_any_work(generation_kwargs: object, message: str) -> None:
    from nodus.trainer.spec import check_combinations

    trl = {"generation_kwargs": generation_kwargs}
    job = load_job(None, {"spec.environment.name": "graph-coloring@1", "spec.parameters.trl": trl})
    with pytest.raises(InvalidJobSpec) as error:
        check_combinations(job)
    assert str(error.value) == message


def test_generation_kwargs_for_vllm_are_left_to_vllm() -> None:
    """With vLLM the mapping goes to SamplingParams, whose keys differ from GenerationConfig's."""
    from nodus.trainer.spec import check_combinations

    trl = {"use_vllm": True, "generation_kwargs": {"include_stop_str_in_output": True}}
    check_combinations(load_job(None, {"spec.environment.name": "graph-coloring@1", "spec.parameters.trl": trl}))


def test_every_field_of_the_spec_has_a_flag() -> None:
    """The issue's rule: every field of the job spec can be set from the command line (flags win)."""
    from nodus.trainer.spec import FIELD_FLAGS, FLAGS, MAPPING_FLAGS, TrainingJob
    from pydantic import BaseModel

    constants = {"apiVersion", "kind", "spec.runtime"}  # one allowed value each: nothing to set

    def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
        paths = []
        for name, field in model.model_fields.items():
            path = f"{prefix}{field.alias or name}"
            kind = field.annotation
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                paths += leaves(kind, path + ".")
            else:
                paths.append(path)
        return paths

    settable = set(leaves(TrainingJob)) - constants
    assert settable == set(FLAGS), f"without a flag: {sorted(settable - set(FLAGS))}"
    assert set(MAPPING_FLAGS) <= settable
    # The flag table and the CLI agree: every flag is an option of grpo train.
    from nodus.trainer.cli_train import train

    options = {opt for param in train.params for opt in param.opts}
    assert {"--" + name.replace("_", "-") for name in FIELD_FLAGS} | set(MAPPING_FLAGS.values()) <= options


@pytest.mark.parametrize(
    ("tasks", "generation_batch", "accumulation", "iterations", "epochs"),
    [
        (16, None, 1, 1, 1.0),
        (9, None, 2, 2, 2.5),  # a partial round dropped, and epochs that end mid-way
        (16, 16, 1, 2, 1.0),  # a round trained on over 4 batches
        (16, 16, 4, 1, 2.5),
        (9, 8, 4, 1, 2.5),  # 2 rounds a step, a partial step at each epoch's end
        (6, 8, 2, 2, 2.5),
    ],
)
def test_planned_steps_are_the_steps_transformers_plans_for_trl(
    tiny_model: Path,
    tmp_path: Path,
    tasks: int,
    generation_batch: int | None,
    accumulation: int,
    iterations: int,
    epochs: float,
) -> None:
    """The dry run's step count (and so its cost projection) against transformers' own plan for TRL's loader."""
    from datasets import Dataset
    from nodus.trainer.plan import planned_steps
    from trl import GRPOConfig, GRPOTrainer

    trl = {"gradient_accumulation_steps": accumulation, "num_iterations": iterations}
    job = load_job(None, {
        "spec.environment.name": "test/letters@1", "spec.environment.trainTasks": tasks, "spec.parameters.batchSize": 4,
        "spec.parameters.numGenerations": 2, "spec.parameters.epochs": epochs, "spec.parameters.trl": trl,
        **({"spec.parameters.generationBatchSize": generation_batch} if generation_batch else {}),
    })  # fmt: skip
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, num_train_epochs=epochs,
        use_cpu=True, report_to=[], max_completion_length=4, generation_batch_size=generation_batch, **trl,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=str(tiny_model), reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
        train_dataset=Dataset.from_list([{"prompt": f"p{i}"} for i in range(tasks)]),
    )  # fmt: skip
    planned_by_transformers = trainer.set_initial_training_values(args, trainer.get_train_dataloader())[-1]
    assert planned_steps(job) == planned_by_transformers


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"spec.parameters.generationBatchSize": 16, "spec.parameters.trl": {"steps_per_generation": 3}},
            "generationBatchSize and spec.parameters.trl.steps_per_generation both size a round of completions (TRL "
            "takes one or the other); remove one of them",
        ),
        (
            # 3 batches a round, 2 a step: a checkpoint or an epoch's end would fall inside a round.
            {"spec.parameters.generationBatchSize": 24, "spec.parameters.trl": {"gradient_accumulation_steps": 2}},
            "a round of completions is trained on in 3 batches (generationBatchSize / batchSize x num_iterations) "
            "and an optimizer step takes 2 (gradient_accumulation_steps): one must be a multiple of the other, so "
            "that steps, checkpoints and epochs end between rounds; change generationBatchSize, num_iterations or "
            "gradient_accumulation_steps",
        ),
    ],
)
def test_rounds_of_completions_that_cannot_line_up_with_steps_are_refused(
    overrides: dict[str, object], message: str
) -> None:
    from nodus.trainer.spec import check_combinations

    job = load_job(None, {"spec.environment.name": "graph-coloring@1", **overrides})
    with pytest.raises(InvalidJobSpec) as error:
        check_combinations(job)
    assert str(error.value) == message


def test_token_ids_are_checked_against_the_vocabulary_in_every_setting_that_names_them(tiny_model: Path) -> None:
    from nodus.trainer.generation_kwargs import vocabulary_problem

    config = tiny_model / "config.json"  # 507 tokens
    past = {
        "suppress_tokens": [3, 507],
        "bad_words_ids": [[3], [4, 600]],
        "forced_eos_token_id": [2, 9999],
        "sequence_bias": [[[9999], -2.0]],  # generate raised at the first sampling
    }
    for key, value in past.items():
        message = vocabulary_problem({"generation_kwargs": {key: value}}, config)
        assert message is not None and message.startswith(f"{GK}.{key} names token id "), key
    assert vocabulary_problem({"generation_kwargs": {"suppress_tokens": [506]}}, config) is None
    # vLLM takes its own keys, and JSON text that is not JSON is problem()'s to report: no traceback here.
    assert vocabulary_problem({"use_vllm": True, "generation_kwargs": '{"max_tokens: 5}'}, config) is None
    assert vocabulary_problem({"generation_kwargs": "{bad"}, config) is None
