"""Builds the tiny model's tokenizer: a real byte-level BPE with Qwen3's special tokens.

Owns ``build_tokenizer(path)``, which trains a BPE (vocab ``VOCAB_SIZE``) with the
``tokenizers`` library on the built-in corpus (``engine.corpus``) and saves it as a
transformers fast tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) carrying the
Qwen3 chat template. It needs no torch: the proxy renders prompts without it.

Token contract (as with real Qwen3): ``<|endoftext|>`` (pad), ``<|im_start|>`` and
``<|im_end|>`` (eos) are special; ``<think>``, ``</think>``, ``<tool_call>``,
``</tool_call>``, ``<tool_response>`` and ``</tool_response>`` are added tokens that are
*not* special, so ``decode(skip_special_tokens=True)`` keeps them. Each of the nine
encodes to exactly one id wherever it appears in text. The same build always yields a
byte-identical ``tokenizer.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.chat_template import CHAT_TEMPLATE
from engine.corpus import build_corpus

VOCAB_SIZE = 4096
CORPUS_SEED = 1234

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
MARKUP_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# Qwen2/3's pre-tokenizer split: contractions, letters, single digits, punctuation runs,
# newline runs and spaces, so merges never straddle those classes.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _train() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(build_corpus(CORPUS_SEED), trainer=trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tokenizer


def build_tokenizer(path: Path) -> None:
    """Train the tokenizer and save it, with the chat template, into directory ``path``."""
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    factory: Any = PreTrainedTokenizerFast  # its __init__ is untyped
    fast = factory(
        tokenizer_object=_train(),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(path))
