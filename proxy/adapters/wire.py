"""Pydantic plumbing shared by the wire adapters' request models.

Owns the base model of every wire request model (strict types, unknown fields allowed and
kept, frozen), the shape discriminator for "string or array or object" unions, and the
mapping of a pydantic ``ValidationError`` to one ``InvalidRequest`` whose ``param`` is the
JSON path of the first offending field (``messages[0].content[1]``). It knows no protocol.

It also owns the values no request may carry, whatever its protocol (``refuse_unstorable``
walks a parsed body, unknown fields and free-form JSON included): integers outside int64
(no upstream API takes them, orjson cannot write them, so such a turn could be served but
never recorded), numbers that overflowed to infinity, and NUL in a field name. Given the
JSON text a body was parsed from, it walks the body only when the text could spell one of
them (``_may_be_unstorable``); a long conversation costs a few searches of its bytes
instead of a walk of every value. ``Name`` is
a string without NUL, for the values that become database text (the model name, stop
strings): Postgres text and JSONB cannot hold U+0000.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Annotated, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, ValidationError
from pydantic_core import ErrorDetails

from kernel.errors import InvalidRequest

# Union members are tagged with names starting with "~" so that the JSON path of a validation
# error can drop them: pydantic puts the tag into the error location.
_UNION_TAG = "~"


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# What JSON text must contain to parse into a value ``refuse_unstorable`` refuses: an
# integer outside int64 has 19 digits or more; a number that overflows a float has them or
# a three-digit exponent; the parser's non-finite literals are spelled ``NaN`` and
# ``Infinity``; a NUL in a name is the escape ``\u0000`` (or the raw byte JSON forbids).
# Searched for in the text with every digit written 0 and ``E`` as ``e``: a few byte
# searches, where a regular expression took 35 ns a byte.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789E", b"000000000e")
_NEEDS_DIGITS = (b"0" * 19, b"e000", b"e+000", b"e-000", b"\\u0000")


def _may_be_unstorable(source: bytes) -> bool:
    if b"\x00" in source or b"NaN" in source or b"Infinity" in source:
        return True
    digits = source.translate(_DIGITS_AS_ZERO)
    return b"000" in digits and any(needle in digits for needle in _NEEDS_DIGITS)


class Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain the NUL character (U+0000)")
    return value


Name = Annotated[str, AfterValidator(_no_nul)]


def _shape_tag(value: object) -> str | None:
    if isinstance(value, str):
        return "~str"
    if isinstance(value, list):
        return "~list"
    if isinstance(value, dict):
        return "~object"
    return None


def one_of(message: str) -> Discriminator:
    """Discriminate a union by JSON shape; tag members ``~str``, ``~list`` or ``~object``."""
    return Discriminator(_shape_tag, custom_error_type="invalid_type", custom_error_message=message)


def json_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith(_UNION_TAG):
            path += f".{part}" if path else part
    return path


def invalid(error: ValidationError) -> InvalidRequest:
    details: list[ErrorDetails] = error.errors(include_url=False)
    first = details[0]
    if first["type"] == "json_invalid":
        detail = first["msg"].removeprefix("Invalid JSON: ")
        return InvalidRequest(f"could not parse the JSON body: {detail}")
    param = json_path(first["loc"])
    if not param:
        return InvalidRequest("the request body must be a JSON object")
    if first["type"] == "missing":
        message = f"missing required parameter '{param}'"
    else:
        reason = first["msg"][:1].lower() + first["msg"][1:]
        message = f"invalid value for '{param}': {reason}"
    if len(details) > 1:
        message += f" (and {len(details) - 1} more problem(s))"
    return InvalidRequest(message, param=param)


def missing(param: str) -> InvalidRequest:
    return InvalidRequest(f"missing required parameter '{param}'", param=param)


def _may_nest(annotation: object) -> bool:
    """Whether a field of this type can hold a model or a list (where unknown fields
    can be)."""
    if isinstance(annotation, type):
        return issubclass(annotation, BaseModel | list | tuple)
    origin = get_origin(annotation)
    if origin is not None and _may_nest(origin):
        return True
    return any(_may_nest(arg) for arg in get_args(annotation))


@cache
def _nesting_fields(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(name for name, field in model.model_fields.items() if _may_nest(field.annotation))


def ignored_extras(node: object, path: str, found: set[str]) -> None:
    """Add the path of every unknown field under ``node`` (list indices as ``[]``). Only
    the fields whose type can hold a model or a list are descended into."""
    if isinstance(node, BaseModel):
        for key in node.model_extra or ():
            found.add(f"{path}.{key}" if path else key)
        for name in _nesting_fields(type(node)):
            value = getattr(node, name)
            if isinstance(value, BaseModel | list):
                ignored_extras(value, f"{path}.{name}" if path else name, found)
    elif isinstance(node, list):
        inner = f"{path}[]"
        for item in node:
            if isinstance(item, BaseModel | list):
                ignored_extras(item, inner, found)


def refuse_unstorable(
    node: object, path: str = "", *, json_column: bool = False, source: bytes | None = None
) -> None:
    """Raise ``InvalidRequest`` naming the first value under ``node`` that no turn may
    carry (see the module docstring); bodies are walked once, in document order.

    ``source``: the JSON text ``node`` was parsed from; the walk is skipped when the text
    cannot hold such a value.

    ``json_column``: the value is stored in a JSON column as it is (``reward_details``),
    so strings may not hold NUL either, and floats must stay under 2**63 in magnitude:
    Postgres keeps ``2e19`` as the integer 20000000000000000000, which no 64-bit reader
    takes back."""
    if source is not None and not json_column and not _may_be_unstorable(source):
        return
    if isinstance(node, BaseModel):
        for name, value in vars(node).items():  # the fields' values, in field order
            where = f"{path}.{name}" if path else name
            refuse_unstorable(value, where, json_column=json_column)
        for key, value in (node.model_extra or {}).items():
            _check_key(key, path)
            refuse_unstorable(value, f"{path}.{key}" if path else key, json_column=json_column)
    elif isinstance(node, dict):
        for key, value in node.items():
            _check_key(str(key), path)
            where = f"{path}.{key}" if path else str(key)
            refuse_unstorable(value, where, json_column=json_column)
    elif isinstance(node, list | tuple):
        for index, item in enumerate(node):
            refuse_unstorable(item, f"{path}[{index}]", json_column=json_column)
    elif isinstance(node, bool):
        return
    elif isinstance(node, int):
        if not INT64_MIN <= node <= INT64_MAX:
            raise InvalidRequest(
                f"invalid value for '{path}': integers must fit in 64 bits", param=path
            )
    elif isinstance(node, float):
        if not math.isfinite(node):
            raise InvalidRequest(f"invalid value for '{path}': numbers must be finite", param=path)
        if json_column and abs(node) >= 2.0**63:
            raise InvalidRequest(
                f"invalid value for '{path}': numbers must be under 2**63 in magnitude",
                param=path,
            )
    elif isinstance(node, str) and json_column:
        _no_nul_in(node, path)


def _no_nul_in(value: str, path: str) -> None:
    if "\x00" in value:
        raise InvalidRequest(
            f"invalid value for '{path}': text must not contain NUL (U+0000)", param=path
        )


def _check_key(key: str, path: str) -> None:
    if "\x00" in key:
        where = path or "body"
        raise InvalidRequest(
            f"invalid field name under '{where}': names must not contain NUL (U+0000)",
            param=path or None,
        )
