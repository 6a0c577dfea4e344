"""Incremental rendering: the start-up self-check and the junction with sampled ids."""

from __future__ import annotations

import copy

import pytest
from transformers import PreTrainedTokenizerBase

from kernel.errors import LegoError
from proxy.canonical import Message
from proxy.ledger import IncrementalRenderer
from proxy.render import Renderer
from tests.proxy.ledger.conftest import SYSTEM, request


def test_self_check_passes_for_the_served_template(tokenizer: PreTrainedTokenizerBase) -> None:
    IncrementalRenderer(tokenizer).self_check()


def test_self_check_refuses_a_template_whose_history_depends_on_later_messages(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    broken = copy.deepcopy(tokenizer)
    # Numbering turns by the conversation's length makes earlier turns change later.
    broken.chat_template = (
        "{%- for m in messages -%}<|im_start|>{{ m.role }} {{ messages | length }}\n"
        "{{ m.content }}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )
    with pytest.raises(LegoError, match="self-check"):
        IncrementalRenderer(broken).self_check()


def test_suffix_is_the_whole_render_after_the_previous_answer(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    incremental = IncrementalRenderer(tokenizer)
    answer = Message(role="assistant", content="Hi.")
    new = (
        Message(role="tool", content="one", tool_call_id="a"),
        Message(role="tool", content="two", tool_call_id="b"),
        Message(role="user", content="And now?"),
    )
    renderer = Renderer(tokenizer)
    head = renderer.render(request(SYSTEM, Message(role="user", content="Hello")))
    whole = renderer.render(request(SYSTEM, Message(role="user", content="Hello"), answer, *new))
    body = [*tokenizer.encode("Hi.", add_special_tokens=False), incremental.eos_id]
    suffix = incremental.suffix_ids(new, None)
    assert head + body + list(suffix) == whole
    no_think = incremental.suffix_ids(new, False)
    assert str(tokenizer.decode(list(no_think))).endswith("<think>\n\n</think>\n\n")
