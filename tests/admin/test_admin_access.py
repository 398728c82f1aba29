"""Who may use the console: logins, sessions in the database, logout, expiry, and the per-client delay."""

import asyncio

import httpx
import pytest
from gradio_client import Client

from admin import operators
from admin.access import AdminAccess, LoginRefused, LoginThrottle
from tests.helpers.clocks import ManualClock
from tests.helpers.servers import operator

OPERATOR = ("op-access", "a long enough passphrase")


def test_a_client_that_keeps_guessing_waits_twice_as_long_each_time_and_others_never_wait():
    clock = ManualClock()
    throttle = LoginThrottle(3, clock=clock)
    for _ in range(3):  # the free attempts
        assert throttle.admit("203.0.113.9") == 0
        throttle.finished("203.0.113.9", ok=False)
    waits = []
    for _ in range(5):
        waits.append(throttle.admit("203.0.113.9"))  # refused: how long to wait
        clock.advance(waits[-1])
        assert throttle.admit("203.0.113.9") == 0
        throttle.finished("203.0.113.9", ok=False)
    assert waits == [1, 2, 4, 8, 16]
    assert throttle.admit("198.51.100.1") == 0  # the operator, from another address, never waits
    throttle.finished("198.51.100.1", ok=True)
    for _ in range(20):
        clock.advance(throttle.admit("203.0.113.9"))
        throttle.admit("203.0.113.9")
        throttle.finished("203.0.113.9", ok=False)
    assert throttle.wait_s("203.0.113.9") == 300  # capped at five minutes
    clock.advance(300)
    assert throttle.admit("203.0.113.9") == 0
    throttle.finished("203.0.113.9", ok=True)  # a success forgives every failure
    assert (throttle.wait_s("203.0.113.9"), throttle.num_clients()) == (0, 0)


def test_attempts_count_as_failures_before_they_are_checked():
    clock = ManualClock()
    throttle = LoginThrottle(3, clock=clock)
    admitted = [throttle.admit("203.0.113.7") for _ in range(8)]  # a burst: none of them checked yet
    assert admitted == [0, 0, 0, 1, 1, 1, 1, 1]  # the free attempts; the rest wait for their checks, then 1 s
    for _ in range(3):
        throttle.finished("203.0.113.7", ok=False)
    assert throttle.wait_s("203.0.113.7") == 1
    clock.advance(1)
    assert throttle.admit("203.0.113.7") == 0
    throttle.finished("203.0.113.7", ok=True)
    assert throttle.admit("203.0.113.7") == 0  # forgiven


def login(url: str, password: str, **kwargs) -> httpx.Response:
    return httpx.post(url + "admin/login", data={"username": OPERATOR[0], "password": password}, **kwargs)


