"""GPU memory estimate of a GRPO job (LoRA, QLoRA or full fine-tuning), from the model's ``config.json`` alone.

The estimate is a sum of terms a user can check by hand, each a count of parameters or tokens times bytes per item:

* frozen base weights: 2 bytes per parameter at 16 bit; with QLoRA the linear projections of every decoder layer are
  NF4 (4 bit plus quantization constants) while embeddings, ``lm_head`` and norms stay 16 bit;
* trained state: 16 bytes per trained parameter (mixed-precision Adam, see ``ADAM_MIXED_PRECISION_BYTES_PER_PARAM``);
* the reference model, when ``beta > 0`` (see ``reference_model_bytes`` for the rule);
* the KV cache of one group's generation.

Not counted, on purpose, because they depend on kernels and batch slicing rather than on the model's shape:
activations, logits, the CUDA context and the caching allocator's overhead. The total is therefore a floor, not a
promise; ``nodus.trainer.pricing.fits`` compares it with a GPU's memory.

Parameter counting follows the Llama/Qwen decoder layout (what ``transformers`` builds for ``llama``, ``mistral``,
``qwen2`` and ``qwen3``): embeddings, per layer q/k/v/o attention projections (plus Qwen3's per-head q_norm/k_norm),
a gated MLP (gate, up, down) and two RMSNorms, a final norm, and an ``lm_head`` unless tied to the embeddings.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from nodus.core.errors import NodusError

BYTES_16BIT = 2

# Mixed-precision Adam as accounted in the ZeRO paper (Rajbhandari et al., 2020, section 3.1): 16-bit weights and
# gradients (2 + 2 bytes) plus fp32 master weights, momentum and variance (4 + 4 + 4 bytes) per trained parameter.
ADAM_MIXED_PRECISION_BYTES_PER_PARAM = 16

# bitsandbytes NF4 with double quantization (``bnb_4bit_use_double_quant=True``), which our QLoRA recipe uses:
# * the weights: 4 bits each, two packed per byte;
# * first level: one absmax per block of 64 weights, itself quantized to 8 bits (``compress_statistics``);
# * second level: those 8-bit absmax values are quantized blockwise in blocks of 256, each with an fp32 absmax;
# * one fp32 offset (the mean of the first-level absmax values) per tensor.
# Per weight that is 8/64 + 32/(64 * 256) = 0.125 + 0.001953125 = 0.126953125 bits of constants, i.e. 4.127 bits
# (0.5159 byte) in all. The 16-entry NF4 code (64 bytes per tensor) and the 256-entry dynamic code shared by all
# tensors are left out: a few kilobytes for a whole model.
NF4_BLOCKSIZE = 64
NF4_NESTED_BLOCKSIZE = 256
NF4_CONSTANT_BITS_PER_PARAM = 8 / NF4_BLOCKSIZE + 32 / (NF4_BLOCKSIZE * NF4_NESTED_BLOCKSIZE)
FP32_BYTES = 4

# Model types whose attention applies an RMSNorm of size head_dim to the queries and to the keys (q_norm, k_norm).
QK_NORM_MODEL_TYPES = frozenset({"qwen3"})
# Model types counted with the layout described in the module docstring; others are counted the same way with a note.
KNOWN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# Keys by which a config declares a mixture of experts, whose MLP this estimator does not model.
MIXTURE_OF_EXPERTS_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")

LORA_TARGET_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_LORA_R = 8

MODEL_SOURCE_HINT = "pass a config.json path, a directory containing config.json, or hf://org/name@revision"
HF_MODEL_PATTERN = re.compile(r"^hf://(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^\s@]+))?$")


class ModelConfigError(NodusError):
    """The model given to the estimator cannot be found or is not a model config it can read."""


class EstimateInputError(NodusError):
    """A job setting given to the estimator is out of range or unknown."""


class Method(StrEnum):
    LORA = "LoRA"
    QLORA = "QLoRA"
    FULL = "Full"


def parse_method(text: str) -> Method:
    """``LoRA``, ``QLoRA`` or ``Full``, in any case."""
    for method in Method:
        if text.strip().lower() == method.value.lower():
            return method
    choices = ", ".join(method.value for method in Method)
    raise EstimateInputError(f"unknown method {text!r}; choose one of {choices}")


# --- the model's shape ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a decoder-only model's ``config.json``."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qk_norm: bool
    attention_bias: bool
    mlp_bias: bool

    def projection_dims(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of every linear projection of one decoder layer."""
        hidden, inter = self.hidden_size, self.intermediate_size
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        return {
            "q_proj": (hidden, q_width),
            "k_proj": (hidden, kv_width),
            "v_proj": (hidden, kv_width),
            "o_proj": (q_width, hidden),
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }


