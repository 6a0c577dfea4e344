"""The Live UI's login: throttled key checks and expiring, revocable cookies.

Owns what ``POST /ui/login`` and ``POST /ui/logout`` decide, for ``proxy.routes.ui``.

Contract:
- ``LoginGuard.check(client, key)`` returns when ``key`` is the admin key (compared in
  constant time) and raises ``AuthenticationFailed`` when it is not. A client (its
  address) that failed ``max_failures`` times within ``window_s`` is locked out: every
  attempt, right or wrong, raises ``Overloaded`` (429 with ``Retry-After``) until the
  lockout ends, and each further failure doubles it, up to ``max_lockout_s``. A success
  forgets the client's failures. At most ``max_clients`` clients are tracked (the oldest
  forgotten first), so a flood of addresses cannot grow memory.
- ``issue()`` is a cookie value: ``<expiry>.<nonce>.<mac>``, the MAC an HMAC-SHA256 under
  a key derived from the admin key, so every replica sharing the admin key accepts it and
  the admin key itself is never in it. ``valid(value)`` is true until its expiry
  (``ttl_s``) unless ``revoke(value)`` was called (logout) on this replica. Changing the
  admin key invalidates every cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from kernel.errors import AuthenticationFailed, Overloaded


@dataclass(slots=True)
class _Failures:
    count: int
    first_at: float
    locked_until: float = 0.0
    lockout_s: float = 0.0


class LoginGuard:
    def __init__(
        self,
        admin_key: bytes,
        *,
        ttl_s: float = 12 * 3600,
        max_failures: int = 5,
        window_s: float = 300.0,
        lockout_s: float = 60.0,
        max_lockout_s: float = 3600.0,
        max_clients: int = 10_000,
    ) -> None:
        self._admin_key = admin_key
        self._mac_key = hmac.new(admin_key, b"lego-proxy live ui cookie", hashlib.sha256).digest()
        self._ttl_s = ttl_s
        self._max_failures = max_failures
        self._window_s = window_s
        self._lockout_s = lockout_s
        self._max_lockout_s = max_lockout_s
        self._max_clients = max_clients
        self._failures: OrderedDict[str, _Failures] = OrderedDict()
        self._revoked: dict[str, float] = {}  # nonce -> expiry, until it would expire anyway

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    # -- the key --------------------------------------------------------------------
    def check(self, client: str, key: str) -> None:
        now = time.monotonic()
        failures = self._failures.get(client)
        if failures is not None and failures.locked_until > now:
            raise Overloaded(
                "too many wrong keys from this address; try again later",
                retry_after_s=failures.locked_until - now,
            )
        if hmac.compare_digest(key.encode(), self._admin_key):
            self._failures.pop(client, None)
            return
        self._fail(client, now)
        raise AuthenticationFailed("That is not the admin key.")

    def _fail(self, client: str, now: float) -> None:
        failures = self._failures.pop(client, None)
        stale = failures is not None and now - failures.first_at > self._window_s
        if failures is None or (stale and not failures.locked_until):
            failures = _Failures(0, now)
        failures.count += 1
        if failures.count >= self._max_failures:
            doubled = failures.lockout_s * 2 if failures.lockout_s else self._lockout_s
            failures.lockout_s = min(self._max_lockout_s, doubled)
            failures.locked_until = now + failures.lockout_s
        self._failures[client] = failures  # most recent last
        while len(self._failures) > self._max_clients:
            self._failures.popitem(last=False)

    # -- the cookie -----------------------------------------------------------------
    def issue(self) -> str:
        expiry = math.ceil(time.time() + self._ttl_s)
        nonce = secrets.token_urlsafe(16)
        return f"{expiry}.{nonce}.{self._mac(expiry, nonce)}"

    def valid(self, value: str) -> bool:
        parsed = self._parse(value)
        if parsed is None:
            return False
        expiry, nonce = parsed
        return expiry > time.time() and nonce not in self._revoked

    def revoke(self, value: str) -> None:
        parsed = self._parse(value)
        if parsed is None:
            return
        now = time.time()
        self._revoked = {n: e for n, e in self._revoked.items() if e > now}
        self._revoked[parsed[1]] = parsed[0]

    def _parse(self, value: str) -> tuple[int, str] | None:
        expiry, _, rest = value.partition(".")
        nonce, _, mac = rest.partition(".")
        if not expiry.isdigit() or len(expiry) > 12 or not nonce:
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(int(expiry), nonce).encode()):
            return None
        return int(expiry), nonce

    def _mac(self, expiry: int, nonce: str) -> str:
        message = f"{expiry}.{nonce}".encode()
        return hmac.new(self._mac_key, message, hashlib.sha256).hexdigest()
