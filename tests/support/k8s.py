"""Offline validation of Kubernetes objects against the pinned cluster version's schemas.

``k8s_errors(documents)`` checks each object with ``kubernetes-validate`` (strict: unknown
fields are errors) and returns one line per invalid object, naming its kind and name; an
empty list means every object is valid. Used by the deploy manifests' tests and by the
per-trial Pod emitter's tests.
"""

from __future__ import annotations

from typing import Any

import pytest

K8S_VERSION = "1.33.0"


def k8s_errors(documents: list[dict[str, Any]]) -> list[str]:
    kv = pytest.importorskip("kubernetes_validate")
    errors = []
    for doc in documents:
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            errors.append(f"{doc.get('kind')}/{doc['metadata'].get('name')}: {exc.message}")
    return errors