def test_login_opens_a_session_and_logout_in_the_same_browser_ends_it(server_url, services):
    operator(services, *OPERATOR)
    browser = httpx.Client()
    r = browser.post(server_url + "admin/login", data={"username": OPERATOR[0], "password": OPERATOR[1]},
                     headers={"Accept": "text/html"})
    assert (r.status_code, r.headers["location"]) == (303, "/admin/")
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("prefixdesk_console=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/admin" in cookie
    assert browser.get(server_url + "admin/config").status_code == 200
    other = httpx.Client()
    assert other.post(server_url + "admin/login", data={"username": OPERATOR[0], "password": OPERATOR[1]}).json() \
        == {"success": True}
    r = browser.post(server_url + "admin/logout")
    assert (r.status_code, r.headers["location"]) == (303, "/admin/login")
    assert browser.get(server_url + "admin/config").status_code == 401  # this login ended ...
    assert other.get(server_url + "admin/config").status_code == 200  # ... the other one did not


def test_a_session_expires_after_its_ttl(services, aio):
    operator(services, *OPERATOR)
    clock = ManualClock()
    access = AdminAccess(services.db, ttl_s=60, free_attempts=5, clock=clock)
    token, _ = aio(access.login(name=OPERATOR[0], password=OPERATOR[1], client="192.0.2.10"))
    assert aio(access.operator_of(token)) == OPERATOR[0]
    clock.advance(59.5)
    assert aio(access.operator_of(token, fresh=True)) == OPERATOR[0]
    assert aio(access.operator_of(token)) == OPERATOR[0]  # cached for the 0.5 s it has left, no longer
    clock.advance(0.5)
    assert aio(access.operator_of(token, fresh=True)) is None
    assert aio(access.operator_of(token)) is None


def test_a_wrong_password_is_refused_and_the_right_one_works_from_the_same_address(services, aio):
    operator(services, *OPERATOR)
    clock = ManualClock()
    access = AdminAccess(services.db, ttl_s=60, free_attempts=2, clock=clock)
    for _ in range(2):  # two free attempts, then the next try waits a second
        with pytest.raises(LoginRefused) as exc:
            aio(access.login(name=OPERATOR[0], password="wrong guess", client="192.0.2.11"))
        assert (str(exc.value), exc.value.status) == ("Wrong name or password.", 401)
    with pytest.raises(LoginRefused) as exc:
        aio(access.login(name=OPERATOR[0], password=OPERATOR[1], client="192.0.2.11"))  # now it waits 1 s
    assert (exc.value.status, exc.value.retry_after_s) == (429, 1)
    assert str(exc.value) == "Too many failed logins from your address; try again in 1 s."
    assert aio(access.login(name=OPERATOR[0], password=OPERATOR[1], client="192.0.2.12"))  # another address: fine
    clock.advance(0.5)
    with pytest.raises(LoginRefused) as exc:
        aio(access.login(name=OPERATOR[0], password=OPERATOR[1], client="192.0.2.11"))  # not yet
    assert (str(exc.value), exc.value.status, exc.value.retry_after_s) == (
        "Too many failed logins from your address; try again in 1 s.", 429, 1)
    clock.advance(0.5)
    assert aio(access.login(name=OPERATOR[0], password=OPERATOR[1], client="192.0.2.11"))


def test_a_disabled_operator_is_refused_at_the_next_click(server_url, services):
    operator(services, "op-temp", "another long secret")
    client = Client(server_url + "admin/", auth=("op-temp", "another long secret"), verbose=False)
    assert client.predict(api_name="/templates")[0]["data"]  # logged in: it works
    operators.disable(services.db, name="op-temp")
    with pytest.raises(Exception):
        client.predict(api_name="/templates")  # same cookie: refused by the gate or by the handler itself
    assert httpx.get(server_url + "admin/config", cookies=client.cookies).status_code == 401


def test_the_chat_session_cannot_call_the_console(server_url):
    chat = httpx.Client()
    chat.get(server_url)  # a customer's browser session on the chat
    assert chat.get(server_url + "admin/config").status_code == 401
    assert chat.get(server_url + "admin/config").json() == {"detail": "未登录：请打开 /admin/login。"}
    with pytest.raises(ValueError):
        Client(server_url + "admin/", verbose=False)


def test_a_free_hashing_slot_goes_to_the_address_that_failed_least(aio):
    from admin.access import FairHashing

    hashing = FairHashing(1)
    order: list[str] = []

    async def check(client: str, rank: int, started: asyncio.Event | None = None):
        async with hashing.turn(client, rank=rank):
            order.append(client)
            if started:
                started.set()
            await asyncio.sleep(0.01)

    async def scenario():
        started = asyncio.Event()
        first = asyncio.create_task(check("guesser", 3, started))
        await started.wait()  # "guesser" holds the only slot; then the line forms
        rest = [asyncio.create_task(check(c, r)) for c, r in (("guesser", 4), ("flood-a", 1), ("flood-b", 0),
                                                               ("operator", 0), ("flood-a", 2))]
        await asyncio.gather(first, *rest)

    aio(scenario())
    assert order == ["guesser", "flood-b", "operator", "flood-a", "flood-a", "guesser"]