def model_shape_from_config(config: Mapping[str, Any], name: str) -> ModelShape:
    """Read a Hugging Face ``config.json`` (already parsed); ``name`` says where it came from, for messages."""
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"{name} is not a model config: expected a JSON object; {MODEL_SOURCE_HINT}")
    # Multimodal configs (e.g. Gemma 3, Llama 4) keep the language model's shape under text_config.
    text_config = config.get("text_config")
    if "hidden_size" not in config and isinstance(text_config, Mapping):
        config = text_config
    required = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    missing = [key for key in required if key not in config]
    if missing:
        raise ModelConfigError(
            f"{name} is not a model config: it lacks {', '.join(missing)}; "
            "expected a Hugging Face config.json of a decoder-only language model"
        )
    for key in MIXTURE_OF_EXPERTS_KEYS:
        if config.get(key):
            raise ModelConfigError(
                f"{name} describes a mixture-of-experts model ({key}={config[key]}), which the estimator does not "
                "model; estimate a dense model of similar size instead"
            )

    def positive_int(key: str, default: int | None = None) -> int:
        value = config.get(key)
        if value is None:  # absent or an explicit null: the default, as transformers reads it
            value = default
        # bool is an int subclass; true/false in a size field is a broken config, not 1/0.
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelConfigError(f"{name}: {key} must be a positive integer, got {json.dumps(value)}")
        return value

    hidden = positive_int("hidden_size")
    heads = positive_int("num_attention_heads")
    kv_heads = positive_int("num_key_value_heads", default=heads)  # absent: multi-head attention, one KV per head
    if config.get("head_dim") is not None:
        head_dim = positive_int("head_dim")
    elif hidden % heads == 0:
        head_dim = hidden // heads
    else:
        raise ModelConfigError(
            f"{name}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} and head_dim is not given"
        )
    model_type = str(config.get("model_type", "unknown"))
    # Qwen2 hard-codes biases on q, k and v (not o) and has no attention_bias key; Llama-style configs declare it.
    attention_bias = bool(config.get("attention_bias", model_type == "qwen2"))
    return ModelShape(
        name=name,
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=positive_int("intermediate_size"),
        num_layers=positive_int("num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=positive_int("vocab_size"),
        # LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config all default to untied embeddings.
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qk_norm=model_type in QK_NORM_MODEL_TYPES,
        attention_bias=attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)),
    )


