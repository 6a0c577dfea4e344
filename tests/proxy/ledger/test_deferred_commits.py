"""The ledger's commits in the event loop's next pass (``proxy.deferred``): a turn is
added after its answer is written, and every plan sees every committed turn, so plans
are what they would be with each commit run at once."""

from __future__ import annotations

import asyncio

import pytest
from transformers import PreTrainedTokenizerBase

from proxy.canonical import Message, ToolCall
from proxy.ledger import LedgerBook, PromptPlan
from proxy.ledger.book import LedgerBook as Book
from tests.proxy.ledger.conftest import SYSTEM, Driver, request


def _session(driver: Driver) -> list[PromptPlan]:
    """A tool loop, a re-sent request, and an edit: every kind of plan the ledger makes."""
    call = ToolCall(id="call_1", name="bash", arguments='{"command": "ls"}')
    first = Message("assistant", "", tool_calls=(call,))
    result = Message("tool", "a.txt", tool_call_id="call_1")
    second = Message("assistant", "Done.")
    messages: tuple[Message, ...] = (SYSTEM, Message("user", "List the files."))
    driver.turn(request(*messages), first, turn_id="t1")
    messages = (*messages, first, result)
    driver.turn(request(*messages), second, turn_id="t2")
    driver.turn(request(*messages), second, turn_id="t3")  # the same request again
    edited = (SYSTEM, Message("user", "List the files, please."))
    driver.turn(request(*edited), first, turn_id="t4")
    return driver.plans


async def test_a_ledger_in_a_loop_plans_as_if_each_commit_ran_at_once(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    at_once = _session(Driver(LedgerBook(tokenizer), tokenizer, session_id="s"))
    # Every turn in one pass of the loop: each plan comes before any commit has run.
    deferred = _session(Driver(LedgerBook(tokenizer), tokenizer, session_id="s"))
    assert [p.classification for p in at_once] == ["root", "extend", "extend", "fork"]
    assert deferred == at_once


async def test_a_ledger_commit_adds_the_turn_after_the_callers_pass(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    added: list[str] = []
    original = Book._add

    def spy(self: Book, tree: object, **fields: object) -> None:
        added.append(str(fields["turn_id"]))
        original(self, tree, **fields)  # type: ignore[arg-type]

    monkeypatch.setattr(Book, "_add", spy)
    book = LedgerBook(tokenizer)
    driver = Driver(book, tokenizer, session_id="s")
    driver.turn(request(SYSTEM, Message("user", "hi")), Message("assistant", "hello"), turn_id="t1")
    assert added == []  # the caller's answer goes out first
    await asyncio.sleep(0)
    assert added == ["t1"]
    assert book.size("s") == 1
