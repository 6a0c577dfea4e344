"""What the control and export APIs share: the admin-key guard, bodies, errors, sessions.

Contract:
- ``admin_endpoint(api, admin_key, render_error, state_of, handler)`` is a route that
  checks ``Authorization: Bearer <admin key>`` (``proxy.routes.auth``), runs ``handler``
  on the app state ``state_of`` picks and answers its result as JSON (numpy arrays
  included), or the ``Response`` it returned as is; a ``LegoError`` becomes the error
  envelope ``render_error`` draws (``{"error": {"message", "type", "param", "code"}}``).
- ``parse_body(model, body)`` validates a JSON body (empty means ``{}``) and raises
  ``InvalidRequest`` naming the first offending field.
- ``session_json(session, public_url)`` is a session as both APIs answer it, with the base
  URLs a harness is handed.
- Lists page by an opaque cursor (``cursor_of``/``parse_cursor``: the (created_at, id) of
  a page's last item); ``query_int``/``query_bool`` read query parameters, each bad value
  an ``InvalidRequest`` naming the parameter.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from kernel.errors import InvalidRequest, LegoError
from proxy.routes.auth import require_admin
from recorder.records import EXCLUDED_TERMINATIONS, SessionInfo

log = logging.getLogger(__name__)

JSON = "application/json"
ErrorRenderer = Callable[[LegoError], tuple[int, bytes]]
_M = TypeVar("_M", bound=BaseModel)
_S = TypeVar("_S")
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def admin_endpoint(
    api: str,
    admin_key: bytes,
    render_error: ErrorRenderer,
    state_of: Callable[[Request], _S],
    handler: Callable[[_S, Request], Awaitable[object]],
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            require_admin(request.headers.get("authorization", ""), admin_key, api)
            result = await handler(state_of(request), request)
            if not isinstance(result, Response):
                result = Response(orjson.dumps(result, option=_OPTIONS), media_type=JSON)
        except LegoError as exc:
            status, content = render_error(exc)
            return Response(content, status_code=status, media_type=JSON)
        except Exception as exc:
            # A bug: the caller still gets the API's error envelope, never a bare text 500.
            log.exception("unexpected error in the %s", api)
            error = LegoError(f"internal error ({type(exc).__name__}); see the proxy's log")
            status, content = render_error(error)
            return Response(content, status_code=status, media_type=JSON)
        return result

    return endpoint


def parse_body(model: type[_M], body: bytes) -> _M:
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequest(f"{where or 'body'}: {first['msg']}", param=where) from exc


def session_json(session: SessionInfo, public_url: str) -> dict[str, object]:
    spec = session.spec
    return {
        "id": session.id,
        "run_id": spec.run_id,
        "task_id": spec.task_id,
        "group_id": spec.group_id,
        "sample_index": spec.sample_index,
        "harness": spec.harness,
        "sampling": spec.sampling,
        "max_prompt_tokens": spec.max_prompt_tokens,
        "max_output_tokens": spec.max_output_tokens,
        "purpose": spec.purpose,
        "status": session.status.value,
        "termination": session.termination,
        "reward": session.reward,
        "reward_details": session.reward_details,
        "stages": None if session.stages is None else session.stages.reported(),
        "defense_events": [event.flat() for event in session.defense_events],
        "excluded": session.termination in EXCLUDED_TERMINATIONS,
        "turn_count": session.turn_count,
        "created_at": session.created_at,
        "openai_base_url": f"{public_url}/s/{session.key}/v1",
        "anthropic_base_url": f"{public_url}/s/{session.key}",
    }


def cursor_of(created_at: float, item_id: str) -> str:
    """An opaque page cursor: the (created_at, id) of the last item of a page."""
    raw = orjson.dumps([created_at, item_id])
    return base64.urlsafe_b64encode(raw).decode("ascii")


def parse_cursor(value: str | None) -> tuple[float, str] | None:
    if not value:
        return None
    try:
        created, item_id = orjson.loads(base64.urlsafe_b64decode(value.encode("ascii")))
        return float(created), str(item_id)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise InvalidRequest("invalid cursor", param="cursor") from None


def query_int(value: str | None, name: str, *, default: int, low: int, high: int) -> int:
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer", param=name) from None
    if not low <= number <= high:
        raise InvalidRequest(f"{name} must be in [{low}, {high}]", param=name)
    return number


def query_bool(value: str | None, name: str) -> bool | None:
    if value is None or value == "":
        return None
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise InvalidRequest(f"{name} must be true or false", param=name)
