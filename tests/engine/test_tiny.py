"""The tiny-model builder: determinism, token contract, layout, torch-free tokenizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from engine.tiny import ensure_tiny_model
from engine.tokenizer_build import MARKUP_TOKENS, SPECIAL_TOKENS, VOCAB_SIZE


def test_same_build_twice_is_identical(tiny_model_dir: Path, tmp_path: Path) -> None:
    again = ensure_tiny_model(tmp_path / "again")
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors", "config.json"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_ensure_does_not_rebuild(tiny_model_dir: Path) -> None:
    before = (tiny_model_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tiny_model_dir) == tiny_model_dir
    assert (tiny_model_dir / "model.safetensors").stat().st_mtime_ns == before
    leftovers = [p for p in tiny_model_dir.parent.iterdir() if ".building-" in p.name]
    assert leftovers == []


@pytest.mark.parametrize("token", SPECIAL_TOKENS + MARKUP_TOKENS)
def test_marker_tokens_encode_to_one_id(tiny_model_dir: Path, token: str) -> None:
    tok: Any = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    token_id = tok.convert_tokens_to_ids(token)
    ids = tok.encode(f"say{token}x\n{token} done", add_special_tokens=False)
    assert ids.count(token_id) == 2
    assert tok.decode([token_id]) == token


def test_special_vs_markup_on_decode(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    text = (
        "<|im_start|>assistant\n<think>\nplan\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    kept = tok.decode(ids, skip_special_tokens=True)
    assert kept == "assistant\n<think>\nplan\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert len(tok) == VOCAB_SIZE


def test_model_shape_and_eos(tiny_model_dir: Path) -> None:
    import json

    config = json.loads((tiny_model_dir / "config.json").read_text())
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config["num_hidden_layers"] == 4
    assert config["mlp_only_layers"] == [0]
    assert config["num_experts_per_tok"] == 2
    assert config["vocab_size"] % 64 == 0
    assert config["vocab_size"] >= len(tok)
    assert generation["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")


def test_build_tokenizer_needs_no_torch(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from pathlib import Path\n"
        "from engine.tiny import build_tokenizer\n"
        f"build_tokenizer(Path({str(tmp_path)!r}))\n"
        "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert (tmp_path / "tokenizer.json").exists()
