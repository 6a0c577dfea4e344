"""The recorded answer's one codec: the bytes every earlier version wrote, both ways, and
the assistant message a continuation inherits."""

from __future__ import annotations

import pytest

from kernel.errors import RecorderError
from recorder.answers import Answer, AnswerCall

CALL = AnswerCall("call_1", "bash", '{"command": "ls"}')
# What the pipeline wrote before this codec existed (``_Message.to_json``), byte for byte.
WRITTEN = (
    b'{"reasoning":"Look first.","content":"Here.","tool_calls":'
    b'[{"id":"call_1","name":"bash","arguments":"{\\"command\\": \\"ls\\"}"}]}'
)


def test_encode_writes_the_bytes_earlier_versions_wrote_and_decode_reads_them() -> None:
    answer = Answer(content="Here.", reasoning="Look first.", tool_calls=(CALL,))
    assert answer.encode() == WRITTEN
    assert Answer.decode(WRITTEN) == answer
    plain = Answer(content="Hi.")
    assert plain.encode() == b'{"reasoning":null,"content":"Hi.","tool_calls":[]}'
    assert Answer.decode(plain.encode()) == plain
    # Reasoning that came as empty deltas is "" when recorded, and stays so.
    assert Answer.decode(Answer(reasoning="").encode()).reasoning == ""


def test_a_row_written_before_the_column_was_filled_reads_as_the_empty_answer() -> None:
    assert Answer.decode(b"") == Answer()


@pytest.mark.parametrize(
    "data",
    [b"\x00\xffnot json", b"[1, 2]", b'{"tool_calls": [{"id": "c"}]}', b'{"tool_calls": [1]}'],
)
def test_what_is_not_an_answer_raises(data: bytes) -> None:
    with pytest.raises(RecorderError, match="recorded answer"):
        Answer.decode(data)


def test_as_message_is_the_assistant_message_a_harness_sends_back() -> None:
    answer = Answer.decode(WRITTEN)
    assert answer.as_message() == (
        b'{"role":"assistant","content":"Here.","reasoning":"Look first.","tool_calls":'
        b'[{"id":"call_1","name":"bash","arguments":"{\\"command\\": \\"ls\\"}"}],'
        b'"tool_call_id":null,"name":null}'
    )
    assert Answer().as_message() == (
        b'{"role":"assistant","content":"","reasoning":null,"tool_calls":[],'
        b'"tool_call_id":null,"name":null}'
    )
