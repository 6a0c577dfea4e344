"""The two tool-call block formats: the text between ``<tool_call>`` and ``</tool_call>``.

Owns ``parse_block(parser, body, tools)``, which turns one complete block body into a
``ParsedCall`` (the tool name and its arguments as JSON text), or ``None`` when the body is
not a well-formed call to one of ``tools`` (the caller keeps the raw text; a malformed call
is model output, not an error, so nothing is raised).

- ``qwen3``: ``{"name": "f", "arguments": {...}}`` (Hermes style). ``arguments`` may also be
  a JSON string that parses to an object; a missing ``arguments`` means ``{}``.
- ``qwen3_coder``: ``<function=NAME>`` then ``<parameter=KEY>\\nVALUE\\n</parameter>``
  blocks, then ``</function>``. Values are typed by the tool's JSON schema: a ``string``
  parameter keeps its text with exactly one leading and one trailing newline removed; other
  declared types are parsed as JSON and fall back to that string when they do not parse.
  Parameters without a declared type (unknown names included) stay strings.

Arguments are serialized with ``json.dumps(..., ensure_ascii=False)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.canonical import JsonValue, ToolSpec
from proxy.settings import ToolParser


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str


def parse_block(parser: ToolParser, body: str, tools: Mapping[str, ToolSpec]) -> ParsedCall | None:
    if parser is ToolParser.QWEN3_CODER:
        return _parse_coder(body, tools)
    return _parse_json(body, tools)


# -- qwen3 (JSON) -------------------------------------------------------------------------


def _parse_json(body: str, tools: Mapping[str, ToolSpec]) -> ParsedCall | None:
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("name")
    if not isinstance(name, str) or name not in tools:
        return None
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


# -- qwen3_coder (XML-ish) ----------------------------------------------------------------

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
# A value ends at the first "</parameter>" that is followed by the next parameter, the end
# of the function or the end of the block, so a value may itself contain "</parameter>".
_PARAMETER = re.compile(
    r"\s*<parameter=([^>\n]+)>(.*?)</parameter>(?=\s*(?:<parameter=|</function>|$))", re.S
)
_FUNCTION_END = re.compile(r"\s*(?:</function>\s*)?")


def _parse_coder(body: str, tools: Mapping[str, ToolSpec]) -> ParsedCall | None:
    head = _FUNCTION.match(body)
    if head is None:
        return None
    name = head.group(1).strip()
    tool = tools.get(name)
    if tool is None:
        return None
    arguments: dict[str, JsonValue] = {}
    position = head.end()
    while (parameter := _PARAMETER.match(body, position)) is not None:
        key = parameter.group(1).strip()
        arguments[key] = _coerce(parameter.group(2), _declared_types(tool, key))
        position = parameter.end()
    if _FUNCTION_END.fullmatch(body, position) is None:
        return None  # unparseable text between or after the parameters
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def _declared_types(tool: ToolSpec, key: str) -> frozenset[str]:
    properties = tool.parameters.get("properties")
    if not isinstance(properties, dict):
        return frozenset()
    schema = properties.get(key)
    if not isinstance(schema, dict):
        return frozenset()
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset((declared,))
    if isinstance(declared, list):
        return frozenset(t for t in declared if isinstance(t, str))
    return frozenset()


def _coerce(raw: str, types: frozenset[str]) -> JsonValue:
    text = raw.removeprefix("\n").removesuffix("\n")
    if not types or "string" in types:
        return text
    try:
        value: JsonValue = json.loads(text)
    except ValueError:
        return text
    return value
