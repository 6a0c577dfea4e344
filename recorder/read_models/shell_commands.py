"""What a shell command an agent ran did to the repository, as far as its words tell.

Owns ``Action`` (one thing a tool call did: read, list, search or edit files, run the
test suite or a script, finish) and ``shell_actions(command)``, the actions of one shell
command line, in the order they appear. It is pure and never runs anything: it reads the
words the way ``sh`` would split them (quotes, ``&&``/``||``/``;``/``|``, redirections,
heredocs, ``bash -c`` scripts, ``cd``/``env``/``timeout`` wrappers) and knows these
programs (``docs/analytics.md`` is the user-facing list):

- reads: ``cat head tail nl less more bat``, ``sed``/``awk`` without in-place editing,
  and ``< file`` redirections;
- lists: ``ls tree find fd``, ``rg --files``; searches: ``grep egrep rg ag ack``;
- edits: ``> file``/``>> file`` redirections (not ``/dev/...``), ``tee``, ``sed -i``,
  ``perl -i``, and patches: ``apply_patch`` (Codex's patch format, from its argument or a
  heredoc), ``patch`` and ``git apply`` (the ``+++`` paths of a heredoc diff; an edit with
  no known path otherwise);
- test runs: ``pytest``/``py.test``, ``python -m pytest|unittest``, ``tox``, ``nox``,
  ``make`` with a ``test``/``tests``/``check`` target, ``npm|yarn|pnpm [run] test``,
  ``go test``, ``cargo test``, ``runtests*`` scripts (Django's) and ``manage.py test``,
  also behind ``uv|poetry|pipenv|pdm|hatch run``;
- scripts: any other ``python`` run (a file, ``-c``, ``-m``, stdin) except the packaging
  modules (``pip``, ``venv``, ...), ``node file``, ``sh|bash file`` and ``./program``.

Anything else (``git diff``, ``echo``, a compiler) is no action. A path is kept as written,
normalized (``posixpath.normpath``); ``same_file`` matches an absolute path with a
relative one that ends it, because tools name files absolutely and shells relatively.
Words that cannot be split (an unbalanced quote) fall back to splitting on whitespace.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum


class ActionKind(StrEnum):
    READ = "read"  # looked at a file's contents
    LIST = "list"  # listed a directory, or files by name
    SEARCH = "search"  # searched the contents of files
    EDIT = "edit"  # changed (or created) a file
    TEST = "test"  # ran the test suite
    SCRIPT = "script"  # ran a program that is not the test suite
    FINISH = "finish"  # said it is done with a tool made for that


EXPLORING = frozenset({ActionKind.READ, ActionKind.LIST, ActionKind.SEARCH})


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    paths: tuple[str, ...] = ()  # normalized; empty when the command names none


def normalize(path: str) -> str:
    return posixpath.normpath(path.strip()) if path.strip() else ""


def same_file(a: str, b: str) -> bool:
    """Equal, or one is absolute and ends with the other (relative) path."""
    if a == b:
        return True
    if a.startswith("/") == b.startswith("/"):
        return False
    absolute, relative = (a, b) if a.startswith("/") else (b, a)
    return relative not in (".", "..") and absolute.endswith("/" + relative)


# -- patches --------------------------------------------------------------------------------

_PATCH_FILE = re.compile(r"^\*\*\* (?:Update|Add|Delete) File: (.+?)\s*$", re.MULTILINE)
_PATCH_MOVE = re.compile(r"^\*\*\* Move to: (.+?)\s*$", re.MULTILINE)
_DIFF_FILE = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.MULTILINE)


def patch_paths(text: str) -> tuple[str, ...]:
    """Files a patch touches: Codex's ``*** Update File:`` format, or a unified diff."""
    found = [*_PATCH_FILE.findall(text), *_PATCH_MOVE.findall(text)]
    found += [p for p in _DIFF_FILE.findall(text) if p != "/dev/null"]
    return _paths(found)


def _paths(words: Sequence[str]) -> tuple[str, ...]:
    kept = (normalize(w) for w in words if w and w != "-")
    return tuple(dict.fromkeys(p for p in kept if p))


# -- splitting --------------------------------------------------------------------------------

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][\w.-]*)\1")
# A file descriptor before a redirection ("2>", "1>>"): not an argument of the command.
_FD = re.compile(r"(?:(?<=^)|(?<=[\s;&|(]))\d+(?=[<>])")
_PUNCTUATION = "();<>|&\n"  # newlines separate commands, as ";" does
_WRITES = frozenset({">", ">>", ">|", "&>", "&>>"})
_READS = frozenset({"<"})
_INPUT_OPS = frozenset({"<<", "<<-", "<<<", "<>", "<&", ">&"})  # their targets are no files


@dataclass(frozen=True, slots=True)
class _Simple:
    words: tuple[str, ...]
    writes: tuple[str, ...]
    reads: tuple[str, ...]


