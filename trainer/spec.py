"""The training job spec (``grpo train -f job.yaml``): its schema, defaults and validation.

Field names are the YAML's camelCase; every field also has a CLI flag (its kebab-case), and flags win. Every
validation message states the rule, why it exists, and how to fix the spec (the style of TRL's GRPOConfig).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from nodus.core.environment import (
    DEFAULT_HELD_OUT_TASKS,
    DEFAULT_TRAIN_TASKS,
    MAX_HELD_OUT_TASKS,
    MAX_SEED,
    MAX_TRAIN_TASKS,
)
from nodus.core.errors import NodusError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

API_VERSION: Final = "nodus.dev/v1beta1"
RUNTIME: Final = "nodus/grpo-lora"
DEFAULT_MODEL = "default"


class InvalidJobSpec(NodusError):
    """A job spec (file or flags) that fails validation."""


# Bounds that keep a typo from planning a run of years (the plan and the cost meter do arithmetic on them).
MAX_STEPS = 100_000_000
MAX_EPOCHS = 10_000


# TRL 1.x's GRPOConfig.loss_type values. TRL itself accepts any string and fails only at the first loss
# computation, after the baseline evaluation: checked here, a typo fails before any work.
LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"]


class _Strict(BaseModel):
    # inf is no setting anyone means (an infinite beta or number of epochs); nan fails every bound anyway.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, allow_inf_nan=False)


class ModelRef(_Strict):
    uri: str = Field(
        DEFAULT_MODEL,
        description="'default' (the embedded SmolLM2-135M-Instruct), a local directory, or hf://org/name@revision.",
    )

    @field_validator("uri")
    @classmethod
    def _local_folder_as_absolute_path(cls, uri: str) -> str:
        # A run directory compares specs as text: "tiny" and "/runs/tiny" from another directory are one model (and
        # "tiny" from two directories may be two), so a local folder is recorded as its absolute path.
        text = uri.strip()
        folder = Path(text).expanduser()
        if text in ("", DEFAULT_MODEL) or text.startswith("hf://") or not folder.exists():
            return uri  # a path that does not exist is reported as the user wrote it
        return str(folder.resolve())


class EnvironmentRef(_Strict):
    name: str = Field(description="Environment id, e.g. nodus/graph-coloring@1.")
    train_tasks: int = Field(DEFAULT_TRAIN_TASKS, alias="trainTasks", ge=1, le=MAX_TRAIN_TASKS)
    held_out_tasks: int = Field(DEFAULT_HELD_OUT_TASKS, alias="heldOutTasks", ge=1, le=MAX_HELD_OUT_TASKS)
    seed: int = Field(42, ge=0, le=MAX_SEED)
    params: dict[str, Any] = Field(default_factory=dict, description="The environment's own parameters.")


class LoraParams(_Strict):
    r: int = Field(8, ge=1, le=1024)
    alpha: int | None = Field(None, ge=1, description="Defaults to 2 * r.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)


class Parameters(_Strict):
    method: Literal["LoRA", "QLoRA", "Full"] = "LoRA"
    num_generations: int = Field(4, alias="numGenerations", ge=2, le=64)
    beta: float = Field(0.0, ge=0.0, description="KL penalty to the frozen reference; 0 loads no reference model.")
    max_completion_length: int = Field(64, alias="maxCompletionLength", ge=1, le=32768)
    lora: LoraParams = Field(default_factory=LoraParams)
    save_steps: int = Field(25, alias="saveSteps", ge=1, le=MAX_STEPS)
    batch_size: int = Field(
        8,
        alias="batchSize",
        ge=1,
        description="Completions per training batch; an optimizer step takes trl.gradient_accumulation_steps of them"
        " (default 1).",
    )
    generation_batch_size: int | None = Field(
        None, alias="generationBatchSize", ge=1, description="Completions per generation round; default batchSize."
    )
    learning_rate: float = Field(5e-5, alias="learningRate", gt=0.0, le=1.0)
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    epochs: float = Field(1.0, gt=0.0, le=MAX_EPOCHS)
    max_steps: int | None = Field(None, alias="maxSteps", ge=1, le=MAX_STEPS, description="Overrides epochs when set.")
    loss_type: LossType = Field("dapo", alias="lossType", description="TRL's loss_type (GRPOConfig).")
    eval_batch_size: int = Field(16, alias="evalBatchSize", ge=1)
    fast_path: Literal["auto", "on", "off"] = Field(
        "auto",
        alias="fastPath",
        description="Static-cache CUDA-graph rollouts and the written-out training forward, replayed as CUDA graphs"
        " on a GPU (nodus.trainer.fast_grpo); auto: on with a CUDA GPU, off on CPU.",
    )
    sft_warmup_steps: int = Field(
        0,
        alias="sftWarmupSteps",
        ge=0,
        description="Supervised steps on the train tasks' reference answers before GRPO (0: none). For a model whose"
        " every reward is the same (GRPO cannot learn from it) this teaches the answer format first.",
    )
    sft_learning_rate: float | None = Field(
        None, alias="sftLearningRate", gt=0.0, le=1.0, description="Default 2e-4 (LoRA, QLoRA) or 2e-5 (Full)."
    )
    trl: dict[str, Any] = Field(default_factory=dict, description="Any other GRPOConfig field, passed through.")

    @model_validator(mode="after")
    def _lora_settings_need_an_adapter(self) -> Parameters:
        if self.method == "Full" and self.lora != LoraParams():
            raise ValueError(
                "lora (--lora-r, --lora-alpha, --lora-dropout) applies to methods LoRA and QLoRA; method Full trains "
                "every weight and has no adapter, so remove the lora settings or use method LoRA"
            )
        return self

    @model_validator(mode="after")
    def _generation_batch_fits(self) -> Parameters:
        common = _lcm(self.batch_size, self.num_generations)
        if self.generation_batch_size is None and self.batch_size % self.num_generations:
            raise ValueError(
                f"batchSize={self.batch_size} must be a multiple of numGenerations ({self.num_generations}), because "
                "a generation round (batchSize completions unless generationBatchSize is set) holds whole groups; "
                f"change batchSize, or set generationBatchSize to a common multiple such as {common}"
            )
        size = self.generation_batch_size
        if size is not None and (size % self.num_generations or size % self.batch_size):
            raise ValueError(
                f"generationBatchSize={size} must be a multiple of both batchSize ({self.batch_size}) and "
                f"numGenerations ({self.num_generations}), because each generation round holds whole groups and "
                f"is split into whole training batches; use e.g. {common}"
            )
        return self

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        """trl.chat_template_kwargs (a mapping, or JSON text of one as TRL also takes), e.g. Qwen3's enable_thinking.
        TRL renders GRPO's prompts with them; evaluations and the SFT warm-up must render theirs the same way."""
        from nodus.trainer.generation_kwargs import trl_mapping

        return trl_mapping(self.trl.get("chat_template_kwargs")) or {}

    def trl_count(self, key: str) -> int | None:
        """A positive whole-number trl field (e.g. num_iterations), or None when unset (or not one: checked later)."""
        value = self.trl.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None

    @property
    def completions_per_round(self) -> int:
        """Completions TRL samples in one round: generationBatchSize, or a step's batches (batchSize x
        gradient_accumulation_steps, or x trl.steps_per_generation)."""
        if self.generation_batch_size is not None:
            return self.generation_batch_size
        steps = self.trl_count("steps_per_generation") or self.trl_count("gradient_accumulation_steps") or 1
        return self.batch_size * steps

    @property
    def micro_batches_per_round(self) -> int:
        """Batches of batchSize TRL trains on per round of completions (each round num_iterations times)."""
        return self.completions_per_round // self.batch_size * (self.trl_count("num_iterations") or 1)

    @property
    def steps_per_round(self) -> int:
        """Optimizer steps after which a round of sampled completions ends on a step boundary: a step takes
        gradient_accumulation_steps batches, and one is a multiple of the other (check_combinations). 1 unless
        generationBatchSize or those trl fields are set."""
        accumulation = self.trl_count("gradient_accumulation_steps") or 1
        return max(1, self.micro_batches_per_round // accumulation)

    @property
    def checkpoint_steps(self) -> int:
        """saveSteps rounded up to whole rounds: a resumed TRL run starts a new round at its first step, so a
        checkpoint inside a round would continue on another round than the run it resumes (some prompts trained
        twice, others never)."""
        rounds = self.steps_per_round
        return -(-self.save_steps // rounds) * rounds


class Distributed(_Strict):
    strategy: str | None = None
    processes: int | None = Field(
        None, ge=1, description="FSDP processes; default one per visible GPU (required on CPU, where it is for tests)."
    )

    @field_validator("strategy")
    @classmethod
    def _fsdp_only(cls, value: str | None) -> str | None:
        if value is None or value.upper() == "FSDP":
            return None if value is None else "FSDP"
        if "ZERO" in value.upper() or "DEEPSPEED" in value.upper():
            raise ValueError(
                f"strategy {value!r} (DeepSpeed ZeRO) is not supported: nodus shards with PyTorch FSDP through "
                "accelerate, which covers the same memory savings; use strategy: FSDP"
            )
        raise ValueError(f"unknown strategy {value!r}; use FSDP or leave it out for one device")


class Spec(_Strict):
    runtime: Literal["nodus/grpo-lora"] = RUNTIME
    model: ModelRef = Field(default_factory=ModelRef)
    environment: EnvironmentRef
    max_cost_usd: Decimal | None = Field(None, alias="maxCostUSD", ge=0)
    parameters: Parameters = Field(default_factory=Parameters)
    distributed: Distributed = Field(default_factory=Distributed)
    sandbox: Literal["nsjail", "none"] = "nsjail"
    sandbox_limits: dict[str, Any] = Field(
        default_factory=dict, alias="sandboxLimits", description="Overrides of the grader's sandbox limits."
    )


class Metadata(_Strict):
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)


class TrainingJob(_Strict):
    api_version: Literal["nodus.dev/v1beta1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["TrainingJob"] = "TrainingJob"
    metadata: Metadata = Field(default_factory=Metadata)
    spec: Spec

    @property
    def name(self) -> str:
        env = self.spec.environment
        return self.metadata.name or f"{env.name.split('/')[-1].replace('@', '-v')}-seed{env.seed}"

    def canonical(self) -> dict[str, Any]:
        """The resolved spec as JSON-able camelCase, the form saved with a run and compared on resume."""
        return self.model_dump(mode="json", by_alias=True)


def with_current_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """A job.json saved by an older nodus, completed with the fields added since at their defaults (which keep the
    old behaviour), so that upgrading nodus does not make a run directory refuse its own spec on resume."""
    try:
        return TrainingJob.model_validate(saved).canonical()
    except ValidationError:
        return saved  # not a spec this version reads: compared as it is, and the difference named


# Every field's CLI flag (flags win over the file) and the Python API keyword: name -> (dotted camelCase path, type).
# Mappings have KEY=VALUE flags of their own (--param, --limit, --trl). The messages name a field by its flag.
FIELD_FLAGS: dict[str, tuple[str, type]] = {
    "model": ("spec.model.uri", str),
    "env": ("spec.environment.name", str),
    "train_tasks": ("spec.environment.trainTasks", int),
    "held_out_tasks": ("spec.environment.heldOutTasks", int),
    "seed": ("spec.environment.seed", int),
    "max_cost_usd": ("spec.maxCostUSD", str),
    "num_generations": ("spec.parameters.numGenerations", int),
    "beta": ("spec.parameters.beta", float),
    "max_completion_length": ("spec.parameters.maxCompletionLength", int),
    "lora_r": ("spec.parameters.lora.r", int),
    "lora_alpha": ("spec.parameters.lora.alpha", int),
    "lora_dropout": ("spec.parameters.lora.dropout", float),
    "method": ("spec.parameters.method", str),
    "save_steps": ("spec.parameters.saveSteps", int),
    "max_steps": ("spec.parameters.maxSteps", int),
    "epochs": ("spec.parameters.epochs", float),
    "batch_size": ("spec.parameters.batchSize", int),
    "generation_batch_size": ("spec.parameters.generationBatchSize", int),
    "eval_batch_size": ("spec.parameters.evalBatchSize", int),
    "learning_rate": ("spec.parameters.learningRate", float),
    "temperature": ("spec.parameters.temperature", float),
    "loss_type": ("spec.parameters.lossType", str),
    "fast_path": ("spec.parameters.fastPath", str),
    "sft_warmup_steps": ("spec.parameters.sftWarmupSteps", int),
    "sft_learning_rate": ("spec.parameters.sftLearningRate", float),
    "distributed_strategy": ("spec.distributed.strategy", str),
    "distributed_processes": ("spec.distributed.processes", int),
    "sandbox": ("spec.sandbox", str),
    "name": ("metadata.name", str),
}
MAPPING_FLAGS = {"spec.environment.params": "--param", "spec.sandboxLimits": "--limit", "spec.parameters.trl": "--trl"}
FLAGS: dict[str, str] = {
    **{path: "--" + name.replace("_", "-") for name, (path, _) in FIELD_FLAGS.items()},
    **MAPPING_FLAGS,
}


def load_job(path: Path | None, overrides: dict[str, Any]) -> TrainingJob:
    """The job from ``path`` (YAML) with ``overrides`` (dotted camelCase paths from flags) applied on top."""
    document: dict[str, Any] = {}
    source = str(path) if path else "flags"
    if path is not None:
        document = _read_yaml(path)
    for dotted, value in overrides.items():
        if value is not None:
            _set_path(document, dotted.split("."), value, source)
    spec = document.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise InvalidJobSpec(f"invalid job spec ({source}): spec = {spec!r}: {NOT_A_MAPPING}")
    if "environment" not in spec:
        raise InvalidJobSpec(
            "no environment given: pass --env ID (e.g. --env graph-coloring@1) or set spec.environment.name"
        )
    try:
        return TrainingJob.model_validate(document)
    except ValidationError as error:
        raise InvalidJobSpec(_one_line(error, source=source)) from None


NOT_A_MAPPING = "must be a mapping of key: value lines"


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type hints
    """safe_load that refuses a key given twice in one mapping (plain YAML keeps the last one, silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice; keep one", key_node.start_mark
                )
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InvalidJobSpec(f"cannot read job file {path}: {error.strerror}; check the path given to -f") from None
    except UnicodeDecodeError as error:
        raise InvalidJobSpec(f"job file {path} is not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidJobSpec(f"job file {path} is not valid YAML{where}: {getattr(error, 'problem', error)}") from None
    if not isinstance(document, dict):
        raise InvalidJobSpec(f"job file {path} must be a YAML mapping with apiVersion, kind and spec")
    return document


def _set_path(document: dict[str, Any], keys: list[str], value: Any, source: str) -> None:
    """Set a flag's value in the document; a mapping flag (--param, --limit, --trl) merges into the file's mapping,
    key by key, so that --param num_colors=4 does not drop the file's other parameters."""
    node = document
    for depth, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            where = ".".join(keys[: depth + 1])
            raise InvalidJobSpec(f"invalid job spec ({source}): {where} = {child!r}: {NOT_A_MAPPING}")
        node = child
    existing = node.get(keys[-1])
    if isinstance(value, dict) and isinstance(existing, dict):
        value = {**existing, **value}
    node[keys[-1]] = value


def _one_line(error: ValidationError, source: str) -> str:
    first = error.errors()[0]
    loc = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    flag = FLAGS.get(loc)
    where = f"{loc} ({flag})" if flag else loc or "the job"
    if first["type"] == "extra_forbidden":
        parent, _, key = loc.rpartition(".")
        model = _model_at(parent)
        known = sorted(f.alias or name for name, f in model.model_fields.items()) if model else []
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"invalid job spec ({source}): unknown field {loc!r}; {hint}allowed here: {', '.join(known)}"
    if first["type"] == "missing":
        return f"invalid job spec ({source}): {where} is required"
    value = first.get("input")
    shown = f" = {value!r}" if first["loc"] and not isinstance(value, dict) else ""
    fix = _fix_for(first["type"], first.get("ctx") or {}, loc, value)
    return f"invalid job spec ({source}): {where}{shown}: {message}" + (f"; {fix}" if fix else "")


def _fix_for(kind: str, ctx: dict[str, Any], loc: str, value: Any) -> str:
    """How to fix a value pydantic rejected with its own message (ours carry their fix already)."""
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        same = [a for a in allowed if a.lower() == str(value).lower()]
        close = same or difflib.get_close_matches(str(value), allowed, n=1)
        return f"did you mean {close[0]!r}?" if close else "use one of these"
    if loc == "metadata.name" and kind == "string_pattern_mismatch":
        return "use letters, digits, '.', '_' and '-', starting with a letter or digit, e.g. my-grpo-run"
    bounds = {
        "greater_than_equal": ("use {} or more", "ge"),
        "greater_than": ("use a value above {}", "gt"),
        "less_than_equal": ("use {} or less", "le"),
        "less_than": ("use a value below {}", "lt"),
        "string_too_long": ("use at most {} characters", "max_length"),
    }
    if kind in bounds:
        text, key = bounds[kind]
        return text.format(ctx.get(key))
    by_kind = {
        "int_parsing": "use a whole number",
        "int_type": "use a whole number",
        "int_from_float": "use a whole number",
        "float_parsing": "use a number, e.g. 0.5",
        "float_type": "use a number, e.g. 0.5",
        "finite_number": "use a finite number",
        "decimal_parsing": 'write an amount in US dollars, e.g. "5.00"',
        "decimal_type": 'write an amount in US dollars, e.g. "5.00"',
        "bool_parsing": "use true or false",
        "dict_type": "write a mapping of key: value lines",
        "model_type": "write a mapping of key: value lines",
        "string_type": "write it as text (quote it in YAML)",
    }
    return by_kind.get(kind, "")


def _model_at(dotted: str) -> type[BaseModel] | None:
    model: type[BaseModel] = TrainingJob
    for key in filter(None, dotted.split(".")):
        field = next((f for n, f in model.model_fields.items() if key in (n, f.alias)), None)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _lcm(a: int, b: int) -> int:
    return math.lcm(a, b)


# GRPOConfig fields that the spec sets: through spec.parameters.trl they would skip the spec's checks (or break
# the run directory's checkpoints), so they are set where the spec has them.
TRL_FIELDS_OWNED = {
    "per_device_train_batch_size": "spec.parameters.batchSize",
    "num_generations": "spec.parameters.numGenerations",
    "max_completion_length": "spec.parameters.maxCompletionLength",
    "beta": "spec.parameters.beta",
    "learning_rate": "spec.parameters.learningRate",
    "temperature": "spec.parameters.temperature",
    "num_train_epochs": "spec.parameters.epochs",
    "max_steps": "spec.parameters.maxSteps",
    "loss_type": "spec.parameters.lossType",
    "save_steps": "spec.parameters.saveSteps",
    "generation_batch_size": "spec.parameters.generationBatchSize",
    "seed": "spec.environment.seed",
    "report_to": "grpo train --tensorboard",
    "output_dir": "grpo train --output",
    "save_strategy": "nodus (checkpoints every saveSteps are how a run resumes)",
    "save_total_limit": "nodus (checkpoints every saveSteps are how a run resumes)",
    # TRL is given no eval dataset (it failed after the baseline evaluation): held-out tasks are nodus' own.
    "eval_strategy": "nodus (the baseline and final evaluations on the held-out tasks)",
    "eval_on_start": "nodus (the baseline and final evaluations on the held-out tasks)",
}


def check_trl_fields(parameters: Parameters, config_cls: Any = None) -> None:
    """spec.parameters.trl passes fields to TRL's GRPOConfig: a misspelt one is an error, not silently ignored."""
    if not parameters.trl:
        return  # nothing to check, and no reason to import TRL (the dry run works without the training extras)
    for key in parameters.trl:
        if key in TRL_FIELDS_OWNED:
            owner = TRL_FIELDS_OWNED[key]
            where = f"{owner} ({FLAGS[owner]})" if owner in FLAGS else owner
            raise InvalidJobSpec(f"spec.parameters.trl.{key} is set by {where}; set it there, not through trl")
    if config_cls is None:
        try:
            from trl import GRPOConfig
        except ImportError as error:
            raise InvalidJobSpec(
                f"spec.parameters.trl needs TRL to check its fields ({error.name} is missing): "
                "pip install 'nodus[train]'"
            ) from None
        config_cls = GRPOConfig
    known = {f.name for f in dataclasses.fields(config_cls)}
    for key in parameters.trl:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise InvalidJobSpec(f"spec.parameters.trl.{key} is not a GRPOConfig field; {hint}see TRL's GRPOConfig")
    check_trl_values(parameters.trl, config_cls)


# Ranges GRPOConfig does not check itself: out of range, these fail (or silently sample something else) only when
# the first completions are generated, after the baseline evaluation.
TRL_VALUE_RANGES: dict[str, tuple[Any, str]] = {
    "top_p": (lambda v: 0 < v <= 1, "a probability mass above 0 and at most 1 (1.0 keeps every token)"),
    "min_p": (lambda v: v is None or 0 <= v <= 1, "a probability from 0 to 1, or null (off)"),
    "top_k": (lambda v: v is None or v >= 0, "0 (off) or a number of tokens"),
    "repetition_penalty": (lambda v: v > 0, "a value above 0 (1.0 is off)"),
    "num_iterations": (lambda v: v >= 1, "1 or more updates per generation round"),
    "gradient_accumulation_steps": (lambda v: v >= 1, "1 or more"),
    "epsilon": (lambda v: v >= 0, "0 or more (the clipping range)"),
    "epsilon_high": (lambda v: v is None or v >= 0, "0 or more, or null (= epsilon)"),
}


def check_trl_values(values: dict[str, Any], config_cls: Any) -> None:
    """Each spec.parameters.trl value against its GRPOConfig field's type (strictly: "abc" is not a float, 5.0 not
    an int, 1 not a bool) and, for the fields above, its range. TRL checks neither."""
    from pydantic import TypeAdapter

    hints = typing.get_type_hints(config_cls)
    for key, value in values.items():
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(
                hints[key], config=ConfigDict(strict=True, allow_inf_nan=False, arbitrary_types_allowed=True)
            )
        except Exception:  # a field type pydantic cannot describe: TRL's own checks are all there is
            continue
        try:
            checked = adapter.validate_python(value)
        except ValidationError as error:
            rule = error.errors()[0]["msg"]
            raise InvalidJobSpec(
                f"spec.parameters.trl.{key} = {value!r}: {rule} (GRPOConfig's {key} is {_type_name(hints[key])}); "
                "fix the value (in YAML, quote text and leave numbers unquoted)"
            ) from None
        in_range, what = TRL_VALUE_RANGES.get(key, (None, ""))
        if in_range is not None and not in_range(checked):
            raise InvalidJobSpec(f"spec.parameters.trl.{key} = {value!r} is out of range: use {what}")
    if values.get("generation_kwargs") is not None and not values.get("use_vllm"):
        from nodus.trainer import generation_kwargs  # transformers' GenerationConfig: imported only when needed

        message = generation_kwargs.problem(values["generation_kwargs"])
        if message is not None:
            raise InvalidJobSpec(message)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def check_combinations(job: TrainingJob, function_environment: bool = False) -> None:
    """Settings that are valid one by one but that this version cannot run together; needs no device, so the dry
    run applies it too (the device checks, a GPU for QLoRA or for FSDP, come when the run starts)."""
    parameters = job.spec.parameters
    check_trl_fields(parameters)
    if parameters.generation_batch_size is not None and parameters.trl_count("steps_per_generation"):
        raise InvalidJobSpec(
            "generationBatchSize and spec.parameters.trl.steps_per_generation both size a round of completions "
            "(TRL takes one or the other); remove one of them"
        )
    micro, accumulation = parameters.micro_batches_per_round, parameters.trl_count("gradient_accumulation_steps") or 1
    if micro % accumulation and accumulation % micro:
        raise InvalidJobSpec(
            f"a round of completions is trained on in {micro} batches (generationBatchSize / batchSize x "
            f"num_iterations) and an optimizer step takes {accumulation} (gradient_accumulation_steps): one must be "
            "a multiple of the other, so that steps, checkpoints and epochs end between rounds; change "
            "generationBatchSize, num_iterations or gradient_accumulation_steps"
        )
    prompts = parameters.completions_per_round // parameters.num_generations
    if job.spec.environment.train_tasks < prompts:
        raise InvalidJobSpec(
            f"trainTasks={job.spec.environment.train_tasks} is fewer than the {prompts} prompts of one round of "
            f"completions ({parameters.completions_per_round} completions / numGenerations "
            f"{parameters.num_generations}), so training would take no step; use at least {prompts} train tasks "
            "(--train-tasks) or a smaller batchSize"
        )
    if job.spec.distributed.strategy == "FSDP":
        if job.spec.distributed.processes is not None:
            check_fsdp_share(parameters.batch_size, job.spec.distributed.processes, "process")
        unsupported = {
            parameters.method == "QLoRA": "method QLoRA (4-bit weights need FSDP's quantized storage settings)",
            parameters.sft_warmup_steps > 0: "sftWarmupSteps",
            function_environment: "a Python function environment (the other processes cannot import it)",
        }
        for refused, what in unsupported.items():
            if refused:
                raise InvalidJobSpec(
                    f"distributed.strategy FSDP does not support {what} in this version; train on one device "
                    "(remove spec.distributed) or change that setting"
                )
    if parameters.sft_warmup_steps and parameters.beta > 0:
        raise InvalidJobSpec(
            "sftWarmupSteps with beta > 0 is not supported in this version: the KL reference would be the warmed-up "
            "model in one attempt and the base model after a resume; use beta 0 (the default) with a warm-up"
        )


def check_cost_cap_rate(job: TrainingJob, has_rate: bool) -> None:
    """A cost cap is spend measured against an hourly rate: without one it could never stop anything."""
    if job.spec.max_cost_usd is not None and not has_rate:
        raise InvalidJobSpec(
            "maxCostUSD needs an hourly rate to measure spend against: pass --gpu NAME (see 'grpo estimate --help') "
            "or --gpu-rate USD_PER_HOUR"
        )


def check_fsdp_share(batch: int, processes: int, unit: str) -> None:
    """Each FSDP process trains on an equal share of a step's completions, and one process is not FSDP."""
    if batch % processes:
        raise InvalidJobSpec(
            f"batchSize={batch} must be a multiple of the {processes} FSDP processes, because each process trains "
            f"on an equal share of a step's completions; change batchSize or distributed.processes"
        )
    if processes < 2:
        raise InvalidJobSpec(
            f"distributed.strategy FSDP needs at least 2 processes ({processes} {unit} here): remove "
            "spec.distributed to train on one device"
        )
