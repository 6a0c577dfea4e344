"""The scripted policy: canned replies chosen by regex over the prompt's tail.

Owns ``ScriptedPolicy`` (loaded from ``{"rules": [{"match", "reply" | "replies",
"delay_s"?}], "default": str, "delay_s"?: float, "seed"?: int}``) and ``prompt_tail``.
For a decoded prompt the tail is the text after the ``<|im_end|>`` that closes the last
assistant turn (the whole prompt if there is none); the first rule whose regex
``re.search``-es the tail wins, else ``default``. The engine tokenizes the reply, appends
the eos and teacher-forces those ids through the real model, so the wire output cannot be
told from sampling. A prompt that ends inside an assistant turn (a generation resumed
after a pause-abort: prompt + partial output) continues the same reply where it stopped.

A rule with ``replies`` (a list) is a stochastic policy: each generation it matches draws
one of them uniformly from the policy's own random stream (``seed``, default 0), so the
same prompt can succeed in one sample of a group and fail in the next, as a sampled model
would. A resumed generation keeps the reply its partial output began.
"""

from __future__ import annotations

import json
import random
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kernel.errors import InvalidRequest

_ASSISTANT_HEADER = "<|im_start|>assistant\n"
_END = "<|im_end|>"
_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant\n.*?<\|im_end\|>", re.DOTALL)


@dataclass(frozen=True)
class ScriptRule:
    pattern: re.Pattern[str]
    replies: tuple[str, ...]  # one: a fixed reply; several: drawn per generation
    delay_s: float = 0.0


@dataclass(frozen=True)
class ScriptedReply:
    text: str
    delay_s: float


def split_open_assistant(prompt_text: str) -> tuple[str, str | None]:
    """Split a prompt that ends inside an assistant turn (a resumed, partly sampled answer).

    Returns ``(context, partial)``: the prompt before the open ``<|im_start|>assistant\n``
    header and the text already sampled after it; ``partial`` is None when the prompt ends
    with a complete turn (the usual generation prompt counts as an empty partial answer).
    """
    start = prompt_text.rfind(_ASSISTANT_HEADER)
    if start < 0 or _END in prompt_text[start:]:
        return prompt_text, None
    return prompt_text[:start], prompt_text[start + len(_ASSISTANT_HEADER) :]


def prompt_tail(prompt_text: str) -> str:
    ends = [match.end() for match in _ASSISTANT_TURN.finditer(prompt_text)]
    return prompt_text[ends[-1] :] if ends else prompt_text


@dataclass(frozen=True)
class ScriptedPolicy:
    rules: tuple[ScriptRule, ...]
    default: str
    default_delay_s: float = 0.0
    seed: int = 0
    _draws: random.Random = field(init=False, repr=False, compare=False)
    _lock: threading.Lock = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_draws", random.Random(self.seed))
        object.__setattr__(self, "_lock", threading.Lock())

    @classmethod
    def load(cls, path: Path) -> ScriptedPolicy:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            rules = tuple(
                ScriptRule(
                    pattern=re.compile(str(rule["match"])),
                    replies=_replies(rule),
                    delay_s=float(rule.get("delay_s", 0.0)),
                )
                for rule in raw.get("rules", [])
            )
            return cls(
                rules,
                str(raw.get("default", "")),
                float(raw.get("delay_s", 0.0)),
                int(raw.get("seed", 0)),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, re.error) as exc:
            raise InvalidRequest(f"invalid script file {path}: {exc}") from exc

    def reply_for(self, prompt_text: str) -> ScriptedReply:
        context, partial = split_open_assistant(prompt_text)
        tail = prompt_tail(context)
        for rule in self.rules:
            if rule.pattern.search(tail):
                return ScriptedReply(self._choose(rule.replies, partial), rule.delay_s)
        return ScriptedReply(self.default, self.default_delay_s)

    def _choose(self, replies: tuple[str, ...], partial: str | None) -> str:
        if len(replies) == 1:
            return replies[0]
        if partial:  # resumed: the reply it had begun (its prefix is what was sampled)
            for reply in replies:
                if reply.startswith(partial):
                    return reply
        with self._lock:
            return self._draws.choice(replies)


def _replies(rule: dict[str, object]) -> tuple[str, ...]:
    if "replies" in rule:
        replies = rule["replies"]
        if not isinstance(replies, list) or not replies:
            raise ValueError(f"rule {rule.get('match')!r}: 'replies' must be a non-empty list")
        return tuple(str(reply) for reply in replies)
    return (str(rule["reply"]),)
