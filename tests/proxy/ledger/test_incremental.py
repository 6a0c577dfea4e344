"""Incremental rendering: the start-up self-check and the junction with sampled ids.

The self-check must pass every template that renders incrementally, whatever it does to
earlier answers, and refuse one that does not, with one line naming the behaviour.
"""

from __future__ import annotations

import copy

import pytest
from transformers import PreTrainedTokenizerBase

from kernel.errors import LegoError
from proxy.canonical import Message
from proxy.ledger import IncrementalRenderer
from proxy.ledger.template_check import check_template
from proxy.render import Renderer
from tests.proxy.ledger.conftest import SYSTEM, request

_TURN = (
    "<|im_start|>{{ m.role }}{{ HEADER }}\n{{ m.content }}"
    "{% if m.tool_calls %}<tool_call>{{ m.tool_calls[0].function.name }}</tool_call>{% endif %}"
    "{{ END }}"
)
_LOOP = "{%- for m in messages -%}" + _TURN + "{%- endfor -%}"
_PROMPT = "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"


def template(header: str = "", end: str = "<|im_end|>\n", loop: str = _LOOP) -> str:
    return (loop + _PROMPT).replace("{{ HEADER }}", header).replace("{{ END }}", end)


def with_template(tokenizer: PreTrainedTokenizerBase, text: str) -> PreTrainedTokenizerBase:
    changed = copy.deepcopy(tokenizer)
    changed.chat_template = text
    return changed


def check(tokenizer: PreTrainedTokenizerBase) -> None:
    check_template(tokenizer, IncrementalRenderer(tokenizer))


def test_self_check_passes_for_the_served_template(tokenizer: PreTrainedTokenizerBase) -> None:
    check(tokenizer)


def test_self_check_passes_a_plain_chatml_template(tokenizer: PreTrainedTokenizerBase) -> None:
    check(with_template(tokenizer, template()))


def test_self_check_passes_a_template_that_refuses_a_late_system_message(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Qwen3.5 raises for a system message anywhere but first: such requests get the
    template's error, and the template still renders incrementally."""
    refusing = (
        "{%- for m in messages -%}{%- if m.role == 'system' and not loop.first -%}"
        "{{ raise_exception('System message must be at the beginning.') }}{%- endif -%}"
        + _TURN
        + "{%- endfor -%}"
    )
    check(with_template(tokenizer, template(loop=refusing)))


def test_self_check_refuses_a_first_message_that_depends_on_later_ones(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    broken = with_template(tokenizer, template(header=" {{ messages | length }}"))
    with pytest.raises(LegoError, match="renders a user query differently once an answer"):
        check(broken)


def test_self_check_refuses_new_messages_that_depend_on_earlier_ones(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    broken = with_template(tokenizer, template(header=" {{ loop.index0 }}"))
    with pytest.raises(LegoError, match="depends on the earlier ones"):
        check(broken)


def test_self_check_refuses_answers_without_the_eos_token(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    end = "{% if m.role == 'assistant' %}\n{% else %}<|im_end|>\n{% endif %}"
    with pytest.raises(LegoError, match="does not end an assistant message with the eos"):
        check(with_template(tokenizer, template(end=end)))


def test_self_check_refuses_a_template_that_hoists_system_messages(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    hoisting = (
        "{%- for m in messages if m.role == 'system' -%}" + _TURN + "{%- endfor -%}"
        "{%- for m in messages if m.role != 'system' -%}" + _TURN + "{%- endfor -%}"
    )
    with pytest.raises(LegoError, match="in front of the conversation's earlier messages"):
        check(with_template(tokenizer, template(loop=hoisting)))


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
