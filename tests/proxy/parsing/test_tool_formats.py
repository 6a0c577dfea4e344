"""The two block formats, read the way SGLang 0.5.23's detectors read them (issue 14).

The differential tests (``test_sglang_differential.py``) run SGLang's own code on the same
texts; these pin each rule, so a failure names the rule that broke.
"""

from __future__ import annotations

import json

import pytest

from proxy.canonical import JsonValue, ToolSpec
from proxy.parsing.schema_types import declared_type
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
        "optional": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "either": {"oneOf": [{"type": "boolean"}, {"type": "boolean"}]},
        "mixed": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "level": {"enum": [1, 2, 3]},
        "mode": {"enum": ["fast", "slow"]},
        "both": {"allOf": [{"description": "x"}, {"type": "integer"}]},
        "nested": {"properties": {"a": {"type": "string"}}},
        "listed": {"items": {"type": "string"}},
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


def coder_args(body: str, *, closed: bool = True) -> dict[str, object]:
    (parsed,) = parse_block(ToolParser.QWEN3_CODER, body, TOOLS, closed=closed)
    assert parsed.name == "bash"
    result = json.loads(parsed.arguments)
    assert isinstance(result, dict)
    return result


# -- qwen3 (SGLang's qwen25) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('\n{"name": "bash", "arguments": {"path": "a b", "n": 1}}\n', {"path": "a b", "n": 1}),
        ('\n{"name": "bash", "arguments": "{\\"path\\": \\"x\\"}"}\n', {"path": "x"}),
        ('\n{"name": "noop"}\n', {}),
        ('\n{"arguments": {"q": "日本語 🎌"}, "name": "bash"}\n', {"q": "日本語 🎌"}),
        ('\n{"name": "bash", "parameters": {"path": "p"}}\n', {"path": "p"}),
        ('\n{"name": "bash", "parameters": {}, "arguments": {"path": "a"}}\n', {"path": "a"}),
    ],
)
def test_qwen3_well_formed(body: str, expected: dict[str, object]) -> None:
    (parsed,) = parse_block(ToolParser.QWEN3, body, TOOLS)
    assert json.loads(parsed.arguments) == expected


def test_qwen3_keeps_non_ascii_unescaped() -> None:
    body = '\n{"name": "bash", "arguments": {"q": "é"}}\n'
    assert parse_block(ToolParser.QWEN3, body, TOOLS) == (ParsedCall("bash", '{"q": "é"}'),)


def test_qwen3_a_list_is_one_call_each_and_unknown_tools_are_skipped() -> None:
    body = '\n[{"name": "bash", "arguments": {"path": "a"}}, {"name": "rm"}, {"name": "noop"}]\n'
    assert parse_block(ToolParser.QWEN3, body, TOOLS) == (
        ParsedCall("bash", '{"path": "a"}'),
        ParsedCall("noop", "{}"),
    )


@pytest.mark.parametrize(
    "body",
    [
        '\n{"name": "bash", "arguments": {"path": }\n',  # invalid JSON
        '\n{"name": "rm_rf", "arguments": {}}\n',  # unknown tool
        '\n{"arguments": {}}\n',  # missing name
        '\n{"name": 3, "arguments": {}}\n',
        '\n["bash", {}]\n',
        '\n{"name": "bash", "arguments": "not json"}\n',
        '\n{"name": "bash", "arguments": "[1, 2]"}\n',  # a string, but not of an object
        '\n{"name": "bash", "arguments": [1, 2]}\n',
        '{"name": "bash", "arguments": {}}',  # SGLang wants the newlines around the object
        "\n\n",
    ],
)
def test_qwen3_malformed(body: str) -> None:
    assert parse_block(ToolParser.QWEN3, body, TOOLS) == ()


def test_qwen3_a_block_left_open_holds_no_call() -> None:
    body = '\n{"name": "bash", "arguments": {}}\n'
    assert parse_block(ToolParser.QWEN3, body, TOOLS, closed=False) == ()


# -- qwen3_coder: typing ---------------------------------------------------------------------


def test_coder_types_values_by_the_schema() -> None:
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


