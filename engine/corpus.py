"""The built-in training corpus of the tiny tokenizer.

Owns ``build_corpus(seed)``: a deterministic list of text documents (English-ish prose,
Python code, JSON tool arguments, shell commands) generated in code from a fixed seed, so
the tokenizer can be rebuilt byte-identically anywhere without reading a file or the
network. The text only has to look like what coding agents exchange; nothing depends on
its meaning.
"""

from __future__ import annotations

import json
import random

_WORD_TEXT = (
    "the a an of to in and or for with on at by from as is are was be been has have had "
    "it this that these those not no yes can will would should could may might must do does "
    "did file files code test tests function class method value values list dict string "
    "number error errors result results read write run runs build install update change "
    "check fix bug issue repository branch commit diff patch line lines path directory "
    "module package import export return call calls tool tools user assistant system model "
    "request response stream token tokens prompt answer question reason think plan step "
    "next first last new old small large fast slow simple complex data server client cache "
    "time memory disk network output input config settings option options default use "
    "using used make makes made find found search replace edit open close start stop "
    "because when then if else while before after into over under between each every all "
    "some many more most less few other same different only also just very well here there "
    "what which who how why where we you they he she i my our your their its let me see "
    "look need want try works working failed passed green red done ready please thanks"
)
_WORDS = tuple(_WORD_TEXT.split())

_IDENT_TEXT = (
    "data items count total name path value result config client server request response "
    "token tokens buffer index offset limit size parser reader writer handler session "
    "record records cache store queue batch model engine logger args kwargs text line"
)
_IDENTS = tuple(_IDENT_TEXT.split())

_COMMANDS = (
    "ls -la",
    "cd src",
    "cat README.md",
    "grep -rn TODO .",
    "git status",
    "git diff --stat",
    "git log --oneline -5",
    "python -m pytest -q",
    "pytest tests/ -x",
    "pip install -e .",
    "make test",
    "mkdir -p build",
    "rm -rf build",
    "find . -name '*.py'",
    "sed -n 1,40p main.py",
    "echo done",
    "python main.py --help",
    "npm test",
    "cargo build --release",
    "go test ./...",
)


_ONSETS = ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w")
_ONSETS2 = (
    "br",
    "ch",
    "cl",
    "cr",
    "dr",
    "fl",
    "gr",
    "pl",
    "pr",
    "sh",
    "sp",
    "st",
    "str",
    "th",
    "tr",
)
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "ou", "y")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "nt", "rt", "st", "ck", "x")


def _lexicon(rng: random.Random, size: int) -> list[str]:
    """Pseudo-words, so the BPE sees a realistic long tail of word shapes."""
    words: set[str] = set()
    while len(words) < size:
        syllables = [
            rng.choice(_ONSETS + _ONSETS2) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
            for _ in range(rng.randint(1, 4))
        ]
        words.add("".join(syllables))
    return sorted(words)


def _word(rng: random.Random, lexicon: list[str]) -> str:
    if rng.random() < 0.6:
        return rng.choice(_WORDS)
    if rng.random() < 0.5:
        return rng.choice(lexicon)
    # Zipf-like head: a few pseudo-words are frequent enough to become single tokens.
    return lexicon[min(int(rng.paretovariate(0.7)) - 1, len(lexicon) - 1)]


def _sentence(rng: random.Random, lexicon: list[str] | None = None) -> str:
    lex = lexicon or []
    count = rng.randint(4, 16)
    words = [_word(rng, lex) if lex else rng.choice(_WORDS) for _ in range(count)]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "?", "!", ":"))


def _prose(rng: random.Random, lexicon: list[str]) -> str:
    return " ".join(_sentence(rng, lexicon) for _ in range(rng.randint(2, 6)))


def _python(rng: random.Random, lexicon: list[str]) -> str:
    name = "_".join((rng.choice(_IDENTS), _word(rng, lexicon)))
    params = ", ".join(rng.sample(_IDENTS, rng.randint(0, 3)))
    var = rng.choice(_IDENTS)
    body = [
        f"def {name}({params}):",
        f'    """{_sentence(rng)}"""',
        f"    {var} = []",
        f"    for i in range({rng.randint(1, 100)}):",
        f"        if i % {rng.randint(2, 9)} == 0:",
        f"            {var}.append(i * {rng.randint(1, 9)})",
        f"    return {var}",
        "",
        f"class {name.title().replace('_', '')}:",
        f"    def __init__(self, {rng.choice(_IDENTS)}: int = {rng.randint(0, 9)}) -> None:",
        f"        self.{rng.choice(_IDENTS)} = {{}}",
        "",
    ]
    return "\n".join(body)


def _json(rng: random.Random, lexicon: list[str]) -> str:
    args: dict[str, object] = {
        rng.choice(_IDENTS): rng.choice(
            (rng.randint(0, 1000), _sentence(rng, lexicon), rng.choice(_COMMANDS), True, None)
        )
        for _ in range(rng.randint(1, 4))
    }
    call = {"name": "_".join((_word(rng, lexicon), rng.choice(_IDENTS))), "arguments": args}
    return json.dumps(call) if rng.random() < 0.7 else json.dumps(call, indent=2)


def _shell(rng: random.Random, lexicon: list[str]) -> str:
    lines = [
        f"$ {rng.choice(_COMMANDS)} {_word(rng, lexicon)}/{_word(rng, lexicon)}.py"
        for _ in range(rng.randint(1, 4))
    ]
    return "\n".join(lines)


def build_corpus(seed: int = 1234, documents: int = 2500) -> list[str]:
    """Return ``documents`` generated texts; the same seed always gives the same list."""
    rng = random.Random(seed)
    lexicon = _lexicon(rng, 6000)
    makers = (_prose, _prose, _python, _json, _shell)
    return [makers[i % len(makers)](rng, lexicon) for i in range(documents)]
