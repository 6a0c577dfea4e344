"""The OpenAPI document (``/openapi.json``): every JSON request body described.

The routes read their bodies themselves (a size limit, then the adapter's own parser, so
errors come in each protocol's shape), so FastAPI cannot see their models. Owns
``json_body(model)``, the ``openapi_extra`` a route declares its body with, and
``describe(app)``, which builds the document once, moving each body schema's definitions
into ``components.schemas`` under a prefix of the model's module (the three adapters each
have a ``_Message``), and declaring the path parameters the routes read themselves. The
schemas are pydantic's own for the models that validate the bodies, so what the document
allows is what the routes accept (fuzzed by ``tests/proxy/test_fuzz.py``).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_DEFS = "x-lego-defs"


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    prefix = model.__module__.rsplit(".", 1)[-1] + "."
    schema = model.model_json_schema(ref_template=f"#/components/schemas/{prefix}{{model}}")
    definitions = {f"{prefix}{name}": value for name, value in schema.pop("$defs", {}).items()}
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        },
        _DEFS: definitions,
    }


def describe(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for path, operations in document.get("paths", {}).items():
            names = re.findall(r"{(\w+)}", path)
            for operation in operations.values():
                schemas.update(operation.pop(_DEFS, {}))
                declared = {p["name"] for p in operation.get("parameters", [])}
                operation.setdefault("parameters", []).extend(
                    {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                    for name in names
                    if name not in declared
                )
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]