def read_config_file(path: Path, name: str) -> ModelShape:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ModelConfigError(f"cannot read {name}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ModelConfigError(f"{name} is not UTF-8 text (byte {error.start}); {MODEL_SOURCE_HINT}") from None
    try:
        config = json.loads(text)
    except ValueError as error:
        raise ModelConfigError(f"{name} is not valid JSON ({error}); {MODEL_SOURCE_HINT}") from None
    return model_shape_from_config(config, name)


def load_model_shape(model: str, *, hf_cache_dir: Path | None = None) -> ModelShape:
    """The shape of ``model``: a ``config.json`` path, a directory holding one, or ``hf://org/name[@revision]``.

    ``hf://`` reads ``config.json`` from the local Hugging Face cache only (``hf_cache_dir``, else the default cache):
    an estimate must work offline, and downloading is a separate, explicit step.
    """
    if model.startswith("hf://"):
        return load_from_hf_cache(model, hf_cache_dir)
    path = Path(model).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelConfigError(f"directory {model} has no config.json; {MODEL_SOURCE_HINT}")
        return read_config_file(config_path, str(config_path))
    if not path.exists():
        raise ModelConfigError(f"model config not found: {model}; {MODEL_SOURCE_HINT}")
    return read_config_file(path, model)


def load_from_hf_cache(model: str, hf_cache_dir: Path | None) -> ModelShape:
    match = HF_MODEL_PATTERN.match(model)
    if match is None:
        raise ModelConfigError(f"{model!r} is not of the form hf://org/name@revision")
    repo, revision = match["repo"], match["revision"]
    download = f"hf download {repo}" + (f" --revision {revision}" if revision else "") + " config.json"
    how_to_get_it = f"run `{download}` on a machine with access, or pass a local config.json"
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        raise ModelConfigError(
            f"cannot read {model} from the Hugging Face cache: huggingface_hub is not installed; "
            f"pip install huggingface_hub, or {how_to_get_it}"
        ) from None
    found = try_to_load_from_cache(repo, "config.json", cache_dir=hf_cache_dir, revision=revision)
    # A str is the cached file; None means never fetched, a sentinel object means "known not to exist upstream".
    if not isinstance(found, str):
        raise ModelConfigError(f"config.json of {model} is not in the local Hugging Face cache; {how_to_get_it}")
    return read_config_file(Path(found), model)


# --- parameter counts -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParameterCount:
    """Parameters of a model by part; ``total`` counts a tied ``lm_head`` once."""

    embedding: int
    lm_head: int
    attention: int  # all layers: projections, their biases, q_norm/k_norm
    mlp: int  # all layers: gate, up, down and their biases
    norms: int  # all layers' two RMSNorms and the final norm
    quantizable_linear: int  # weights of the q..down projections, which QLoRA stores in NF4

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.attention + self.mlp + self.norms

    @property
    def non_embedding(self) -> int:
        """As model cards count it: without the input embeddings and without ``lm_head``."""
        return self.total - self.embedding - self.lm_head


def count_parameters(shape: ModelShape) -> ParameterCount:
    dims = shape.projection_dims()
    attention_names = ("q_proj", "k_proj", "v_proj", "o_proj")
    mlp_names = ("gate_proj", "up_proj", "down_proj")
    attention_weights = sum(dims[n][0] * dims[n][1] for n in attention_names)
    # Qwen2 puts biases on q, k and v only; Llama/Qwen3 with attention_bias put them on all four.
    biased = ("q_proj", "k_proj", "v_proj") if shape.model_type == "qwen2" else attention_names
    attention_biases = sum(dims[n][1] for n in biased) if shape.attention_bias else 0
    qk_norms = 2 * shape.head_dim if shape.qk_norm else 0
    mlp_weights = sum(dims[n][0] * dims[n][1] for n in mlp_names)
    mlp_biases = sum(dims[n][1] for n in mlp_names) if shape.mlp_bias else 0
    embedding = shape.vocab_size * shape.hidden_size
    return ParameterCount(
        embedding=embedding,
        lm_head=0 if shape.tie_word_embeddings else embedding,
        attention=shape.num_layers * (attention_weights + attention_biases + qk_norms),
        mlp=shape.num_layers * (mlp_weights + mlp_biases),
        norms=shape.num_layers * 2 * shape.hidden_size + shape.hidden_size,
        quantizable_linear=shape.num_layers * (attention_weights + mlp_weights),
    )


def lora_parameter_count(shape: ModelShape, rank: int) -> int:
    """rank × (in + out) for every targeted projection of every layer: A is rank × in, B is out × rank."""
    dims = shape.projection_dims()
    return shape.num_layers * sum(rank * (dims[n][0] + dims[n][1]) for n in LORA_TARGET_PROJECTIONS)


def nf4_constant_bytes(numel: int) -> int:
    """Quantization constants of one NF4 tensor with double quantization (see ``NF4_CONSTANT_BITS_PER_PARAM``).

    Counted per tensor because blocks do not span tensors: 8-bit absmax per block, fp32 absmax per 256 blocks, and
    one fp32 offset.
    """
    blocks = math.ceil(numel / NF4_BLOCKSIZE)
    nested_blocks = math.ceil(blocks / NF4_NESTED_BLOCKSIZE)
    return blocks + nested_blocks * FP32_BYTES + FP32_BYTES


def nf4_linear_bytes(shape: ModelShape) -> tuple[int, int]:
    """(packed 4-bit weights, quantization constants) in bytes, over all decoder projections."""
    sizes = [fan_in * fan_out for fan_in, fan_out in shape.projection_dims().values()]
    packed = shape.num_layers * sum(math.ceil(numel / 2) for numel in sizes)
    constants = shape.num_layers * sum(nf4_constant_bytes(numel) for numel in sizes)
    return packed, constants


def kv_cache_bytes_per_token(shape: ModelShape) -> int:
    """Keys and values (2) × layers × KV heads × head dim × 2 bytes (16 bit)."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * BYTES_16BIT


# --- the estimate ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSettings:
    """The job settings that move memory; defaults are nodus's default GRPO job."""

    method: Method
    lora_r: int = DEFAULT_LORA_R
    beta: float = 0.0
    num_generations: int = 4
    max_completion_length: int = 64
    prompt_length: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.method, Method):
            raise EstimateInputError(f"unknown method {self.method!r}; choose one of LoRA, QLoRA, Full")
        if self.lora_r < 1:
            raise EstimateInputError(f"--lora-r must be at least 1, got {self.lora_r}")
        if not self.beta >= 0:  # also rejects NaN
            raise EstimateInputError(f"--beta must be 0 or more, got {self.beta}")
        if self.num_generations < 2:
            # TRL refuses it too: a group of one has no spread to compute an advantage from.
            raise EstimateInputError(f"--num-generations must be at least 2 for GRPO, got {self.num_generations}")
        if self.max_completion_length < 1:
            raise EstimateInputError(f"--max-completion-length must be at least 1, got {self.max_completion_length}")
        if self.prompt_length < 1:
            raise EstimateInputError(f"--prompt-length must be at least 1, got {self.prompt_length}")

    @property
    def tokens_per_group(self) -> int:
        return self.num_generations * (self.prompt_length + self.max_completion_length)


