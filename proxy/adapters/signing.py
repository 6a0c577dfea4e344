"""Signatures on the reasoning the proxy hands out, so it can tell its own when it comes back.

Owns ``ReasoningSigner``: an HMAC-SHA256 over the reasoning text with a secret from the
settings (``Settings.effective_signing_secret``; replicas sharing the secret verify each
other's signatures). Anthropic ``thinking`` blocks carry ``sign(text)`` as their
``signature``; OpenAI Responses ``reasoning`` items carry ``seal(text)`` as their
``encrypted_content``, an opaque blob that holds the text itself because Codex echoes the
item without its readable content.

Contract:
- ``verify(text, signature)`` is True exactly for signatures ``sign`` made for that text
  with the same secret (constant-time comparison).
- ``unseal(seal(text)) == text``; ``unseal`` raises ``InvalidRequest`` for a blob this
  proxy did not make or that was altered.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from kernel.errors import InvalidRequest

_PREFIX = "lego1."
_DIGEST_BYTES = 32


class ReasoningSigner:
    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise ValueError("the signing secret must not be empty")
        self._secret = secret

    def _mac(self, text: str) -> bytes:
        return hmac.new(self._secret, text.encode(), hashlib.sha256).digest()

    def sign(self, text: str) -> str:
        return _PREFIX + base64.urlsafe_b64encode(self._mac(text)).decode()

    def verify(self, text: str, signature: str) -> bool:
        return hmac.compare_digest(self.sign(text).encode(), signature.encode())

    def seal(self, text: str) -> str:
        raw = self._mac(text) + text.encode()
        return _PREFIX + base64.urlsafe_b64encode(raw).decode()

    def unseal(self, blob: str, *, param: str) -> str:
        not_ours = InvalidRequest(
            "the encrypted reasoning content was not produced by this proxy", param=param
        )
        if not blob.startswith(_PREFIX):
            raise not_ours
        try:
            raw = base64.urlsafe_b64decode(blob[len(_PREFIX) :].encode())
            text = raw[_DIGEST_BYTES:].decode()
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise not_ours from None
        if not hmac.compare_digest(raw[:_DIGEST_BYTES], self._mac(text)):
            raise not_ours
        return text
