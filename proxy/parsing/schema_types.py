"""The one type a JSON-schema property declares, as SGLang's tool parsers read it.

Owns ``declared_type(schema) -> JsonValue | None`` (SGLang 0.5.23's
``infer_type_from_json_schema`` rules, so the ``qwen3_coder`` format types values as the
backend's own parser would), first rule that applies:

1. ``type``: a string is the type; a list gives its first entry other than ``"null"``
   (``"string"`` for a list of nulls only).
2. ``anyOf`` (else ``oneOf``): the branches' types; one type if they agree, the non-null
   one of a ``[T, "null"]`` pair (``Optional[int]`` is an integer), ``"string"`` if any
   branch is a string, else the first branch's.
3. ``enum``: the type of its values when they share one (bool before integer), else
   ``"string"``; an empty enum is a string.
4. ``allOf``: the first branch whose type is not a string, else ``"string"``.
5. ``properties`` present: ``"object"``; ``items`` present: ``"array"``.

``None`` when nothing applies (the caller treats the value as a string).
"""

from __future__ import annotations

from proxy.canonical import JsonValue


def declared_type(schema: JsonValue) -> JsonValue | None:
    if not isinstance(schema, dict):
        return None
    if "type" in schema:
        found = _direct(schema["type"])
        if found is not None:
            return found
    branches = schema.get("anyOf") or schema.get("oneOf")
    if ("anyOf" in schema or "oneOf" in schema) and isinstance(branches, list):
        found = _union([t for b in branches if (t := declared_type(b))])
        if found is not None:
            return found
    values = schema.get("enum")
    if isinstance(values, list):
        kinds = {_value_type(v) for v in values}
        return kinds.pop() if len(kinds) == 1 else "string"
    parts = schema.get("allOf")
    if isinstance(parts, list):
        for part in parts:
            found = declared_type(part)
            if found and found != "string":
                return found
        return "string"
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def _direct(declared: JsonValue) -> JsonValue | None:
    if isinstance(declared, str):
        return declared
    if isinstance(declared, list) and declared:
        concrete = [t for t in declared if t != "null"]
        return concrete[0] if concrete else "string"
    return None  # an empty list or another value: the later rules decide


def _union(kinds: list[JsonValue]) -> JsonValue | None:
    if not kinds:
        return None
    distinct = {_key(k) for k in kinds}
    if len(distinct) == 1:
        return kinds[0]
    if len(distinct) == 2 and "null" in kinds:
        return next(k for k in kinds if k != "null")
    return "string" if "string" in kinds else kinds[0]


def _key(kind: JsonValue) -> str:
    # Branch types are strings in any sane schema; others are compared by their text.
    return kind if isinstance(kind, str) else repr(kind)


def _value_type(value: JsonValue) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