@dataclass(frozen=True)
class MemoryTerm:
    key: str  # stable name, used as the JSON key
    label: str  # what the table shows
    bytes: int
    detail: str  # the arithmetic, so a reader can check it


@dataclass(frozen=True)
class MemoryEstimate:
    model: ModelShape
    settings: JobSettings
    parameters: ParameterCount
    trained_parameters: int
    terms: tuple[MemoryTerm, ...]
    notes: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return sum(term.bytes for term in self.terms)

    @property
    def frozen_weight_bytes(self) -> int:
        """The loaded base model alone (16-bit plus NF4 parts), what ``torch.cuda.memory_allocated`` shows after load.

        Calibration: for the Qwen3-8B shape in NF4 this gives 6.073 GB against 6.09 GB measured on an H200 after
        loading (a flat 0.5 byte per parameter would say 4.1 GB). The -0.3% rest is small per-tensor state we leave
        out (NF4 code tables, rotary buffers) and allocator rounding; the CUDA context (several hundred MB, outside
        the allocator) is not counted anywhere in this estimate.
        """
        return self.term("frozen_16bit_weights").bytes + self.term("frozen_nf4_weights").bytes

    def term(self, key: str) -> MemoryTerm:
        for term in self.terms:
            if term.key == key:
                return term
        raise KeyError(key)

    def as_json(self) -> dict[str, Any]:
        settings = self.settings
        return {
            "model": self.model.name,
            "method": settings.method.value,
            "lora_r": settings.lora_r if settings.method is not Method.FULL else None,
            "beta": settings.beta,
            "num_generations": settings.num_generations,
            "prompt_length": settings.prompt_length,
            "max_completion_length": settings.max_completion_length,
            "total_parameters": self.parameters.total,
            "trained_parameters": self.trained_parameters,
            "terms_bytes": {term.key: term.bytes for term in self.terms},
            "total_bytes": self.total_bytes,
            "not_counted": list(NOT_COUNTED),
            "notes": list(self.notes),
        }


NOT_COUNTED = ("activations", "logits", "CUDA context", "allocator overhead")


