"""OpenAI's error object, shared by the two OpenAI protocols (Chat Completions, Responses).

Owns the mapping of a ``LegoError`` to ``{"message", "type", "param", "code"}`` with
OpenAI's ``type`` vocabulary; each adapter wraps it in its own envelope or event.
"""

from __future__ import annotations

from kernel.errors import BackendError, LegoError

_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def error_type(error: LegoError) -> str:
    if isinstance(error, BackendError):
        # The type is how a client tells a transient backend failure from a final one.
        return "server_error" if error.retryable else "api_error"
    if error.status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[error.status]
    return "invalid_request_error" if error.status < 500 else "server_error"


def error_object(error: LegoError) -> dict[str, object]:
    return {
        "message": error.message,
        "type": error_type(error),
        "param": error.param,
        "code": error.code,
    }
