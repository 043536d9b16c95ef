"""Checks for spec.parameters.trl.generation_kwargs, which TRL passes unchecked into the GenerationConfig it samples
rollouts with. Unchecked, a misspelt key is silently ignored (transformers keeps it as an unused attribute) and a bad
value fails at the first sampling, after the baseline evaluation: both are caught here, before any work.

`problem(value)` returns the one-line message (None when the mapping is fine); spec.py raises it as InvalidJobSpec.
With vLLM (`use_vllm`) the mapping goes to vLLM's SamplingParams instead, whose keys differ, so it is not checked.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

WHERE = "spec.parameters.trl.generation_kwargs"

# Keys TRL fills in from a setting of its own (and a generation_kwargs entry would silently override it).
OWNED = {
    "max_new_tokens": "spec.parameters.maxCompletionLength (--max-completion-length)",
    "max_length": "spec.parameters.maxCompletionLength (--max-completion-length)",
    "num_return_sequences": "spec.parameters.numGenerations (--num-generations)",
    "temperature": "spec.parameters.temperature (--temperature)",
    "top_p": "spec.parameters.trl.top_p",
    "top_k": "spec.parameters.trl.top_k",
    "min_p": "spec.parameters.trl.min_p",
    "repetition_penalty": "spec.parameters.trl.repetition_penalty",
    "cache_implementation": "spec.parameters.trl.cache_implementation",
}
# Keys TRL fills in from something that is not a setting: refused with "remove it".
SET_BY_TRL = {
    "pad_token_id": "is the tokenizer's, which TRL passes",
    "bos_token_id": "is the tokenizer's, which TRL passes",
    "eos_token_id": "is the tokenizer's and the model's, which TRL passes",
    "disable_compile": "is passed by TRL itself (disable_compile=True)",
}

_STRATEGY = "selects a decoding strategy other than sampling, and GRPO trains on completions sampled from the policy"
_OUTPUT = "changes what generate returns, and TRL reads its result as token ids"
REFUSED = {
    **dict.fromkeys(
        (
            "num_beams",
            "num_beam_groups",
            "diversity_penalty",
            "length_penalty",
            "early_stopping",
            "constraints",
            "force_words_ids",
            "penalty_alpha",
            "dola_layers",
            "prompt_lookup_num_tokens",
            "max_matching_ngram_size",
            "num_assistant_tokens",
            "num_assistant_tokens_schedule",
            "assistant_confidence_threshold",
            "assistant_early_exit",
            "assistant_lookbehind",
            "assistant_ensemble_weight",
            "target_lookbehind",
            "is_assistant",
            "use_mtp",
            "speculation_type",
        ),
        _STRATEGY,
    ),
    **dict.fromkeys(
        ("return_dict_in_generate", "output_scores", "output_logits", "output_attentions", "output_hidden_states"),
        _OUTPUT,
    ),
    "stop_strings": "needs a tokenizer passed to generate, and TRL passes none (completions end at EOS)",
    "token_healing": "needs a tokenizer passed to generate, and TRL passes none",
    "decoder_start_token_id": "is for encoder-decoder models, and GRPO trains decoder-only ones",
    "transformers_version": "is bookkeeping written into saved configs, not a setting",
    "_from_model_config": "is bookkeeping written into saved configs, not a setting",
}

_Check = tuple[Any, Callable[[Any], bool], str]
_PROBABILITY: _Check = (float, lambda v: 0 < v <= 1, "a probability mass above 0 and at most 1")
_CUTOFF: _Check = (float, lambda v: 0 <= v < 1, "a probability from 0 (off) to below 1")
_COUNT: _Check = (int, lambda v: v >= 0, "0 (off) or a whole number")
_TOKEN_IDS: _Check = (list[int], lambda v: all(i >= 0 for i in v), "a list of token ids (whole numbers, 0 or more)")
# Value checks for the settings that do take effect when sampling: types strictly, and the ranges transformers
# either rejects only at generate time or silently treats as off.
VALUES: dict[str, _Check] = {
    "typical_p": _PROBABILITY,
    "top_h": _PROBABILITY,
    "epsilon_cutoff": _CUTOFF,
    "eta_cutoff": _CUTOFF,
    "no_repeat_ngram_size": _COUNT,
    "encoder_no_repeat_ngram_size": _COUNT,
    "min_new_tokens": _COUNT,
    "min_length": _COUNT,
    "encoder_repetition_penalty": (float, lambda v: v > 0, "a value above 0 (1.0 is off)"),
    "max_time": (float, lambda v: v > 0, "a number of seconds above 0"),
    "guidance_scale": (float, lambda v: v >= 0, "0 or more (1.0 is off)"),
    "suppress_tokens": _TOKEN_IDS,
    "begin_suppress_tokens": _TOKEN_IDS,
    "bad_words_ids": (
        list[list[int]],
        lambda v: all(ids and all(i >= 0 for i in ids) for ids in v),
        "a list of non-empty token-id lists",
    ),
    "forced_bos_token_id": (int, lambda v: v >= 0, "a token id (a whole number, 0 or more)"),
    "forced_eos_token_id": (
        int | list[int],
        lambda v: all(i >= 0 for i in (v if isinstance(v, list) else [v])),
        "a token id or a list of them",
    ),
    "renormalize_logits": (bool, lambda v: True, "true or false"),
    "remove_invalid_values": (bool, lambda v: True, "true or false"),
    "use_cache": (bool, lambda v: True, "true or false"),
}
_STRICT = ConfigDict(strict=True, allow_inf_nan=False)


def problem(value: Any) -> str | None:
    """What is wrong with a generation_kwargs value (a mapping, or JSON text of one as TRL also takes), or None."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            example = "{no_repeat_ngram_size: 3}"
            return f"{WHERE} is text that is not JSON ({error.msg}); write it as a mapping, e.g. {example}"
        if not isinstance(value, dict):
            return f"{WHERE} must be a mapping of GenerationConfig settings, not {type(value).__name__}"
    known = _generation_config_keys()
    for key, setting in value.items():
        where = f"{WHERE}.{key}"
        if key in OWNED:
            return f"{where} is set by {OWNED[key]}; set it there, not through generation_kwargs"
        if key == "do_sample":
            if setting is True:
                continue  # what TRL sets anyway
            return f"{where} must stay true: GRPO trains on sampled completions; remove it"
        if key in SET_BY_TRL:
            return f"{where} {SET_BY_TRL[key]}; remove it"
        if key in REFUSED:
            return f"{where} {REFUSED[key]}; remove it"
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known - REFUSED.keys() - SET_BY_TRL.keys()), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            return f"{where} is not a GenerationConfig setting; {hint}see transformers' GenerationConfig"
        if key in VALUES:
            kind, in_range, what = VALUES[key]
            try:
                checked = TypeAdapter(kind, config=_STRICT).validate_python(setting)
            except ValidationError:
                return f"{where} = {setting!r} is not {what}; fix the value"
            if not in_range(checked):
                return f"{where} = {setting!r} is out of range: use {what}"
    return _rejected_by_transformers(value)