def _cut_heredocs(command: str) -> tuple[str, str]:
    """(the command without its heredoc bodies, the bodies joined)."""
    lines = command.split("\n")
    kept: list[str] = []
    bodies: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        kept.append(line)
        for match in _HEREDOC.finditer(line):
            delimiter, body = match.group(2), []
            while index < len(lines) and lines[index].strip() != delimiter:
                body.append(lines[index])
                index += 1
            index += 1  # the delimiter line
            bodies.append("\n".join(body))
    return "\n".join(kept), "\n".join(bodies)


def _tokens(text: str) -> list[str]:
    text = _FD.sub("", text.replace("\\\n", " "))
    lexer = shlex.shlex(text, posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""  # a comment ends at a newline, which shlex's comments swallow
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: the words as the whitespace separates them
        return [w for line in text.split("\n") for w in [*line.split(), ";"]]


def _simple_commands(text: str) -> Iterator[_Simple]:
    words: list[str] = []
    writes: list[str] = []
    reads: list[str] = []
    comment = False
    tokens = _tokens(text)
    i = 0
    while i <= len(tokens):
        token = tokens[i] if i < len(tokens) else "\n"
        operator = token.replace("\n", "") if set(token) <= set(_PUNCTUATION) else None
        redirect = operator in _WRITES or operator in _READS or operator in _INPUT_OPS
        if operator is not None and (not redirect or "\n" in token):
            if words or writes:
                yield _Simple(tuple(words), tuple(writes), tuple(reads))
            words, writes, reads, comment = [], [], [], False
        elif comment:
            pass
        elif redirect:
            target = tokens[i + 1] if i + 1 < len(tokens) else ""
            if operator in _WRITES and not target.startswith("/dev/"):
                writes.append(target)
            elif operator in _READS:
                reads.append(target)
            i += 1
        elif token.startswith("#"):
            comment = True  # to the end of the line
        else:
            words.append(token)
        i += 1


# -- programs ----------------------------------------------------------------------------------

_WRAPPERS = frozenset({"sudo", "env", "time", "nohup", "nice", "command", "exec", "builtin"})
_RUNNERS = frozenset({"uv", "poetry", "pipenv", "pdm", "hatch"})
_SHELLS = frozenset({"sh", "bash", "zsh", "dash"})
_READERS = frozenset({"cat", "head", "tail", "nl", "less", "more", "bat", "batcat"})
_LISTERS = frozenset({"ls", "tree", "find", "fd"})
_SEARCHERS = frozenset({"grep", "egrep", "fgrep", "rg", "ag", "ack"})
_TEST_PROGRAMS = frozenset({"pytest", "py.test", "tox", "nox"})
_TEST_MODULES = frozenset({"pytest", "unittest", "tox", "nox"})
_PACKAGING_MODULES = frozenset({"pip", "venv", "ensurepip", "virtualenv", "pipx", "build"})
_MAKE_TEST = re.compile(r"^(?:test|tests|check)(?:[-_:].*)?$")
_PYTHON = re.compile(r"^(?:python|pypy)[\d.]*$")
# Options whose value is the next word, per program (so it is not read as a path).
_VALUED = {
    "head": {"-n", "-c"},
    "tail": {"-n", "-c"},
    "grep": {"-e", "-f", "-m", "-A", "-B", "-C", "--include", "--exclude"},
    "rg": {"-e", "-f", "-m", "-A", "-B", "-C", "-g", "--glob", "-t", "--type", "-T"},
    "sed": {"-e", "-f"},
    "perl": {"-e", "-E"},
    "timeout": {"-s", "-k", "--signal", "--kill-after"},
}


def _operands(program: str, args: Sequence[str]) -> tuple[list[str], set[str]]:
    """(operands, options) of ``args``, the values of valued options left out."""
    valued = _VALUED.get(program, set())
    operands: list[str] = []
    options: set[str] = set()
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--":
            options.add(arg)
        elif arg.startswith("-") and len(arg) > 1:
            options.add(arg)
            skip = arg in valued
        else:
            operands.append(arg)
    return operands, options


def _unwrap(words: Sequence[str]) -> list[str]:
    """The command behind variable assignments and wrappers (``timeout 60 pytest``)."""
    rest = list(words)
    while rest:
        head = posixpath.basename(rest[0])
        if re.match(r"^[A-Za-z_]\w*=", rest[0]):
            rest = rest[1:]
        elif head in _WRAPPERS:
            rest = rest[1:]
            while rest and rest[0].startswith("-"):
                rest = rest[1:]
        elif head == "timeout":
            rest = rest[1:]
            while rest and rest[0].startswith("-"):
                valued = rest[0] in _VALUED["timeout"]
                rest = rest[2:] if valued else rest[1:]
            rest = rest[1:]  # the duration
        elif head in _RUNNERS and len(rest) > 1 and rest[1] == "run":
            rest = rest[2:]
        else:
            return rest
    return rest


def _python(args: Sequence[str]) -> ActionKind | None:
    for i, arg in enumerate(args):
        if arg == "-m":
            module = args[i + 1] if i + 1 < len(args) else ""
            if module in _TEST_MODULES:
                return ActionKind.TEST
            return None if module in _PACKAGING_MODULES else ActionKind.SCRIPT
        if arg in ("-c", "-"):
            return ActionKind.SCRIPT
        if not arg.startswith("-"):
            name = posixpath.basename(arg)
            rest = args[i + 1 :]
            if name.startswith("runtests") or (name == "manage.py" and "test" in rest):
                return ActionKind.TEST
            return ActionKind.SCRIPT
    return None  # an interactive interpreter, or ``python --version``


def _program(words: Sequence[str], heredoc: str) -> list[Action]:
    words = _unwrap(words)
    if not words:
        return []
    program, args = posixpath.basename(words[0]), list(words[1:])
    operands, options = _operands(program, args)
    if program in _SHELLS:
        for i, arg in enumerate(args):
            if arg.startswith("-") and "c" in arg[1:] and i + 1 < len(args):
                return list(shell_actions(args[i + 1]))
        return [Action(ActionKind.SCRIPT, _paths(operands[:1]))] if operands else []
    if program in _READERS:
        return _looked(ActionKind.READ, operands)
    if program in ("sed", "awk", "gawk", "perl"):
        return _stream_editor(program, args)
    if program in _LISTERS:
        roots = _find_roots(args) if program == "find" else operands
        return [Action(ActionKind.LIST, _paths(roots or ["."]))]
    if program in _SEARCHERS:
        if program == "rg" and "--files" in options:
            return [Action(ActionKind.LIST, _paths(operands or ["."]))]
        explicit = options & {"-e", "-f", "--regexp", "--file"}
        return _looked(ActionKind.SEARCH, operands if explicit else operands[1:])
    if program == "tee":
        return [Action(ActionKind.EDIT, _paths(operands))]
    if program in ("apply_patch", "applypatch"):
        return [Action(ActionKind.EDIT, patch_paths("\n".join([*operands, heredoc])))]
    if program == "patch" or (program == "git" and args[:1] == ["apply"]):
        return [Action(ActionKind.EDIT, patch_paths(heredoc))]
    kind = _run_kind(words[0], args, operands)
    return [Action(kind)] if kind is not None else []


def _looked(kind: ActionKind, operands: Sequence[str]) -> list[Action]:
    """A read or search of the named files; none named (a pipe's stdin) is no action."""
    paths = _paths(operands)
    return [Action(kind, paths)] if paths else []


def _run_kind(word: str, args: Sequence[str], operands: Sequence[str]) -> ActionKind | None:
    program = posixpath.basename(word)
    if program in _TEST_PROGRAMS or program.startswith("runtests"):
        return ActionKind.TEST
    if program == "manage.py" and "test" in operands:
        return ActionKind.TEST
    if _PYTHON.match(program):
        return _python(args)
    if program == "make":
        return ActionKind.TEST if any(_MAKE_TEST.match(o) for o in operands) else None
    if program in ("npm", "yarn", "pnpm"):
        script = operands[1:2] if operands[:1] == ["run"] else operands[:1]
        return ActionKind.TEST if script and script[0].startswith("test") else None
    if program in ("go", "cargo"):
        return ActionKind.TEST if operands[:1] == ["test"] else None
    if program == "node":
        return ActionKind.SCRIPT if operands else None
    if "/" in word:  # ./reproduce.sh, bin/check
        return ActionKind.SCRIPT
    return None


def _find_roots(args: Sequence[str]) -> list[str]:
    roots: list[str] = []
    for arg in args:
        if arg.startswith("-") or arg in ("(", "!", ")"):
            break
        roots.append(arg)
    return roots


def _stream_editor(program: str, args: Sequence[str]) -> list[Action]:
    """``sed``/``awk``/``perl``: the program text comes first unless given as an option."""
    operands, options = _operands(program, args)
    in_place = any(o.startswith("-i") or o == "--in-place" for o in options)
    if program == "perl":
        in_place = in_place or any(_perl_in_place(o) for o in options)
    if program == "perl" and not in_place:
        return [Action(ActionKind.SCRIPT)]
    scripted = bool(options & {"-e", "-f", "--expression", "--file"})
    if program == "perl":
        scripted = scripted or any(o.startswith("-") and "e" in o[1:] for o in options)
    files = operands if scripted else operands[1:]
    if in_place:
        return [Action(ActionKind.EDIT, _paths(files))]
    return _looked(ActionKind.READ, files)


def _perl_in_place(option: str) -> bool:
    return not option.startswith("--") and "i" in option[1:]


def shell_actions(command: str) -> tuple[Action, ...]:
    """The actions of one shell command line (``bash -c`` scripts included), in order."""
    text, heredoc = _cut_heredocs(command)
    actions: list[Action] = []
    for simple in _simple_commands(text):
        actions += _program(simple.words, heredoc)
        if simple.reads:
            actions.append(Action(ActionKind.READ, _paths(simple.reads)))
        if simple.writes:
            actions.append(Action(ActionKind.EDIT, _paths(simple.writes)))
    return tuple(actions)
