"""Console access under attack: password guessing is throttled, logins expire, logout works."""

import httpx
import pytest
from gradio_client import Client

from admin import auth

OPERATOR = ("op-access", "a long enough passphrase")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_after_five_failures_even_the_right_password_is_refused_until_the_window_passes():
    clock = Clock()
    throttle = auth.LoginThrottle(5, clock=clock)
    for _ in range(5):
        assert not throttle.locked("mallory")
        throttle.record_failure("mallory")
    assert throttle.locked("mallory")
    assert not throttle.locked("alice")  # other accounts are not affected
    clock.now += auth.LOCKOUT_WINDOW_S + 1
    assert not throttle.locked("mallory")


def test_a_login_expires_after_its_ttl():
    clock = Clock()
    sessions = auth.SessionClock(60, clock=clock)
    sessions.check("token-a")
    clock.now += 59
    sessions.check("token-a")
    sessions.check("token-b")  # a newer login has its own clock
    clock.now += 2
    with pytest.raises(auth.NotAuthorized, match="Your console session has expired: log out and log in again."):
        sessions.check("token-a")
    sessions.check("token-b")


def login(admin_url, password) -> httpx.Response:
    return httpx.post(admin_url + "login", data={"username": OPERATOR[0], "password": password})


def test_guessing_over_http_locks_the_account_and_logout_ends_the_session(server_url, services):
    auth.set_password(store=services.store, name=OPERATOR[0], password=OPERATOR[1])
    admin_url = server_url + "admin/"
    good = httpx.Client()
    assert good.post(admin_url + "login", data={"username": OPERATOR[0], "password": OPERATOR[1]}).status_code == 200
    assert good.get(admin_url + "config").status_code == 200

    good.get(admin_url + "logout", follow_redirects=False)
    assert good.get(admin_url + "config").status_code == 401  # logged out: the cookie no longer works

    statuses = [login(admin_url, f"guess {i}").status_code for i in range(5)]
    assert statuses == [400] * 5
    assert login(admin_url, OPERATOR[1]).status_code == 400  # locked, even with the right password


def test_the_chat_session_cannot_call_the_console(server_url):
    chat = httpx.Client()
    chat.get(server_url)  # a customer's browser session on the chat
    assert chat.get(server_url + "admin/config").status_code == 401
    with pytest.raises(ValueError, match="as credentials were not provided. Please login."):
        Client(server_url + "admin/", verbose=False)