def _generation_config_keys() -> set[str]:
    from transformers import GenerationConfig

    return set(GenerationConfig().to_dict())


def _rejected_by_transformers(value: dict[str, Any]) -> str | None:
    """GenerationConfig's own validation, on the config TRL builds (sampling, a completion length)."""
    import logging

    from transformers import GenerationConfig

    quiet = logging.getLogger("transformers.generation.configuration_utils")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its notes on flags it ignores are for generate's callers, not for us
    try:
        GenerationConfig(**{"do_sample": True, "max_new_tokens": 1, **value}).validate(strict=False)
    except (ValueError, TypeError) as error:
        return f"{WHERE}: {str(error).strip().splitlines()[0]}"
    finally:
        quiet.setLevel(level)
    return None


# The settings that name token ids: a token id past the model's vocabulary is silently ignored by some (e.g.
# suppress_tokens) and fails the first sampling, after the baseline, in others (bad_words_ids).
TOKEN_ID_SETTINGS = (
    "suppress_tokens",
    "begin_suppress_tokens",
    "bad_words_ids",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "sequence_bias",  # [[token ids, bias], ...]
)


def trl_mapping(value: Any) -> dict[str, Any] | None:
    """A mapping-typed trl field (generation_kwargs, chat_template_kwargs) as a dict: TRL also takes JSON text of
    one. None when unset or not one (problem() and TRL report that)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def vocabulary_problem(trl: dict[str, Any], config_path: Path) -> str | None:
    """Token ids in a (checked) trl.generation_kwargs against the model's vocabulary, read from its config.json
    (only when a token id is set): no weights need loading, so it runs before any work."""
    if trl.get("use_vllm"):
        return None  # vLLM's SamplingParams: not checked here (see the module's docstring)
    value = trl_mapping(trl.get("generation_kwargs"))
    if value is None or not any(key in value for key in TOKEN_ID_SETTINGS):
        return None
    config = json.loads(config_path.read_text())
    vocab_size = (config.get("text_config") or config).get("vocab_size")
    return token_id_problem(value, vocab_size) if isinstance(vocab_size, int) else None


def token_id_problem(value: dict[str, Any], vocab_size: int) -> str | None:
    """The first token id of a (checked) generation_kwargs mapping that the model's vocabulary does not have."""
    for key in TOKEN_ID_SETTINGS:
        setting = value.get(key)
        ids = setting if isinstance(setting, list) else [] if setting is None else [setting]
        if key == "sequence_bias":
            ids = [pair[0] for pair in ids if isinstance(pair, list) and pair]
        flat = [i for item in ids for i in (item if isinstance(item, list) else [item]) if isinstance(i, int)]
        past = [i for i in flat if i >= vocab_size]
        if past:
            return (
                f"{WHERE}.{key} names token id {past[0]}, past the model's vocabulary of {vocab_size} tokens "
                f"(ids 0 to {vocab_size - 1}); use the model's own token ids (its tokenizer's convert_tokens_to_ids)"
            )
    return None
