"""A tiny random-weight causal LM with its own tokenizer, built locally in about a second, for fast tests.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a small built-in corpus of the words the task
prompts use, so prompts and answers tokenize into few tokens and any text still round-trips (byte fallback).
The same seed gives byte-identical files, so tests that train on it are reproducible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The chat template marks each turn with its role and ends it with the eos token, so a GRPO completion stops at eos.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
TARGET_VOCAB_SIZE = 512

# Text the BPE merges are learned from: the vocabulary of the task prompts and answers (graph colouring, JSON,
# numbers, the <answer> tags). Its content only decides which strings get their own token; any text still encodes.
TRAINING_CORPUS = """
Color the vertices of the graph so that no two adjacent vertices share a color.
The graph has vertices and edges. Use at most colors. Each vertex gets a color number.
Answer with a JSON object mapping each vertex to its color, inside <answer> and </answer> tags.
Think step by step, then give the final answer. The answer is <answer>{"0": 1, "1": 2, "2": 0}</answer>.
Edges: [[0, 1], [1, 2], [2, 3], [3, 0], [0, 2]]. Vertices: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9.
Repeat the number. Solve the puzzle. Return the result as a list of integers. true false null
You are a helpful assistant. The user asks a question and the assistant answers it.
What is the sum of the numbers? The sum is 10 + 20 = 30. 0123456789 {"a": [1, 2, 3]} [] {} , : " '
"""

CORPUS_REPEATS = 8  # repeated so that the words above outrank stray character pairs in the merge counts


def build_tiny_model(dest: Path, *, seed: int = 0, vocab_from: Path | None = None) -> Path:
    """Save a tiny LlamaForCausalLM and its tokenizer into ``dest`` (created) and return ``dest``.

    ``vocab_from``: a model folder whose tokenizer (and chat template) to use instead of the built-in one, for a
    tiny model that speaks the same token ids as a real model.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer: Any = build_tiny_tokenizer() if vocab_from is None else AutoTokenizer.from_pretrained(vocab_from)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    # A private generator would be nicer, but the initialisers draw from torch's global one; restore it afterwards
    # so building a model does not change the random stream of the caller.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = config.pad_token_id
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def build_tiny_tokenizer() -> Any:
    """A ~512-token byte-level BPE with bos/eos/pad, role markers and a chat template, as a fast HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # The chat template writes the special tokens itself; adding bos/eos here as well would double them.
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    special_tokens = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB_SIZE,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([TRAINING_CORPUS] * CORPUS_REPEATS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        # Decoder-only generation appends after the last position, so batched prompts are padded on the left.
        padding_side="left",
    )
