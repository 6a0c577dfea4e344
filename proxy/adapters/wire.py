"""Pydantic plumbing shared by the wire adapters' request models.

Owns the base model of every wire request model (strict types, unknown fields allowed and
kept, frozen), the shape discriminator for "string or array or object" unions, and the
mapping of a pydantic ``ValidationError`` to one ``InvalidRequest`` whose ``param`` is the
JSON path of the first offending field (``messages[0].content[1]``). It knows no protocol.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Discriminator, ValidationError
from pydantic_core import ErrorDetails

from kernel.errors import InvalidRequest

# Union members are tagged with names starting with "~" so that the JSON path of a validation
# error can drop them: pydantic puts the tag into the error location.
_UNION_TAG = "~"


class Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


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


def ignored_extras(node: object, path: str, found: set[str]) -> None:
    """Add the path of every unknown field under ``node`` (list indices as ``[]``)."""
    if isinstance(node, BaseModel):
        for key in node.model_extra or {}:
            found.add(f"{path}.{key}" if path else key)
        for name in type(node).model_fields:
            ignored_extras(getattr(node, name), f"{path}.{name}" if path else name, found)
    elif isinstance(node, list):
        for item in node:
            ignored_extras(item, f"{path}[]", found)
