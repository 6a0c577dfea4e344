"""Hold-back rules shared by the streaming splitters: text that may still become a marker.

Owns two small pieces:

- ``partial_suffix_len(text, markers)``: the length of the longest tail of ``text`` that is
  a proper beginning of one of ``markers`` (a tag or a stop string still being written).
  Streaming code emits ``text`` minus that tail and keeps the tail for the next chunk.
- ``StopTrimmer``: holds back any tail that could be (the start of) a stop string, so that
  when generation ends on a stop string it can be removed before anyone saw it (OpenAI
  semantics: the matched stop sequence is not returned).
"""

from __future__ import annotations


def partial_suffix_len(text: str, markers: tuple[str, ...], *, whole: bool = False) -> int:
    """Longest k such that ``text`` ends with ``marker[:k]`` for some marker, with
    ``k < len(marker)`` (or ``<=`` when ``whole``); 0 when nothing may still become one."""
    best = 0
    for marker in markers:
        longest = min(len(marker) if whole else len(marker) - 1, len(text))
        for k in range(longest, best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


class StopTrimmer:
    """Delays the tail of the text that could belong to a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> str:
        if not self._stops:
            return text
        buffer = self._held + text
        keep = partial_suffix_len(buffer, self._stops, whole=True)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def finish(self, matched_stop: str | None) -> str:
        """Release everything held; drop ``matched_stop`` when the text ends with it. A stop
        string that was not among ``stops`` was never held, so it cannot be trimmed."""
        held, self._held = self._held, ""
        if matched_stop and held.endswith(matched_stop):
            return held[: len(held) - len(matched_stop)]
        return held
