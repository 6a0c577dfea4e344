"""The scripted policy: canned replies chosen by regex over the prompt's tail.

Owns ``ScriptedPolicy`` (loaded from ``{"rules": [{"match", "reply", "delay_s"?}],
"default": str, "delay_s"?: float}``) and ``prompt_tail``. For a decoded prompt the tail is
the text after the ``<|im_end|>`` that closes the last assistant turn (the whole prompt if
there is none); the first rule whose regex ``re.search``-es the tail wins, else
``default``. The engine tokenizes the reply, appends the eos and teacher-forces those ids
through the real model, so the wire output cannot be told from sampling. A prompt that
ends inside an assistant turn (a generation resumed after a pause-abort: prompt + partial
output) continues the same reply where it stopped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from kernel.errors import InvalidRequest

_ASSISTANT_HEADER = "<|im_start|>assistant\n"
_END = "<|im_end|>"
_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant\n.*?<\|im_end\|>", re.DOTALL)


@dataclass(frozen=True)
class ScriptRule:
    pattern: re.Pattern[str]
    reply: str
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

    @classmethod
    def load(cls, path: Path) -> ScriptedPolicy:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            rules = tuple(
                ScriptRule(
                    pattern=re.compile(str(rule["match"])),
                    reply=str(rule["reply"]),
                    delay_s=float(rule.get("delay_s", 0.0)),
                )
                for rule in raw.get("rules", [])
            )
            return cls(rules, str(raw.get("default", "")), float(raw.get("delay_s", 0.0)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, re.error) as exc:
            raise InvalidRequest(f"invalid script file {path}: {exc}") from exc

    def reply_for(self, prompt_text: str) -> ScriptedReply:
        tail = prompt_tail(split_open_assistant(prompt_text)[0])
        for rule in self.rules:
            if rule.pattern.search(tail):
                return ScriptedReply(rule.reply, rule.delay_s)
        return ScriptedReply(self.default, self.default_delay_s)