def reference_model_bytes(shape: ModelShape, parameters: ParameterCount, settings: JobSettings) -> MemoryTerm:
    """The reference policy for the KL term, following TRL's ``GRPOTrainer``.

    * ``beta == 0``: no KL term, so no reference model is created: 0 bytes.
    * ``beta > 0`` with LoRA or QLoRA: TRL computes reference log-probs with the same peft model with its adapters
      disabled (the base weights are the initial policy), so no extra copy: 0 bytes.
    * ``beta > 0`` with Full: a second copy of the model is loaded in 16 bit: 2 bytes per parameter.
    """
    key, label = "reference_model", "reference model"
    if settings.beta == 0:
        return MemoryTerm(key, label, 0, "none: beta is 0, no KL term")
    if settings.method is not Method.FULL:
        return MemoryTerm(key, label, 0, f"none: {settings.method.value} uses the base with adapters disabled")
    return MemoryTerm(
        key, label, parameters.total * BYTES_16BIT, f"{parameters.total:,} params × {BYTES_16BIT} bytes (16 bit copy)"
    )


def estimate_memory(shape: ModelShape, settings: JobSettings) -> MemoryEstimate:
    parameters = count_parameters(shape)
    notes: list[str] = []
    if shape.model_type not in KNOWN_MODEL_TYPES:
        notes.append(f"model_type {shape.model_type!r} is counted with the Llama/Qwen decoder layout")

    if settings.method is Method.FULL:
        trained = parameters.total
        frozen_16bit = MemoryTerm("frozen_16bit_weights", "frozen 16-bit weights", 0, "none: every parameter trains")
        frozen_nf4 = MemoryTerm("frozen_nf4_weights", "frozen NF4 weights", 0, "none: not quantized")
    else:
        trained = lora_parameter_count(shape, settings.lora_r)
        if settings.method is Method.QLORA:
            # bitsandbytes quantizes the decoder's nn.Linear layers; it skips lm_head (and the embedding is not a
            # Linear), so those and the norms (and any projection biases) stay 16 bit.
            sixteen_bit = parameters.total - parameters.quantizable_linear
            packed, constants = nf4_linear_bytes(shape)
            frozen_nf4 = MemoryTerm(
                "frozen_nf4_weights",
                "frozen NF4 weights",
                packed + constants,
                f"{parameters.quantizable_linear:,} params × 0.5 byte + {constants:,} bytes of quantization constants",
            )
            what = "embeddings, lm_head, norms" if not shape.tie_word_embeddings else "tied embeddings/lm_head, norms"
            frozen_16bit = MemoryTerm(
                "frozen_16bit_weights",
                "frozen 16-bit weights",
                sixteen_bit * BYTES_16BIT,
                f"{sixteen_bit:,} params ({what}) × {BYTES_16BIT} bytes",
            )
            notes.append(
                "QLoRA assumes bitsandbytes NF4 with double quantization (bnb_4bit_use_double_quant=True), "
                f"blocksize {NF4_BLOCKSIZE}"
            )
        else:
            frozen_nf4 = MemoryTerm("frozen_nf4_weights", "frozen NF4 weights", 0, "none: not quantized")
            frozen_16bit = MemoryTerm(
                "frozen_16bit_weights",
                "frozen 16-bit weights",
                parameters.total * BYTES_16BIT,
                f"{parameters.total:,} params × {BYTES_16BIT} bytes",
            )

    trained_state = MemoryTerm(
        "trained_state",
        "trained state (Adam)",
        trained * ADAM_MIXED_PRECISION_BYTES_PER_PARAM,
        f"{trained:,} params × {ADAM_MIXED_PRECISION_BYTES_PER_PARAM} bytes (16-bit weights+grads, fp32 master+m+v)",
    )
    per_token = kv_cache_bytes_per_token(shape)
    kv_cache = MemoryTerm(
        "kv_cache",
        "KV cache (one group)",
        per_token * settings.tokens_per_group,
        f"{settings.num_generations} × ({settings.prompt_length} + {settings.max_completion_length}) tokens"
        f" × {per_token:,} bytes",
    )
    return MemoryEstimate(
        model=shape,
        settings=settings,
        parameters=parameters,
        trained_parameters=trained,
        terms=(frozen_16bit, frozen_nf4, trained_state, reference_model_bytes(shape, parameters, settings), kv_cache),
        notes=tuple(notes),
    )
