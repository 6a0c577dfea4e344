"""A stand-in for a model trained on a real chat template: what it would sample.

Owns ``sampled_text(tokenizer, request, answer)``: the text the template writes for
``answer`` as the conversation's last message, after what the generation prompt already
wrote (Qwen3.5's ``<think>\\n``), up to its end-of-turn token. That is the template's own
answer format, which is what a model trained on the template produces; the ids are that
text tokenized alone (a model cannot re-merge its prompt's last tokens) plus eos
(``sampled_ids``). ``whole_suffix(tokenizer, request, answer_index)`` is what the whole
render of ``request`` writes after the answer at ``answer_index``: the reference for a
continuation's new tokens, computed by a second route (counting end-of-turn tokens in a
whole render) from the one the ledger takes.

``BASH_SCHEMA`` / ``READ_SCHEMA`` are the tools the real-template tests offer (a string, an
``Optional[int]`` and a boolean: what the XML templates render with ``| string``), and
``THINKING`` names the templates that write think blocks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from proxy.canonical import ChatRequest, Message
from proxy.render import Renderer

THINKING = ("qwen3", "qwen3.5")
BASH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string"},
        "timeout": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "background": {"type": "boolean"},
    },
    "required": ["command"],
}
READ_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"path": {"type": "string"}}}


def eos_text(tokenizer: PreTrainedTokenizerBase) -> str:
    assert tokenizer.eos_token_id is not None
    return str(tokenizer.decode([tokenizer.eos_token_id]))


def sampled_text(tokenizer: PreTrainedTokenizerBase, request: ChatRequest, answer: Message) -> str:
    renderer = Renderer(tokenizer)
    before = renderer.render_text(request)
    answered = replace(request, messages=(*request.messages, answer))
    after = renderer.render_text(answered, generation_prompt=False)
    assert after.startswith(before), "the template's answer does not follow its prompt"
    return after[len(before) : after.index(eos_text(tokenizer), len(before))]


def sampled_ids(
    tokenizer: PreTrainedTokenizerBase, request: ChatRequest, answer: Message
) -> tuple[int, ...]:
    ids = tokenizer.encode(sampled_text(tokenizer, request, answer), add_special_tokens=False)
    assert tokenizer.eos_token_id is not None
    return (*ids, tokenizer.eos_token_id)


def whole_suffix(tokenizer: PreTrainedTokenizerBase, request: ChatRequest, answer: int) -> str:
    renderer = Renderer(tokenizer)
    whole = renderer.render_text(request)
    upto = replace(request, messages=request.messages[: answer + 1])
    count = renderer.render_text(upto, generation_prompt=False).count(eos_text(tokenizer))
    end = 0
    for _ in range(count):
        end = whole.index(eos_text(tokenizer), end) + len(eos_text(tokenizer))
    return whole[end:]
