"""Session keys as the server issues and checks them (app/core/session_keys.py)."""

import secrets

from app.core.session_keys import MAX_SESSION_KEY_CHARS, SessionKeys


def test_an_issued_browser_key_is_kept_and_anything_else_is_none():
    keys = SessionKeys(secrets.token_hex(32))
    issued = keys.mint_browser()
    assert len(issued) == 47 and issued.startswith("b.") and keys.browser(issued) == issued
    assert keys.mint_browser() != issued
    ident, mac = issued.split(".")[1:]
    flipped = mac[:-1] + ("A" if mac[-1] != "A" else "B")
    other = SessionKeys(secrets.token_hex(32))
    for value in (f"b.{ident}.{flipped}", other.mint_browser(), keys.api("h1"), issued + "x", issued.upper(), "",
                  None, 12345, ["b", ident, mac], "k" * 900_000):
        assert keys.browser(value) is None, value


def test_api_keys_are_per_session_hash_fixed_in_size_and_never_browser_keys():
    keys = SessionKeys(secrets.token_hex(32))
    first, second = keys.api("abc"), keys.api("abd")
    assert first == keys.api("abc") != second
    assert len(first) == len(second) == 24 <= MAX_SESSION_KEY_CHARS
    assert keys.browser(first) is None
