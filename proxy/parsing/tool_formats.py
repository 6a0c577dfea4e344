"""The two tool-call block formats: the text between ``<tool_call>`` and ``</tool_call>``.

Owns ``parse_block(parser, body, tools, closed=True)``, which turns one block body into the
calls it holds (``ParsedCall``: the tool name and its arguments as JSON text), or ``()``
when it holds none (the caller keeps the raw text; a malformed call is model output, not
an error, so nothing is raised). Both formats read a block the way SGLang 0.5.23's
detectors do (``qwen25_detector.py``, ``qwen3_coder_detector.py``), which
``tests/proxy/parsing/test_sglang_differential.py`` checks against SGLang itself:

- ``qwen3`` (SGLang's ``qwen25``): ``{"name": "f", "arguments": {...}}\\n`` (the block
  opened with ``<tool_call>\\n``, see ``tool_calls``; the newline before the closing tag is
  required too), or a JSON list of such objects (one call each). ``parameters`` stands for
  ``arguments`` when that is missing or empty; no arguments means ``{}``. A call to a tool
  not in ``tools`` is skipped.
- ``qwen3_coder``: each ``<function=NAME>`` up to ``</function>`` (or the block's end) is a
  call, also to a tool not in ``tools``; each ``<parameter=KEY>`` ends at the first
  ``</parameter>``, ``<parameter=`` or ``</function>``; its value loses one leading and one
  trailing newline and is typed by the tool's schema (``coerce_value``). Text between the
  tags is ignored. A block still open when the output ends holds calls too (SGLang's
  non-streaming fallback); an open JSON block holds none.

Where SGLang would hand a harness arguments that are not a JSON object, this keeps the
block as text instead: JSON ``arguments`` that are a string (parsed as the object it holds,
where SGLang sends the string) or not an object; an XML value that no JSON can hold
(``nan``, a Python set) stays the string it was sampled as.

Arguments are serialized with ``json.dumps(..., ensure_ascii=False)``.
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.canonical import JsonValue, ToolSpec
from proxy.parsing.schema_types import declared_type
from proxy.settings import ToolParser


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str


def parse_block(
    parser: ToolParser, body: str, tools: Mapping[str, ToolSpec], *, closed: bool = True
) -> tuple[ParsedCall, ...]:
    if parser is ToolParser.QWEN3_CODER:
        return _parse_coder(body, tools)
    return _parse_json(body, tools) if closed else ()


# -- qwen3 (JSON) -------------------------------------------------------------------------


def _parse_json(body: str, tools: Mapping[str, ToolSpec]) -> tuple[ParsedCall, ...]:
    if not body.endswith("\n"):
        return ()  # SGLang matches "<tool_call>\n" ... "\n</tool_call>" only
    try:
        payload = json.loads(body.strip())
    except ValueError:
        return ()
    actions = payload if isinstance(payload, list) else [payload]
    if not all(isinstance(action, dict) for action in actions):
        return ()
    calls: list[ParsedCall] = []
    for action in actions:
        name = action.get("name")
        if not isinstance(name, str) or name not in tools:
            continue  # SGLang skips a call to an undefined tool
        arguments = action.get("parameters") or action.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return ()
        if not isinstance(arguments, dict):
            return ()
        calls.append(ParsedCall(name, json.dumps(arguments, ensure_ascii=False)))
    return tuple(calls)


# -- qwen3_coder (XML-ish) ----------------------------------------------------------------

_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.S)
_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.S)


def _parse_coder(body: str, tools: Mapping[str, ToolSpec]) -> tuple[ParsedCall, ...]:
    calls: list[ParsedCall] = []
    for whole, tail in _FUNCTION.findall(body):
        function = whole or tail
        if ">" not in function:
            continue
        name, _, parameters = function.partition(">")
        schema = _parameter_schemas(tools.get(name))
        arguments: dict[str, JsonValue] = {}
        for parameter in _PARAMETER.findall(parameters):
            if ">" not in parameter:
                continue
            key, _, value = parameter.partition(">")
            value = value.removeprefix("\n").removesuffix("\n")
            arguments[key] = coerce_value(value, key, schema)
        calls.append(ParsedCall(name, json.dumps(arguments, ensure_ascii=False)))
    return tuple(calls)


def _parameter_schemas(tool: ToolSpec | None) -> Mapping[str, JsonValue]:
    """What SGLang types the parameters by: the schema's ``properties`` (found inside
    ``anyOf``/``oneOf``/``allOf`` branches when the top level has none), or, for a schema
    without any, the schema itself."""
    if tool is None:
        return {}
    properties = _properties(tool.parameters)
    if properties or "properties" in tool.parameters:
        return properties
    return tool.parameters


def _properties(schema: JsonValue) -> dict[str, JsonValue]:
    if not isinstance(schema, dict):
        return {}
    direct = schema.get("properties")
    if isinstance(direct, dict):
        return direct
    merged: dict[str, JsonValue] = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        for branch in branches if isinstance(branches, list) else ():
            for key, value in _properties(branch).items():
                merged.setdefault(key, value)
    return merged


_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_BOOLEAN_TYPES = frozenset({"boolean", "bool", "binary"})


def coerce_value(value: str, key: str, schemas: Mapping[str, JsonValue]) -> JsonValue:
    """A parameter's value as SGLang's ``qwen3_coder`` types it: ``null`` is null whatever
    the type; a parameter the schema does not declare stays a string; then by the type
    ``declared_type`` infers (``string`` when none): integers and numbers parsed (a number
    written without ``.`` or ``e`` that is whole becomes an int), booleans true exactly
    when the value is ``true`` in any case (the templates write Python's ``True``), objects
    and arrays parsed as JSON, then as a Python literal (which any other type tries
    first), falling back to the string."""
    if value.lower() == "null":
        return None
    if key not in schemas:
        return value
    kind = declared_type(schemas[key])
    kind = "string" if kind is None else str(kind).strip().lower()
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INTEGER_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        return _number(value)
    if kind in _BOOLEAN_TYPES:
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            parsed: JsonValue = json.loads(value)
            return parsed
        except ValueError:
            pass
    return _literal(value)


def _number(value: str) -> JsonValue:
    try:
        number = float(value)
    except ValueError:
        return value
    if not math.isfinite(number):
        return value  # JSON has no NaN or infinity
    whole = "." not in value and "e" not in value.lower()
    return int(number) if whole and number.is_integer() else number


def _literal(value: str) -> JsonValue:
    try:
        with warnings.catch_warnings():
            # "\d" in a sampled value is an invalid escape: Python keeps the backslash and
            # warns; the value is right, the warning noise.
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            parsed = ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return value
    try:
        json.dumps(parsed, allow_nan=False)
    except (TypeError, ValueError):
        return value  # a set, bytes, a complex number, nan: no JSON holds it
    return _as_json(parsed)


def _as_json(value: object) -> JsonValue:
    # Tuples become lists and non-string keys strings, as json.dumps would write them.
    decoded: JsonValue = json.loads(json.dumps(value))
    return decoded
