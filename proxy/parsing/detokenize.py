"""Incremental detokenization of sampled token ids: exact, never a partial character.

Owns ``IncrementalDetokenizer``. Contract:

- ``feed(ids)`` returns the text the new ids complete; ``finish()`` returns whatever is still
  held back. The concatenation of everything returned equals the tokenizer's decode of all
  fed ids with special tokens removed.
- Text is held back while the decoded tail ends in U+FFFD: with byte-level BPE one character
  may span several tokens, and a partial character must never reach the harness. ``finish``
  releases it as decoded (replacement characters included).
- Special tokens (``tokenizer.all_special_ids`` plus every added token flagged special, such
  as ``<|im_start|>``) produce no text; added non-special tokens (``<think>``) keep theirs,
  and so do the tokens named in ``keep`` however they are flagged: the markup the output
  parser reads (``<think>``, ``<tool_call>``, ...) is special in some tokenizers, and its
  text must reach the parser either way.
- Each feed decodes only a window: the tokens since the last emission plus the tokens of the
  emission before it as left context (the prefix/read offset technique), so the cost is
  proportional to the new tokens, not to the output so far.
- ``tokens_for_chars(n)`` answers how many fed tokens it took to produce the first ``n``
  characters returned; it needs the emission history, kept until ``stop_tracking()``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernel.errors import LegoError
from proxy.render import rust_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"


@dataclass(frozen=True, slots=True)
class _Emission:
    """One piece of returned text: characters [char_start, char_end) came from the tokens
    [token_start, token_end), decoded with tokens from ``context`` on as left context."""

    char_start: int
    char_end: int
    token_start: int
    token_end: int
    context: int


def special_token_ids(
    tokenizer: PreTrainedTokenizerBase, keep: Collection[str] = ()
) -> frozenset[int]:
    """Ids that must produce no text: the declared special tokens and every added token the
    tokenizer itself flags special (Qwen's ``<|im_start|>`` is not in ``all_special_ids``),
    except those whose text is in ``keep``."""
    ids = {int(i) for i in tokenizer.all_special_ids}
    for token_id, added in tokenizer.added_tokens_decoder.items():
        if added.special:
            ids.add(int(token_id))
    kept = {i for i in ids if tokenizer.convert_ids_to_tokens(i) in keep}
    return frozenset(ids - kept)


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        keep: Collection[str] = (),
        special: frozenset[int] | None = None,
    ) -> None:
        """``special``: ``special_token_ids(tokenizer, keep)`` computed once by a caller
        that makes a detokenizer per turn (it walks the tokenizer's added tokens)."""
        self._tokenizer = tokenizer
        # A fast tokenizer's own Rust decode: what ``tokenizer.decode`` calls (with special
        # tokens kept and no clean-up of spaces, as here), without its 2 us of Python
        # around each call; a feed decodes twice.
        self._backend = rust_tokenizer(tokenizer)
        self._special = special if special is not None else special_token_ids(tokenizer, keep)
        self._ids: list[int] = []
        self._prefix = 0  # start of the left context of the next window
        self._read = 0  # first token whose text has not been returned yet
        self._chars = 0  # characters returned so far
        self._tracking = True
        self._emissions: list[_Emission] = []
        self._emission_ends: list[int] = []  # char_end of each emission, for bisect

    @property
    def token_count(self) -> int:
        return len(self._ids)

    def feed(self, token_ids: Sequence[int]) -> str:
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def finish(self) -> str:
        return self._advance(final=True)

    def stop_tracking(self) -> None:
        """Forget the emission history; ``tokens_for_chars`` is no longer needed."""
        self._tracking = False
        self._emissions.clear()
        self._emission_ends.clear()

    def tokens_for_chars(self, n: int) -> int:
        """The fewest fed tokens whose text covers the first ``n`` returned characters."""
        if n <= 0:
            return 0
        if not self._tracking:
            raise LegoError("tokens_for_chars after stop_tracking")
        i = bisect_left(self._emission_ends, n)
        if i == len(self._emissions):
            return len(self._ids)
        em = self._emissions[i]
        if em.token_end - em.token_start == 1:
            return em.token_end
        # Several tokens were emitted together: binary-search the shortest prefix of them
        # whose text reaches character n with that character complete. Done once per turn.
        base = self._decode(em.context, em.token_start)
        need = n - em.char_start
        lo, hi = em.token_start + 1, em.token_end
        while lo < hi:
            mid = (lo + hi) // 2
            text = self._decode(em.context, mid)
            index = len(base) + need - 1
            if index < len(text) and text[index] != _REPLACEMENT:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _decode(self, start: int, end: int) -> str:
        ids = [i for i in self._ids[start:end] if i not in self._special]
        if not ids:
            return ""
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)
        text = self._tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)
        return text

    def _advance(self, *, final: bool) -> str:
        end = len(self._ids)
        if end == self._read:
            return ""
        context_text = self._decode(self._prefix, self._read)
        full_text = self._decode(self._prefix, end)
        if len(full_text) <= len(context_text):
            if final:
                self._prefix = self._read = end
            return ""
        if not final and full_text.endswith(_REPLACEMENT):
            return ""
        delta = full_text[len(context_text) :]
        if self._tracking:
            emission = _Emission(
                self._chars, self._chars + len(delta), self._read, end, self._prefix
            )
            self._emissions.append(emission)
            self._emission_ends.append(emission.char_end)
        self._chars += len(delta)
        self._prefix, self._read = self._read, end
        return delta
