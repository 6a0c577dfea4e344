"""The scripted policy every harness run talks to, written in the model's own format.

Owns ``SCRIPT`` (the ``engine.script`` rule file) and the task prompts. A rule's regex is
searched in the prompt's tail (the text after the last assistant turn), first match wins.
Each harness gets a task marker in its user prompt; the reply calls that harness's own
declared shell tool with its own argument schema (``bash{command}`` for OpenCode,
``Bash{command,description}`` for Claude Code, ``exec_command{cmd}`` for Codex,
``terminal{command,...}`` for OpenHands). Once a ``<tool_response>`` is in the tail the
model answers in text. Replies carry ``<think>`` reasoning where the wire format has it.
Side and compaction requests are recognised by the harnesses' own instructions.
"""

from __future__ import annotations

import json
from typing import Any

HARNESSES = ("opencode", "claude-code", "codex", "openhands")


def expected_content(harness: str) -> str:
    return f"hello from {harness}\n"


def task_prompt(harness: str, scenario: str = "basic") -> str:
    return f"LEGO-TASK-{harness}-{scenario}: create out.txt containing the greeting."


WRITE_THOUGHT = "The task needs a file; I will write it with the shell tool."


def _call(name: str, arguments: dict[str, Any], thought: str) -> str:
    payload = json.dumps({"name": name, "arguments": arguments})
    return f"<think>\n{thought}\n</think>\n\n<tool_call>\n{payload}\n</tool_call>"


def shell_call(
    harness: str, command: str, *, thought: str = WRITE_THOUGHT, what: str = "Write out.txt"
) -> str:
    """A reply calling ``harness``'s own shell tool with its own argument schema."""
    if harness == "opencode":
        return _call("bash", {"command": command, "description": what}, thought)
    if harness == "claude-code":
        return _call("Bash", {"command": command, "description": what}, thought)
    if harness == "codex":
        return _call("exec_command", {"cmd": command}, thought)
    arguments = {"command": command, "summary": what.lower(), "security_risk": "LOW"}
    return _call("terminal", arguments, thought)


def _write(harness: str) -> str:
    return f"echo 'hello from {harness}' > out.txt"


# Enough tool output (about 6 K tokens of this vocabulary) to push one turn past a
# deliberately small context window, while the fixed prompt stays under it.
BULKY_OUTPUT = "seq 100000 101500"

FINAL_ANSWER = (
    "<think>\nThe command ran; the file is written.\n</think>\n\nDone: out.txt is written."
)
SUMMARY = "Summary: the user asked for out.txt; a shell command wrote it. Nothing else is pending."
AFTER_COMPACTION = "<think>\nThe summary says the work is done.\n</think>\n\nNothing left to do."
TITLE = "Write the greeting file"


def _rules() -> list[dict[str, str]]:
    rules = [
        # OpenCode after compaction: [user "What did we do so far?", summary, "Continue ..."].
        {"match": r"Continue if you have next steps", "reply": AFTER_COMPACTION},
        # Summarisation requests, by the harnesses' own instructions (OpenCode's compaction
        # agent, Codex's checkpoint); a summary is plain text. Generic words like "summary"
        # would also match tool descriptions inside a first turn's system prompt.
        {"match": r"You are a context summarization agent", "reply": SUMMARY},
        {"match": r"CONTEXT CHECKPOINT COMPACTION", "reply": SUMMARY},
        # Claude Code's /compact: its instruction shares a user message with the last tool
        # result, so this must come before the <tool_response> rule.
        {"match": r"CRITICAL: Respond with TEXT ONLY", "reply": SUMMARY},
        {"match": r"You are a title generator", "reply": TITLE},
        {"match": r"<tool_response>", "reply": FINAL_ANSWER},
    ]
    for harness in HARNESSES:
        bulky = shell_call(harness, f"{_write(harness)} && {BULKY_OUTPUT}")
        rules.append({"match": f"LEGO-TASK-{harness}-bulky", "reply": bulky})
        rules.append(
            {"match": f"LEGO-TASK-{harness}-", "reply": shell_call(harness, _write(harness))}
        )
    return rules


SCRIPT: dict[str, Any] = {"rules": _rules(), "default": "I have nothing to add."}
