"""SGLang 0.5.23's ``/generate`` stream, read: chunks into deltas, spans, errors.

Owns the pure functions ``SGLangBackend`` reads a stream with (no IO):

- ``read_delta(chunk, seen, ids, logprobs)``: appends the ids and logprobs a chunk adds, in
  either streaming mode, in one pass (no tuple or object per chunk). A chunk whose
  ``output_ids`` are as long as ``meta_info.completion_tokens`` (always cumulative) is
  cumulative, anything shorter a delta. Ids and logprobs come from
  ``meta_info.output_token_logprobs`` (``[logprob, id, null]``), cross-checked against
  ``output_ids``.
- ``spans(raw, output_len)``: ``meta_info.weight_versions`` as ``(version, start, end)``,
  which must cover the output exactly.
- ``SseData``: the ``data:`` payloads of an SSE byte stream, framed on the bytes as they
  arrive (no text decoding: the payloads go to ``orjson`` as bytes). Lines end in ``\n``
  or ``\r\n``; other fields and comments are skipped, and a line cut across chunks is
  joined.
- ``refusal(message, status)``, ``http_error(status, body)``, ``inband_error(error)``: what a
  backend error means for the harness's request: a 400 about the context or input length is
  ``ContextLengthExceeded``, any other 400 ``InvalidRequest`` (resending cannot help), 5xx
  and 429 a retryable ``BackendError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from kernel.errors import BackendError, ContextLengthExceeded, InvalidRequest, LegoError


@dataclass(frozen=True, slots=True)
class GenerationDelta:
    ids: tuple[int, ...]
    logprobs: tuple[float, ...]


class SseData:
    """Feed it the stream's byte chunks; each ``feed`` returns the ``data:`` payloads of
    the lines it completed, in order (``b"[DONE]"`` included)."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = (self._partial + chunk).split(b"\n") if self._partial else chunk.split(b"\n")
        self._partial = lines.pop()  # what follows the last newline: not a line yet
        payloads = []
        for line in lines:
            if line.startswith(b"data:"):
                payloads.append(line[5:].strip())  # the optional space, a trailing \r
        return payloads


def read_delta(chunk: dict[str, object], seen: int, ids: list[int], logprobs: list[float]) -> int:
    """Append the ids and logprobs ``chunk`` adds to ``ids`` and ``logprobs`` (nothing if it
    is refused) and return how many the stream has sent with it (``seen`` before it)."""
    meta = chunk.get("meta_info")
    if not isinstance(meta, dict):
        raise BackendError("backend chunk without meta_info", retryable=False)
    triples = meta.get("output_token_logprobs") or []
    output_ids = chunk.get("output_ids") or []
    if not isinstance(triples, list) or not isinstance(output_ids, list):
        raise BackendError("backend chunk with malformed output", retryable=False)
    total = int(meta.get("completion_tokens", len(output_ids)))
    # Slices only where a cumulative chunk repeats what was seen (a copy per chunk else).
    new_ids = output_ids[seen:] if seen and len(output_ids) == total else output_ids
    new_triples = triples[seen:] if seen and len(triples) == total else triples
    if len(new_triples) != len(new_ids):
        raise BackendError(
            f"backend returned {len(new_ids)} ids but {len(new_triples)} logprobs",
            retryable=False,
        )
    before = len(ids)
    for triple, raw in zip(new_triples, new_ids, strict=True):
        token = int(raw)
        if int(triple[1]) != token:
            del ids[before:], logprobs[before:]
            raise BackendError("backend logprob ids disagree with output_ids", retryable=False)
        ids.append(token)
        logprobs.append(float(triple[0]))
    return seen + len(new_ids)


def spans(raw: object, output_len: int) -> tuple[tuple[str, int, int], ...]:
    """SGLang's ``meta_info.weight_versions``: ``[{"version", "start", "end"}]``."""
    if raw is None:
        return ()
    spans: list[tuple[str, int, int]] = []
    if isinstance(raw, list):
        for span in raw:
            if not isinstance(span, dict):
                break
            version, start, end = span.get("version"), span.get("start"), span.get("end")
            if not (isinstance(start, int) and isinstance(end, int) and version is not None):
                break
            spans.append((str(version), start, end))
        else:
            if spans and spans[0][1] == 0 and spans[-1][2] == output_len:
                return tuple(spans)
    raise BackendError(
        f"backend weight_versions {raw!r} do not cover the {output_len} output tokens",
        retryable=False,
    )


def _error_message(payload: object) -> str:
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict):
            return str(inner.get("message", inner))
        return str(inner)
    return str(payload)


# SGLang 0.5.23's words for a prompt it cannot take: the tokenizer's "longer than the
# model's context length" / "exceeds the model's maximum context length", the scheduler's
# "exceeds the maximum allowed length".
_CONTEXT_WORDS = re.compile(r"context length|maximum allowed length|context_length", re.I)


def refusal(message: str, status: int) -> LegoError:
    """What a backend's error status means for the harness's request."""
    if status == 400:
        if _CONTEXT_WORDS.search(message):
            return ContextLengthExceeded(f"the backend rejected the prompt: {message}")
        # Deterministic: the same request would be refused again.
        return InvalidRequest(f"the backend refused the request: {message}")
    retryable = status >= 500 or status == 429
    return BackendError(
        f"backend answered {status}: {message}", retryable=retryable, backend_status=status
    )


def http_error(status: int, body: bytes) -> LegoError:
    """A ``/generate`` answered with an error status (SGLang's JSON error, or any text)."""
    try:
        message = _error_message(orjson.loads(body))
    except orjson.JSONDecodeError:
        message = body[:500].decode("utf-8", "replace")
    return refusal(message, status)


def inband_error(error: object) -> LegoError:
    """SGLang's mid-stream ``{"message", "type", "code", "retryable"}``."""
    message = _error_message(error)
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 500:
        return refusal(message, code)
    retryable = not (isinstance(error, dict) and error.get("retryable") is False)
    return BackendError(f"backend failed mid-stream: {message}", retryable=retryable)
