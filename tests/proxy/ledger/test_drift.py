"""Retokenization drift: whole re-rendering changes sampled ids; the ledger does not."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from proxy.canonical import Message
from proxy.ledger import LedgerBook
from proxy.render import Renderer
from tests.proxy.ledger.conftest import SYSTEM, Driver, answer_text, call, request, sampled

USER = Message(role="user", content="List the files.")
RESULT = Message(role="tool", content="a.txt", tool_call_id="call_1")


def test_compact_arguments_survive_where_a_re_render_respaces_them(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    answer = Message(role="assistant", content="", tool_calls=(call("bash", '{"command":"ls"}'),))
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), answer)
    follow = request(SYSTEM, USER, answer, RESULT)
    plan = d.turn(follow, answer)
    naive = Renderer(tokenizer).render(follow)
    sampled_ids = sampled(tokenizer, answer)
    first_prompt = d.plans[0].prompt_ids
    assert plan.prompt_ids[len(first_prompt) : len(first_prompt) + len(sampled_ids)] == sampled_ids
    assert naive[: len(first_prompt) + len(sampled_ids)] != list(
        plan.prompt_ids[: len(first_prompt) + len(sampled_ids)]
    )


def test_a_non_canonical_split_is_kept_as_sampled(
    book: LedgerBook, tokenizer: PreTrainedTokenizerBase
) -> None:
    answer = Message(role="assistant", content="The files are listed.")
    pieces = ["The fi", "les are lis", "ted."]
    output = sampled(tokenizer, answer, pieces=pieces)
    assert output != sampled(tokenizer, answer)  # the split really is non-canonical
    assert "".join(pieces) == answer_text(answer)
    d = Driver(book, tokenizer)
    d.turn(request(SYSTEM, USER), answer, output=output)
    follow = request(SYSTEM, USER, answer, Message(role="user", content="Thanks."))
    plan = d.turn(follow, answer)
    assert plan.classification == "extend"
    assert plan.prompt_ids[: len(d.plans[0].prompt_ids) + len(output)] == (
        d.plans[0].prompt_ids + output
    )
    assert list(plan.prompt_ids) != Renderer(tokenizer).render(follow)
