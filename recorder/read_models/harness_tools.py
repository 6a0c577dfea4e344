"""Each real harness's tool vocabulary: what a recorded tool call of that harness did.

Owns ``VOCABULARIES`` (one ``Vocabulary`` per harness name a session records: the tool
names and argument fields of the pinned CLIs, ``tests/harness/install.sh``), and
``tool_use(vocabulary, name, arguments)``, the ``Action``s of one call
(``recorder.read_models.shell_commands`` reads shell commands). Pure, no IO.

What each harness's tools are (``docs/analytics.md`` has the table users read):

- ``claude-code``: ``Bash{command}``, ``Read{file_path}``, ``Edit|MultiEdit|Write
  {file_path}``, ``NotebookEdit{notebook_path}``, ``Glob{path}``, ``Grep{path}``; a failed
  ``Bash`` result starts a line with ``Exit code N``.
- ``opencode``: ``bash{command}``, ``read{filePath}``, ``edit|write{filePath}``,
  ``apply_patch{patchText}``, ``list|glob{path}``, ``grep{path}``; its shell result does
  not carry the exit status, so no failure can be read from it.
- ``codex``: ``exec_command{cmd}``, ``shell_command{command}``, ``shell{command}`` (an argv
  list, ``["bash", "-lc", script]``), ``apply_patch{input}`` where offered as a function;
  everything else goes through the shell; a result says ``Process exited with code N``
  (``"exit_code": N`` in the older JSON output).
- ``openhands`` (the SDK's tools): ``terminal{command}``, ``file_editor{command, path}``
  (``view`` reads, ``create|str_replace|insert|undo_edit`` edit), ``finish{message}``; a
  result ends ``[Command finished with exit code N]``.

A tool the vocabulary does not name (``TodoWrite``, ``think``, ``task_tracker``, ...), or
arguments that are not a JSON object, did nothing the indicators count. A path argument
left out (``Glob`` without ``path``) means the working directory, ``.``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from recorder.read_models.shell_commands import (
    Action,
    ActionKind,
    normalize,
    patch_paths,
    shell_actions,
)


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """One harness's tools: tool name -> the argument that holds the command or path."""

    harness: str
    shell: Mapping[str, str]
    read: Mapping[str, str] = field(default_factory=dict)
    edit: Mapping[str, str] = field(default_factory=dict)
    listing: Mapping[str, str] = field(default_factory=dict)
    search: Mapping[str, str] = field(default_factory=dict)
    patch: Mapping[str, str] = field(default_factory=dict)  # holds a patch's text
    # A file editor with sub-commands: tool -> (command field, path field).
    editor: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    finish: frozenset[str] = frozenset()
    # Finds the exit status in a shell tool's result; None: its results do not say.
    exit_status: re.Pattern[str] | None = None


EDITOR_READS = frozenset({"view"})
EDITOR_EDITS = frozenset({"create", "str_replace", "insert", "undo_edit"})

VOCABULARIES: Mapping[str, Vocabulary] = {
    v.harness: v
    for v in (
        Vocabulary(
            harness="claude-code",
            shell={"Bash": "command"},
            read={"Read": "file_path"},
            edit={
                "Edit": "file_path",
                "MultiEdit": "file_path",
                "Write": "file_path",
                "NotebookEdit": "notebook_path",
            },
            listing={"Glob": "path"},
            search={"Grep": "path"},
            exit_status=re.compile(r"^Exit code (-?\d+)", re.MULTILINE),
        ),
        Vocabulary(
            harness="opencode",
            shell={"bash": "command"},
            read={"read": "filePath"},
            edit={"edit": "filePath", "write": "filePath"},
            listing={"list": "path", "glob": "path"},
            search={"grep": "path"},
            patch={"apply_patch": "patchText"},
        ),
        Vocabulary(
            harness="codex",
            shell={"exec_command": "cmd", "shell_command": "command", "shell": "command"},
            patch={"apply_patch": "input"},
            exit_status=re.compile(r'Process exited with code (-?\d+)|"exit_code":\s*(-?\d+)'),
        ),
        Vocabulary(
            harness="openhands",
            shell={"terminal": "command"},
            editor={"file_editor": ("command", "path")},
            finish=frozenset({"finish"}),
            exit_status=re.compile(r"\[Command finished with exit code (-?\d+)\]"),
        ),
    )
}


@dataclass(frozen=True, slots=True)
class ToolUse:
    actions: tuple[Action, ...]
    shell: bool  # a shell command ran: its result may show an exit status


NOTHING = ToolUse((), shell=False)


def tool_use(vocabulary: Vocabulary, name: str, arguments: str) -> ToolUse:
    """What one call did (``arguments`` as the model wrote them, a JSON text)."""
    try:
        args = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return NOTHING
    if not isinstance(args, dict):
        return NOTHING
    if name in vocabulary.shell:
        return ToolUse(shell_actions(_command(args.get(vocabulary.shell[name]))), shell=True)
    if name in vocabulary.finish:
        return ToolUse((Action(ActionKind.FINISH),), shell=False)
    if name in vocabulary.patch:
        return _one(ActionKind.EDIT, patch_paths(_text(args.get(vocabulary.patch[name]))))
    if name in vocabulary.editor:
        command_field, path_field = vocabulary.editor[name]
        command, path = args.get(command_field), _path(args.get(path_field), "")
        if command in EDITOR_READS:
            return _one(ActionKind.READ, path)
        return _one(ActionKind.EDIT, path) if command in EDITOR_EDITS else NOTHING
    for kind, tools, default in (
        (ActionKind.READ, vocabulary.read, ""),
        (ActionKind.EDIT, vocabulary.edit, ""),
        (ActionKind.LIST, vocabulary.listing, "."),
        (ActionKind.SEARCH, vocabulary.search, "."),
    ):
        if name in tools:
            return _one(kind, _path(args.get(tools[name]), default))
    return NOTHING


def exit_status(vocabulary: Vocabulary, result: str) -> int | None:
    """The last exit status a shell tool's result shows (None: it shows none)."""
    if vocabulary.exit_status is None:
        return None
    found = [next(g for g in m.groups() if g) for m in vocabulary.exit_status.finditer(result)]
    return int(found[-1]) if found else None


def _one(kind: ActionKind, paths: tuple[str, ...]) -> ToolUse:
    return ToolUse((Action(kind, paths),), shell=False)


def _command(value: object) -> str:
    """A shell tool's command: a string, or an argv list (``bash -lc`` script unwrapped)."""
    if isinstance(value, list):
        words = [str(w) for w in value]
        if len(words) == 3 and words[1] in ("-c", "-lc") and words[0].endswith("sh"):
            return words[2]
        return " ".join(_quoted(w) for w in words)
    return _text(value)


def _quoted(word: str) -> str:
    # Keeps an argv word one word, newlines included (apply_patch's patch argument).
    return word if re.fullmatch(r"[\w@%+=:,./-]+", word) else "'" + word.replace("'", "'\\''") + "'"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _path(value: object, default: str) -> tuple[str, ...]:
    path = normalize(value) if isinstance(value, str) and value.strip() else default
    return (path,) if path else ()
