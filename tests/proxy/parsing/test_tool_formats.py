from __future__ import annotations

import json

import pytest

from proxy.canonical import JsonValue, ToolSpec
from proxy.parsing.tool_formats import ParsedCall, parse_block
from proxy.settings import ToolParser

SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "timeout": {"type": "integer"},
        "ratio": {"type": "number"},
        "force": {"type": "boolean"},
        "env": {"type": "object"},
        "argv": {"type": "array"},
        "nothing": {"type": "null"},
        "maybe": {"type": ["integer", "null"]},
        "untyped": {},
    },
}
TOOLS = {
    "bash": ToolSpec("bash", "run a command", SCHEMA),
    "noop": ToolSpec("noop", "no parameters"),
}


def coder(*parameters: tuple[str, str], name: str = "bash") -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters)
    return f"\n<function={name}>\n{body}</function>\n"


def coder_args(body: str) -> dict[str, object]:
    parsed = parse_block(ToolParser.QWEN3_CODER, body, TOOLS)
    assert parsed is not None
    assert parsed.name == "bash"
    result = json.loads(parsed.arguments)
    assert isinstance(result, dict)
    return result


# -- qwen3 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('\n{"name": "bash", "arguments": {"path": "a b", "n": 1}}\n', {"path": "a b", "n": 1}),
        ('{"name": "bash", "arguments": "{\\"path\\": \\"x\\"}"}', {"path": "x"}),
        ('{"name": "noop"}', {}),
        ('{"arguments": {"q": "日本語 🎌"}, "name": "bash"}', {"q": "日本語 🎌"}),
    ],
)
def test_qwen3_well_formed(body: str, expected: dict[str, object]) -> None:
    parsed = parse_block(ToolParser.QWEN3, body, TOOLS)
    assert parsed is not None
    assert json.loads(parsed.arguments) == expected


def test_qwen3_keeps_non_ascii_unescaped() -> None:
    parsed = parse_block(ToolParser.QWEN3, '{"name": "bash", "arguments": {"q": "é"}}', TOOLS)
    assert parsed == ParsedCall("bash", '{"q": "é"}')


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "bash", "arguments": {"path": }',  # invalid JSON
        '{"name": "rm_rf", "arguments": {}}',  # unknown tool
        '{"arguments": {}}',  # missing name
        '{"name": 3, "arguments": {}}',
        '["bash", {}]',
        '{"name": "bash", "arguments": "not json"}',
        '{"name": "bash", "arguments": "[1, 2]"}',  # a string, but not of an object
        '{"name": "bash", "arguments": [1, 2]}',
        "",
    ],
)
def test_qwen3_malformed(body: str) -> None:
    assert parse_block(ToolParser.QWEN3, body, TOOLS) is None


# -- qwen3_coder ---------------------------------------------------------------------------


def test_coder_coerces_by_schema_type() -> None:
    body = coder(
        ("path", "/tmp/x"),
        ("timeout", "30"),
        ("ratio", "0.5"),
        ("force", "true"),
        ("env", '{"A": "1"}'),
        ("argv", '["ls", "-l"]'),
        ("nothing", "null"),
        ("maybe", "7"),
        ("untyped", "42"),
        ("unknown", "[1]"),
    )
    assert coder_args(body) == {
        "path": "/tmp/x",
        "timeout": 30,
        "ratio": 0.5,
        "force": True,
        "env": {"A": "1"},
        "argv": ["ls", "-l"],
        "nothing": None,
        "maybe": 7,
        "untyped": "42",
        "unknown": "[1]",
    }


def test_coder_string_loses_exactly_one_newline_on_each_side() -> None:
    body = "<function=bash>\n<parameter=path>\n\n  two lines\nhere\n\n</parameter>\n</function>"
    assert coder_args(body) == {"path": "\n  two lines\nhere\n"}


def test_coder_string_without_surrounding_newlines_is_kept_whole() -> None:
    body = "<function=bash><parameter=path>a.txt</parameter></function>"
    assert coder_args(body) == {"path": "a.txt"}


def test_coder_unparseable_typed_value_falls_back_to_the_string() -> None:
    assert coder_args(coder(("timeout", "soon"), ("env", "{broken"))) == {
        "timeout": "soon",
        "env": "{broken",
    }


def test_coder_value_may_contain_a_closing_parameter_tag() -> None:
    xml = "<a>\n</parameter> inside\n</a>"
    assert coder_args(coder(("path", xml), ("timeout", "1"))) == {"path": xml, "timeout": 1}


def test_coder_accepts_a_missing_function_end_and_no_parameters() -> None:
    assert coder_args("\n<function=bash>\n<parameter=path>\nx\n</parameter>\n") == {"path": "x"}
    parsed = parse_block(ToolParser.QWEN3_CODER, "<function=noop>\n</function>", TOOLS)
    assert parsed == ParsedCall("noop", "{}")


@pytest.mark.parametrize(
    "body",
    [
        coder(("path", "x"), name="unknown_tool"),
        "\n<parameter=path>\nx\n</parameter>\n",  # no function at all
        '{"name": "bash", "arguments": {}}',  # the other format
        "<function=bash>\n<parameter=path>\nx\n</function>",  # parameter never closed
        "<function=bash>\nstray text\n<parameter=path>\nx\n</parameter>\n</function>",
        coder(("path", "x")) + "trailing junk",
    ],
)
def test_coder_malformed(body: str) -> None:
    assert parse_block(ToolParser.QWEN3_CODER, body, TOOLS) is None