def test_coder_reads_what_the_real_templates_write() -> None:
    """The Qwen3-Coder and Qwen3.5 templates render non-strings with ``| string``:
    Python's True/False, and mappings and lists as JSON (or Python reprs)."""
    body = coder(
        ("force", "True"),
        ("either", "False"),
        ("optional", "12"),
        ("env", "{'A': True, 'B': None}"),
        ("argv", "['ls', '-l']"),
        ("level", "2"),
        ("mode", "fast"),
        ("both", "3"),
        ("nested", '{"a": "b"}'),
        ("listed", '["x"]'),
        ("mixed", "5"),
    )
    assert coder_args(body) == {
        "force": True,
        "either": False,
        "optional": 12,
        "env": {"A": True, "B": None},
        "argv": ["ls", "-l"],
        "level": 2,
        "mode": "fast",
        "both": 3,
        "nested": {"a": "b"},
        "listed": ["x"],
        "mixed": "5",  # integer or string: SGLang keeps the string
    }


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("number", "5", 5),  # no "." or "e": a whole number stays an int
        ("number", "5.0", 5.0),
        ("number", "1e3", 1000.0),
        ("number", "nan", "nan"),  # JSON cannot hold it: the sampled text stays
        ("integer", "soon", "soon"),
        ("boolean", "yes", False),  # SGLang: anything but "true" is false
        ("string", "null", None),  # null is null whatever the declared type
        ("string", "NULL", None),
        ("object", "{broken", "{broken"),
        ("object", "(1, 2)", [1, 2]),  # a Python tuple is a JSON list
        ("array", "{1, 2}", "{1, 2}"),  # a Python set: no JSON holds it
        ("weird", "[1, 'a']", [1, "a"]),  # any other type tries a Python literal
        ("weird", "plain text", "plain text"),
    ],
)
def test_coder_value_rules(kind: str, value: str, expected: JsonValue) -> None:
    tool = ToolSpec("bash", "x", {"type": "object", "properties": {"v": {"type": kind}}})
    (parsed,) = parse_block(ToolParser.QWEN3_CODER, coder(("v", value)), {"bash": tool})
    assert json.loads(parsed.arguments) == {"v": expected}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": ["null", "number"]}, "number"),
        ({"type": ["null"]}, "string"),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "integer"),
        ({"anyOf": [{"type": "integer"}, {"type": "number"}]}, "integer"),
        ({"oneOf": [{"type": "array"}, {"type": "array"}]}, "array"),
        ({"enum": [True, False]}, "boolean"),
        ({"enum": [1, "a"]}, "string"),
        ({"enum": []}, "string"),
        ({"allOf": [{"type": "string"}]}, "string"),
        ({"properties": {}}, "object"),
        ({"items": {}}, "array"),
        ({"description": "nothing"}, None),
        ("not a schema", None),
    ],
)
def test_declared_type(schema: JsonValue, expected: str | None) -> None:
    assert declared_type(schema) == expected


# -- qwen3_coder: structure ------------------------------------------------------------------


def test_coder_string_loses_exactly_one_newline_on_each_side() -> None:
    body = "<function=bash>\n<parameter=path>\n\n  two lines\nhere\n\n</parameter>\n</function>"
    assert coder_args(body) == {"path": "\n  two lines\nhere\n"}


def test_coder_string_without_surrounding_newlines_is_kept_whole() -> None:
    body = "<function=bash><parameter=path>a.txt</parameter></function>"
    assert coder_args(body) == {"path": "a.txt"}


def test_coder_a_value_ends_at_the_first_closing_tag_or_the_next_parameter() -> None:
    body = (
        "<function=bash>\n<parameter=path>\n<a>\n</parameter> inside\n</parameter>\n"
        "<parameter=timeout>\n1\n<parameter=ratio>\n0.5\n</function>"
    )
    assert coder_args(body) == {"path": "<a>", "timeout": 1, "ratio": 0.5}


def test_coder_ignores_text_between_tags() -> None:
    body = "<function=bash>\nstray text\n<parameter=path>\nx\n</parameter>\njunk\n</function>"
    assert coder_args(body) == {"path": "x"}


def test_coder_accepts_a_missing_function_end_and_no_parameters() -> None:
    assert coder_args("\n<function=bash>\n<parameter=path>\nx\n</parameter>\n") == {"path": "x"}
    parsed = parse_block(ToolParser.QWEN3_CODER, "<function=noop>\n</function>", TOOLS)
    assert parsed == (ParsedCall("noop", "{}"),)


def test_coder_a_block_left_open_still_holds_its_call() -> None:
    assert coder_args("\n<function=bash>\n<parameter=path>\nx\n", closed=False) == {"path": "x"}


def test_coder_one_block_may_hold_several_functions() -> None:
    body = coder(("path", "a")) + coder(("timeout", "2"), name="noop")
    assert parse_block(ToolParser.QWEN3_CODER, body, TOOLS) == (
        ParsedCall("bash", '{"path": "a"}'),
        ParsedCall("noop", '{"timeout": "2"}'),  # noop declares nothing: a string
    )


def test_coder_calls_an_unknown_tool_with_string_values() -> None:
    parsed = parse_block(ToolParser.QWEN3_CODER, coder(("n", "1"), name="other"), TOOLS)
    assert parsed == (ParsedCall("other", '{"n": "1"}'),)


@pytest.mark.parametrize(
    "body",
    [
        "\n<parameter=path>\nx\n</parameter>\n",  # no function at all
        '{"name": "bash", "arguments": {}}',  # the other format
        "<function=bash\n</function>",  # the name never closed
    ],
)
def test_coder_malformed(body: str) -> None:
    assert parse_block(ToolParser.QWEN3_CODER, body, TOOLS) == ()
