"""The admin key check shared by the control, export and Live UI routes.

Contract: ``is_admin(authorization, admin_key)`` says whether the header carries the
admin key; ``require_admin(authorization, admin_key, api)`` returns when the header is
``Bearer <admin key>`` (compared in constant time) and raises ``AuthenticationFailed``
naming ``api`` otherwise, with a message that tells a missing key (or another scheme)
from a wrong one. The admin key is ``LEGO_ADMIN_KEY`` (in development, unset, the default
``lego-dev-admin-key``, which ``lego-proxy serve`` prints at start).
"""

from __future__ import annotations

import hmac

from kernel.errors import AuthenticationFailed


def require_admin(authorization: str, admin_key: bytes, api: str) -> None:
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed(f"the {api} needs 'Authorization: Bearer <admin key>'")
    if not hmac.compare_digest(token.strip().encode(), admin_key):
        raise AuthenticationFailed(
            f"the {api} was sent a Bearer key that is not this proxy's admin key (LEGO_ADMIN_KEY)"
        )


def is_admin(authorization: str, admin_key: bytes) -> bool:
    """Whether the header carries the admin key (for answers that say more to admins)."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), admin_key)
