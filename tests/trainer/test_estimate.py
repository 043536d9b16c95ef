"""Memory estimate, price table and ``grpo estimate``, checked against hand arithmetic on the shipped Qwen3 configs."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from nodus.trainer.estimate import (
    EstimateInputError,
    JobSettings,
    MemoryEstimate,
    Method,
    ModelConfigError,
    ModelShape,
    count_parameters,
    estimate_memory,
    kv_cache_bytes_per_token,
    load_model_shape,
    lora_parameter_count,
    parse_method,
)
from nodus.trainer.estimate_cli import estimate
from nodus.trainer.pricing import (
    GPU_PRICES,
    PRICES_AS_OF,
    InvalidCostInput,
    UnknownGpu,
    fits,
    lookup_gpu,
    project_cost,
)

MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"
QWEN3_0_6B = MODELS / "qwen3-0.6b.config.json"
QWEN3_8B = MODELS / "qwen3-8b.config.json"
GB = 10**9


@pytest.fixture(scope="module")
def small() -> ModelShape:
    return load_model_shape(str(QWEN3_0_6B))


@pytest.fixture(scope="module")
def large() -> ModelShape:
    return load_model_shape(str(QWEN3_8B))


def config(path: Path) -> dict[str, int]:
    loaded: dict[str, int] = json.loads(path.read_text())
    return loaded


# --- parameter counts -----------------------------------------------------------------------------------------------


def test_qwen3_0_6b_parameter_count_matches_the_model_card(small: ModelShape) -> None:
    count = count_parameters(small)
    assert count.total == 596_049_920  # model card: 0.6B, 0.44B non-embedding
    assert count.non_embedding == 440_467_456
    assert count.lm_head == 0  # tie_word_embeddings: one matrix
    # embeddings 151936 × 1024; per layer q 1024×2048, k and v 1024×1024, o 2048×1024, q_norm/k_norm 128 each,
    # gate/up/down 3 × 1024×3072, two norms of 1024; a final norm of 1024
    per_layer = 1024 * 2048 * 2 + 1024 * 1024 * 2 + 128 * 2 + 3 * 1024 * 3072 + 2 * 1024
    assert count.total == 151936 * 1024 + 28 * per_layer + 1024


def test_qwen3_8b_parameter_count_matches_the_model_card(large: ModelShape) -> None:
    count = count_parameters(large)
    assert count.total == 8_190_735_360  # model card: 8.2B, 6.95B non-embedding
    assert count.non_embedding == 6_946_075_648
    assert count.lm_head == count.embedding == 151936 * 4096  # untied: two matrices
    assert round(count.total / 1e9, 2) == 8.19


def test_lora_parameters_of_qwen3_0_6b_at_rank_8(small: ModelShape) -> None:
    c = config(QWEN3_0_6B)
    hidden, inter, head_dim = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q_width = c["num_attention_heads"] * head_dim  # 16 × 128 = 2048
    kv_width = c["num_key_value_heads"] * head_dim  # 8 × 128 = 1024
    r = 8
    per_layer = (
        r * (hidden + q_width)  # q_proj: 8 × (1024 + 2048) = 24,576
        + r * (hidden + kv_width)  # k_proj: 8 × (1024 + 1024) = 16,384
        + r * (hidden + kv_width)  # v_proj: 16,384
        + r * (q_width + hidden)  # o_proj: 24,576
        + 3 * r * (hidden + inter)  # gate, up, down: 3 × 8 × (1024 + 3072) = 98,304
    )
    assert per_layer == 180_224
    assert lora_parameter_count(small, r) == per_layer * c["num_hidden_layers"] == 5_046_272


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 100,
                "model_type": "llama",
            }
        )
    )
    shape = load_model_shape(str(tmp_path))  # a directory holding config.json
    assert (shape.head_dim, shape.num_kv_heads, shape.qk_norm, shape.tie_word_embeddings) == (16, 4, False, False)
    # 2 × 100×64 embeddings/lm_head + 2 × (4 × 64×64 + 3 × 64×128 + 2 × 64) + 64
    assert count_parameters(shape).total == 2 * 6400 + 2 * (4 * 4096 + 3 * 8192 + 128) + 64


# --- memory terms ---------------------------------------------------------------------------------------------------


def test_nf4_qwen3_8b_lands_near_the_measured_6_09_gb(large: ModelShape) -> None:
    result = estimate_memory(large, JobSettings(Method.QLORA))
    # measured on an H200 after loading the NF4 model: 6.09 GB; a flat 0.5 byte per parameter would say 4.1 GB
    assert result.frozen_weight_bytes == pytest.approx(6.09 * GB, rel=0.10)
    assert result.frozen_weight_bytes == 6_073_043_952  # 6.073 GB, -0.3% from the measurement
    linear = count_parameters(large).quantizable_linear
    assert linear == 36 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 12288)
    # constants: one byte per 64 weights, 4 bytes per 64 × 256 weights, 4 bytes per tensor (7 per layer)
    constants = linear // 64 + linear // (64 * 256) * 4 + 36 * 7 * 4
    assert result.term("frozen_nf4_weights").bytes == linear // 2 + constants
    assert result.term("frozen_16bit_weights").bytes == (count_parameters(large).total - linear) * 2


def test_lora_terms_of_qwen3_0_6b(small: ModelShape) -> None:
    result = estimate_memory(small, JobSettings(Method.LORA))
    assert {term.key: term.bytes for term in result.terms} == {
        "frozen_16bit_weights": 596_049_920 * 2,
        "frozen_nf4_weights": 0,
        "trained_state": 5_046_272 * 16,
        "reference_model": 0,
        "kv_cache": 4 * (256 + 64) * 114_688,
    }
    assert result.total_bytes == 1_419_640_832


def test_full_trains_every_parameter_and_has_no_frozen_weights(small: ModelShape) -> None:
    result = estimate_memory(small, JobSettings(Method.FULL))
    assert result.trained_parameters == 596_049_920
    assert result.term("trained_state").bytes == 596_049_920 * 16
    assert result.frozen_weight_bytes == 0


def test_kv_cache_is_two_by_layers_by_kv_heads_by_head_dim_by_two_bytes_per_token(large: ModelShape) -> None:
    assert kv_cache_bytes_per_token(large) == 2 * 36 * 8 * 128 * 2 == 147_456
    settings = JobSettings(Method.LORA, num_generations=8, prompt_length=512, max_completion_length=1024)
    assert estimate_memory(large, settings).term("kv_cache").bytes == 147_456 * 8 * (512 + 1024)


@pytest.mark.parametrize(
    ("method", "beta", "reference_bytes"),
    [
        (Method.LORA, 0.0, 0),
        (Method.LORA, 0.04, 0),  # TRL + peft: the base with adapters disabled is the reference
        (Method.QLORA, 0.04, 0),
        (Method.FULL, 0.0, 0),  # no KL term, no reference model
        (Method.FULL, 0.04, 596_049_920 * 2),  # a second 16-bit copy
    ],
)
def test_reference_model_only_costs_memory_for_full_training_with_beta(
    small: ModelShape, method: Method, beta: float, reference_bytes: int
) -> None:
    assert estimate_memory(small, JobSettings(method, beta=beta)).term("reference_model").bytes == reference_bytes


def test_json_terms_add_up(large: ModelShape) -> None:
    payload = estimate_memory(large, JobSettings(Method.QLORA)).as_json()
    assert sum(payload["terms_bytes"].values()) == payload["total_bytes"]
    assert payload["method"] == "QLoRA" and payload["trained_parameters"] == 21_823_488


# --- bad inputs -----------------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.json")
    with pytest.raises(ModelConfigError) as error:
        load_model_shape(missing)
    assert str(error.value) == (
        f"model config not found: {missing}; "
        "pass a config.json path, a directory containing config.json, or hf://org/name@revision"
    )


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError) as error:
        load_model_shape(str(tmp_path))
    assert str(error.value) == (
        f"directory {tmp_path} has no config.json; "
        "pass a config.json path, a directory containing config.json, or hf://org/name@revision"
    )


def test_json_that_is_not_a_model_config(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"maxCostUSD": "5.00", "hidden_size": 8}))
    with pytest.raises(ModelConfigError) as error:
        load_model_shape(str(path))
    assert str(error.value) == (
        f"{path} is not a model config: it lacks intermediate_size, num_hidden_layers, num_attention_heads, "
        "vocab_size; expected a Hugging Face config.json of a decoder-only language model"
    )


def test_invalid_json_and_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"is not valid JSON \(Expecting property name"):
        load_model_shape(str(path))
    fields = config(QWEN3_0_6B) | {"num_hidden_layers": "28"}
    path.write_text(json.dumps(fields))
    with pytest.raises(ModelConfigError) as error:
        load_model_shape(str(path))
    assert str(error.value) == f'{path}: num_hidden_layers must be a positive integer, got "28"'


def test_mixture_of_experts_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config(QWEN3_0_6B) | {"num_experts": 128}))
    with pytest.raises(ModelConfigError) as error:
        load_model_shape(str(path))
    assert str(error.value) == (
        f"{path} describes a mixture-of-experts model (num_experts=128), which the estimator does not model; "
        "estimate a dense model of similar size instead"
    )


def test_unknown_method() -> None:
    assert parse_method("qlora") is Method.QLORA
    with pytest.raises(EstimateInputError) as error:
        parse_method("DoRA")
    assert str(error.value) == "unknown method 'DoRA'; choose one of LoRA, QLoRA, Full"


def test_one_generation_is_not_grpo() -> None:
    with pytest.raises(EstimateInputError) as error:
        JobSettings(Method.LORA, num_generations=1)
    assert str(error.value) == "--num-generations must be at least 2 for GRPO, got 1"


def test_hf_model_not_in_cache(tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    with pytest.raises(ModelConfigError) as error:
        load_model_shape("hf://Qwen/Qwen3-8B@main", hf_cache_dir=tmp_path)
    assert str(error.value) == (
        "config.json of hf://Qwen/Qwen3-8B@main is not in the local Hugging Face cache; run "
        "`hf download Qwen/Qwen3-8B --revision main config.json` on a machine with access, "
        "or pass a local config.json"
    )


def test_hf_model_from_cache(tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    commit = "a" * 40
    repo = tmp_path / "models--Qwen--Qwen3-8B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(QWEN3_8B.read_text())
    shape = load_model_shape("hf://Qwen/Qwen3-8B@main", hf_cache_dir=tmp_path)
    assert shape.name == "hf://Qwen/Qwen3-8B@main" and count_parameters(shape).total == 8_190_735_360
    assert load_model_shape(f"hf://Qwen/Qwen3-8B@{commit}", hf_cache_dir=tmp_path).hidden_size == 4096


def test_hf_model_without_huggingface_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(ModelConfigError) as error:
        load_model_shape("hf://Qwen/Qwen3-8B@main")
    assert str(error.value) == (
        "cannot read hf://Qwen/Qwen3-8B@main from the Hugging Face cache: huggingface_hub is not installed; "
        "pip install huggingface_hub, or run `hf download Qwen/Qwen3-8B --revision main config.json` "
        "on a machine with access, or pass a local config.json"
    )


def test_malformed_hf_address() -> None:
    with pytest.raises(ModelConfigError) as error:
        load_model_shape("hf://Qwen3-8B")
    assert str(error.value) == "'hf://Qwen3-8B' is not of the form hf://org/name@revision"


# --- pricing --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "full_name", "seconds", "rate"),
    [
        ("h100", "H100 SXM 80 GB", "0.45", "2.600"),
        ("H100 SXM", "H100 SXM 80 GB", "0.45", "2.600"),
        ("A100", "A100 80 GB", "0.7", "1.090"),
        ("l40s", "L40S 48 GB", "1", "0.793"),
        ("4090", "RTX 4090 24 GB", "1.2", "0.290"),
        ("rtx-4090", "RTX 4090 24 GB", "1.2", "0.290"),
        ("a6000", "RTX A6000 48 GB", "1.3", "0.333"),
        ("RTX A6000 48 GB", "RTX A6000 48 GB", "1.3", "0.333"),
    ],
)
def test_lookup_gpu(name: str, full_name: str, seconds: str, rate: str) -> None:
    gpu = lookup_gpu(name)
    assert (gpu.name, gpu.seconds_per_step, gpu.usd_per_hour) == (full_name, Decimal(seconds), Decimal(rate))
    assert gpu.as_of == PRICES_AS_OF
    assert str(PRICES_AS_OF) == "2026-10-26"


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(UnknownGpu) as error:
        lookup_gpu("V100")
    assert str(error.value) == (
        "unknown GPU 'V100'; known GPUs: H100 SXM 80 GB (h100), A100 80 GB (a100), L40S 48 GB (l40s), "
        "RTX 4090 24 GB (4090), RTX A6000 48 GB (a6000)"
    )
    assert len(GPU_PRICES) == 5


def test_cost_projection_arithmetic() -> None:
    h100 = lookup_gpu("h100")
    # 1000 steps × 0.45 s + 30 s eval = 480 s; 480 / 3600 h × $2.600 = $0.34666… → rounded up to $0.35
    projection = project_cost(1000, h100.seconds_per_step, h100.usd_per_hour, eval_seconds=30)
    assert projection.seconds == Decimal("480.00")
    assert projection.usd == Decimal("0.35")
    # exact hours stay exact: 3600 steps × 1 s at $0.793/h
    assert project_cost(3600, "1", "0.793").usd == Decimal("0.80")  # $0.793 → rounded up to the cent
    assert project_cost(0, "0.7", "1.090").usd == Decimal("0.00")
    # a budget from the job spec compares exactly
    assert project_cost(10_000, "1.2", "0.290").usd <= Decimal("5.00")  # 12,000 s → $0.97


def test_cost_projection_rejects_bad_input() -> None:
    with pytest.raises(InvalidCostInput) as error:
        project_cost(-1, "1", "1")
    assert str(error.value) == "steps must be a whole number of 0 or more, got -1"
    with pytest.raises(InvalidCostInput) as error:
        project_cost(1, "fast", "1")
    assert str(error.value) == "seconds per step must be a number, got 'fast'"


def test_fits(small: ModelShape, large: ModelShape) -> None:
    ok, message = fits(estimate_memory(small, JobSettings(Method.LORA)), lookup_gpu("4090"))
    assert ok
    assert message == "fits RTX 4090 24 GB: 1.42 GB estimated of 24 GB, 22.58 GB left for activations and logits"
    ok, message = fits(estimate_memory(large, JobSettings(Method.FULL)), lookup_gpu("h100"))
    assert not ok
    assert message == (
        "does not fit H100 SXM 80 GB: 131.24 GB estimated, 51.24 GB over its 80 GB; "
        "use QLoRA, fewer generations, shorter completions, or a GPU with more memory"
    )


# --- the command ----------------------------------------------------------------------------------------------------


def test_table_output(large: ModelShape) -> None:
    result = CliRunner().invoke(estimate, ["--model", str(QWEN3_8B), "--method", "QLoRA", "--gpu", "4090"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[2:8] == [
        "term                      GB  arithmetic",
        "frozen 16-bit weights  2.490  1,244,967,936 params (embeddings, lm_head, norms) × 2 bytes",
        "frozen NF4 weights     3.583  6,945,767,424 params × 0.5 byte + 110,224,368 bytes of quantization constants",
        "trained state (Adam)   0.349  21,823,488 params × 16 bytes (16-bit weights+grads, fp32 master+m+v)",
        "reference model        0.000  none: beta is 0, no KL term",
        "KV cache (one group)   0.189  4 × (256 + 64) tokens × 147,456 bytes",
    ]
    assert lines[8] == "total                  6.611"
    assert "1 GB = 1e9 bytes" in lines[9]
    assert lines[-1] == "fits RTX 4090 24 GB: 6.61 GB estimated of 24 GB, 17.39 GB left for activations and logits"


def test_json_output_has_every_term_in_bytes() -> None:
    args = ["--model", str(QWEN3_0_6B), "--method", "full", "--beta", "0.04", "--gpu", "a6000", "--json"]
    result = CliRunner().invoke(estimate, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["terms_bytes"] == {
        "frozen_16bit_weights": 0,
        "frozen_nf4_weights": 0,
        "trained_state": 596_049_920 * 16,
        "reference_model": 596_049_920 * 2,
        "kv_cache": 146_800_640,
    }
    assert payload["lora_r"] is None
    assert payload["gpu"]["fits"] is True and payload["gpu"]["memory_bytes"] == 48 * GB


@pytest.fixture
def grpo_main(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str] | None], None]:
    """``nodus.core.cli.main`` with ``estimate`` registered, as the lead wires it."""
    from nodus.core import cli

    if "estimate" not in cli.cli.commands:
        monkeypatch.setitem(cli.cli.commands, "estimate", estimate)
    return cli.main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--model", "missing.json", "--method", "LoRA"],
            "grpo: error: model config not found: missing.json; "
            "pass a config.json path, a directory containing config.json, or hf://org/name@revision",
        ),
        (
            ["--model", str(QWEN3_0_6B), "--method", "adapter"],
            "grpo: error: unknown method 'adapter'; choose one of LoRA, QLoRA, Full",
        ),
        (
            ["--model", str(QWEN3_0_6B), "--method", "Full", "--lora-r", "16"],
            "grpo estimate: error: --lora-r applies to LoRA and QLoRA; drop it with --method Full "
            "(see 'grpo estimate --help')",
        ),
        (
            ["--model", str(QWEN3_0_6B), "--method", "LoRA", "--lora-r", "0"],
            "grpo: error: --lora-r must be at least 1, got 0",
        ),
        (
            ["--model", str(QWEN3_0_6B), "--method", "LoRA", "--gpu", "tpu"],
            "grpo: error: unknown GPU 'tpu'; known GPUs: H100 SXM 80 GB (h100), A100 80 GB (a100), "
            "L40S 48 GB (l40s), RTX 4090 24 GB (4090), RTX A6000 48 GB (a6000)",
        ),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    grpo_main: Callable[[list[str] | None], None], capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        grpo_main(["estimate", *args])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == message + "\n"


def test_estimate_is_a_click_command() -> None:
    assert isinstance(estimate, click.Command) and estimate.name == "estimate"


def test_estimate_type_is_what_fits_takes(small: ModelShape) -> None:
    result: MemoryEstimate = estimate_memory(small, JobSettings(Method.LORA))
    assert fits(result, lookup_gpu("h100"))[0]
