"""The Live UI's login (issue 16, item 10): throttled guesses, cookies that expire and that
logout revokes, framing and script policies, bounded page numbers."""

from __future__ import annotations

import time

import httpx
import pytest

from kernel.errors import AuthenticationFailed, Overloaded
from proxy.routes.ui_login import LoginGuard
from tests.proxy.conftest import ADMIN_KEY, Proxy

KEY = b"the-admin-key-of-this-test"


def test_a_client_is_locked_out_after_repeated_wrong_keys() -> None:
    guard = LoginGuard(KEY, max_failures=3, lockout_s=0.2, max_lockout_s=10)
    for _ in range(2):
        with pytest.raises(AuthenticationFailed):
            guard.check("1.2.3.4", "guess")
    guard.check("1.2.3.4", KEY.decode())  # a success forgets the failures
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            guard.check("1.2.3.4", "guess")
    with pytest.raises(Overloaded) as locked:
        guard.check("1.2.3.4", KEY.decode())  # even the right key, while locked out
    assert 0 < locked.value.retry_after_s <= 0.2
    guard.check("5.6.7.8", KEY.decode())  # another address is not held back
    time.sleep(0.25)
    with pytest.raises(AuthenticationFailed):
        guard.check("1.2.3.4", "guess")  # each failure after a lockout doubles it
    with pytest.raises(Overloaded) as again:
        guard.check("1.2.3.4", "guess")
    assert 0.2 < again.value.retry_after_s <= 0.4


def test_tracked_clients_are_bounded() -> None:
    guard = LoginGuard(KEY, max_clients=10)
    for n in range(100):
        with pytest.raises(AuthenticationFailed):
            guard.check(f"10.0.0.{n}", "guess")
    assert len(guard._failures) == 10


def test_cookies_expire_are_revoked_and_cannot_be_forged() -> None:
    guard = LoginGuard(KEY, ttl_s=1)
    cookie = guard.issue()
    assert guard.valid(cookie)
    assert KEY.decode() not in cookie
    expiry, nonce, mac = cookie.split(".")
    assert not guard.valid(f"{int(expiry) + 3600}.{nonce}.{mac}")  # a longer life: forged
    assert not LoginGuard(b"another-admin-key-entirely").valid(cookie)
    other = guard.issue()
    guard.revoke(cookie)
    assert not guard.valid(cookie)
    assert guard.valid(other)
    for junk in ("", "1.2", "x" * 10_000):
        assert not guard.valid(junk)
    time.sleep(2.1)
    assert not guard.valid(other)


def test_pages_forbid_framing_and_foreign_scripts(proxy: Proxy) -> None:
    for response in (proxy.admin.get("/ui"), httpx.get(f"{proxy.url}/ui/login")):
        assert response.status_code == 200
        policy = response.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy
        assert "script-src 'self'" in policy
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"


def test_a_huge_page_number_is_a_400(proxy: Proxy) -> None:
    response = proxy.admin.get("/ui?page=" + "9" * 23)
    assert response.status_code == 400
    assert "page" in response.text


def test_logout_revokes_the_cookie_and_it_expires(proxy: Proxy) -> None:
    with httpx.Client(base_url=proxy.url) as browser:
        ok = browser.post("/ui/login", data={"key": ADMIN_KEY, "next": "/ui"})
        assert ok.status_code == 303
        assert "max-age=43200" in ok.headers["set-cookie"].lower()
        cookie = browser.cookies["lego_ui"]
        assert browser.get("/ui").status_code == 200
        browser.post("/ui/logout")
    # A copy of the cookie (stolen, or a second tab) stops working too.
    with httpx.Client(base_url=proxy.url, cookies={"lego_ui": cookie}) as copy:
        assert copy.get("/ui").status_code == 303


def test_guessing_the_key_is_throttled(proxy: Proxy) -> None:
    """Last in the module: it locks this proxy's loopback client out."""
    with httpx.Client(base_url=proxy.url) as browser:
        statuses = [
            browser.post("/ui/login", data={"key": f"guess-{n}"}).status_code for n in range(8)
        ]
        assert statuses[:5] == [401] * 5
        assert statuses[5:] == [429] * 3
        locked = browser.post("/ui/login", data={"key": ADMIN_KEY})
        assert locked.status_code == 429
        assert int(locked.headers["retry-after"]) >= 1
    # The API's admin key is not the UI's login form: it is not locked out.
    assert proxy.admin.get("/api/v1/runs/none/weight_versions").status_code == 404
