"""A turn's book-keeping after its answer (``proxy.deferred``): the ledger's and the
conversations' commits run in the event loop's next pass, every read applies them first,
and the turn's answer-independent work (its output parser, its request as stored) is done
while the engine generates, not on the answer's path."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from proxy.canonical import Message
from proxy.conversations import ConversationBook
from proxy.deferred import Deferred
from proxy.parsing.parser import OutputParser
from proxy.pipeline import Pipeline
from proxy.stream_client import BackendConnection
from tests.proxy.conftest import DEFAULT_REPLY, running_proxy
from tests.proxy.ledger.conftest import SYSTEM, request
from tests.support.tap import BackendTap


def test_without_a_loop_a_commit_runs_at_once() -> None:
    done: list[int] = []
    deferred = Deferred("test")
    deferred.later(lambda: done.append(1))
    assert done == [1]
    assert len(deferred) == 0


async def test_in_a_loop_commits_wait_for_the_next_pass_or_a_read() -> None:
    done: list[int] = []
    deferred = Deferred("test")
    deferred.later(lambda: done.append(1))
    deferred.later(lambda: done.append(2))
    assert done == []  # nothing on the caller's path
    await asyncio.sleep(0)
    assert done == [1, 2]  # the loop's next pass, in order

    deferred.later(lambda: done.append(3))
    deferred.settle()  # what a reader does first
    assert done == [1, 2, 3]
    await asyncio.sleep(0)
    assert done == [1, 2, 3]  # applied once


async def test_a_failing_commit_is_logged_and_the_rest_still_apply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[int] = []
    deferred = Deferred("the test book")

    def broken() -> None:
        raise ValueError("a bug in a commit")

    deferred.later(broken)
    deferred.later(lambda: done.append(1))
    with caplog.at_level(logging.ERROR, logger="proxy.deferred"):
        deferred.settle()  # never raises into the reader
    assert done == [1]
    assert "the test book: a deferred commit failed" in caplog.text
    assert "a bug in a commit" in caplog.text  # its traceback


async def test_a_conversation_commit_adds_the_turn_after_the_callers_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    added: list[str] = []
    original = ConversationBook._add

    def spy(self: ConversationBook, session: object, turn_id: str, *rest: object) -> None:
        added.append(turn_id)
        original(self, session, turn_id, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(ConversationBook, "_add", spy)
    book = ConversationBook()
    asked = request(SYSTEM, Message("user", "hi"))
    book.commit("s", "t1", None, None, asked, Message("assistant", "hello"))
    assert added == []  # the caller's answer goes out first
    await asyncio.sleep(0)
    assert added == ["t1"]


async def test_conversations_encode_against_a_parent_committed_in_the_same_pass() -> None:
    book = ConversationBook()
    asked = request(SYSTEM, Message("user", "hi"))
    answer = Message("assistant", "hello")
    book.commit("s", "t1", None, None, asked, answer)
    follow = request(*asked.messages, answer, Message("user", "and then?"))
    encoded = book.encode("s", "t1", follow)  # the commit has not run on its own yet
    assert encoded.inherited == 3  # the parent's two messages and its answer
    assert book.get("s", "t1") == (asked, answer)


def test_a_turns_parser_and_stored_request_are_built_while_the_engine_works(
    tap: BackendTap, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    send, parser, encode = BackendConnection.send, Pipeline.parser, Pipeline.encode_request
    feed = OutputParser.feed

    def spy_send(self: BackendConnection, head: bytes, body: bytes) -> None:
        send(self, head, body)
        if b"/generate" in head:
            events.append("request written")

    def spy_parser(self: Pipeline, turn: object) -> OutputParser:
        events.append("parser built")
        return parser(self, turn)  # type: ignore[arg-type]

    def spy_encode(self: Pipeline, turn: object, parent: str | None) -> object:
        events.append("request encoded")
        return encode(self, turn, parent)  # type: ignore[arg-type]

    def spy_feed(self: OutputParser, ids: object) -> object:
        if "tokens parsed" not in events:
            events.append("tokens parsed")
        return feed(self, ids)  # type: ignore[arg-type]

    monkeypatch.setattr(BackendConnection, "send", spy_send)
    monkeypatch.setattr(Pipeline, "parser", spy_parser)
    monkeypatch.setattr(Pipeline, "encode_request", spy_encode)
    monkeypatch.setattr(OutputParser, "feed", spy_feed)
    with running_proxy(tap.url, model_dir, tmp_path, None) as proxy:
        session = proxy.new_session()
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        url = f"{session['openai_base_url']}/chat/completions"
        for turn in range(2):
            events.clear()
            answer = httpx.post(url, json=body, timeout=60)
            answer.raise_for_status()
            assert answer.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY
            if turn == 0:
                # The backend's first connection is opened first: the draft is built while
                # it connects, still before the engine's answer.
                assert events[-1] == "tokens parsed"
        turns = proxy.trajectory(session["id"])["turns"]
    assert [turn["status"] for turn in turns] == ["completed", "completed"]
    # On the pooled connection: after the engine's request is written, before its answer.
    assert events == ["request written", "parser built", "request encoded", "tokens parsed"]
