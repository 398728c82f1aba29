"""Attack: turn the console's login against its operator, or keep a session that should be over.

Before: five wrong passwords from anywhere locked the real operator out for five minutes, again and
again (a lock per account; cross-origin form posts counted too); scrypt ran on the event loop, so 32
concurrent logins took /healthz from 3 ms to 1.2 s; an expired session worked again when a decoy
``access-token-*`` cookie came before the real one. Then: the cap on checks waiting to be hashed was
shared by everyone and failures were counted after hashing, so one address's burst of 16 concurrent
guesses was hashed 16 times instead of 5, and 64 addresses guessing at once got the operator 429 on
11 of 13 tries.
After: failures delay only the address they come from (1 s, 2 s, 4 s … after the free attempts), an
attempt counts as a failure before it is hashed (and is forgiven when it succeeds), each address has
at most one check hashing and the addresses take turns, a form posted from another origin is
refused, passwords are hashed on a thread a few at a time, and a session is one exact cookie checked
against the database.
"""

import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time

import httpx

import admin.access
from admin.access import DEVICE_COOKIE, HASH_CONCURRENCY, AdminAccess
from tests.helpers.clocks import ManualClock
from tests.helpers.latency import loop_thread
from tests.helpers.servers import SecondServer, operator
from tests.helpers.waiting import wait_until

OPERATOR = ("admin", "operator passphrase 9")  # the proxied server's PREFIXDESK_ADMIN_USER / _PASSWORD


def login(url: str, password: str, client: str, **headers) -> httpx.Response:
    return httpx.post(url + "admin/login", data={"username": OPERATOR[0], "password": password},
                      headers={"X-Forwarded-For": client, **headers}, timeout=30)


def test_a_stranger_guessing_passwords_cannot_lock_the_operator_out(services, engine_loop, tmp_path):
    stranger, operator_address = "203.0.113.66", "198.51.100.5"
    # The login delays run on a clock of the test's own: a slow moment of this machine lets no delay run out.
    with SecondServer(services, engine_loop, tmp_path, trusted_proxies="127.0.0.1", admin_password=OPERATOR[1],
                      admin_login_attempts=3, admin_clock=ManualClock()) as url:
        statuses = [login(url, f"guess {i}", stranger).status_code for i in range(3)]
        assert statuses == [401, 401, 401]  # the free attempts (PREFIXDESK_ADMIN_LOGIN_ATTEMPTS=3) ...
        waited = login(url, "guess 3", stranger)  # ... then each further try waits
        assert (waited.status_code, waited.headers["retry-after"]) == (429, "1")
        assert waited.json() == {"detail": "Too many failed logins from your address; try again in 1 s."}
        ok = login(url, OPERATOR[1], operator_address)  # the operator, meanwhile, from their own address
        assert (ok.status_code, ok.json()) == (200, {"success": True})


def test_a_login_form_posted_from_another_site_is_refused(proxied):
    r = login(proxied, OPERATOR[1], "198.51.100.6", Origin="https://evil.example")
    assert (r.status_code, r.json()) == (403, {"detail": "请从本服务器自己的登录页登录。"})
    assert "set-cookie" not in r.headers
    same = login(proxied, OPERATOR[1], "198.51.100.6", Origin=proxied.rstrip("/"))
    assert same.status_code == 200


def test_a_decoy_cookie_does_not_revive_an_expired_session(services, engine_loop, tmp_path):
    clock = ManualClock()
    with SecondServer(services, engine_loop, tmp_path, admin_password="operator passphrase 9",
                      admin_session_ttl_s=60, admin_clock=clock) as url:
        r = httpx.post(url + "admin/login", data={"username": "admin", "password": "operator passphrase 9"})
        token = r.cookies["prefixdesk_console"]
        assert httpx.get(url + "admin/config", cookies={"prefixdesk_console": token}).status_code == 200
        clock.advance(60)  # the session's TTL
        for cookies in ({"prefixdesk_console": token},
                        {"access-token-x": token, "prefixdesk_console": token},
                        {"access-token-unsecure-x": "forged", "prefixdesk_console": token},
                        {"prefixdesk_console": "forged-token"}):
            r = httpx.get(url + "admin/config", cookies=cookies)
            assert (r.status_code, r.json()) == (401, {"detail": "未登录：请打开 /admin/login。"}), cookies


# 32 logins at once from 32 addresses, sent by a process of its own (32 client threads in this one would hold
# the GIL the server needs); prints their statuses.
LOGINS = """
import concurrent.futures, json, sys, httpx
url, password = sys.argv[1], sys.argv[2]
def one(i):
    return httpx.post(url + "admin/login", data={"username": "admin", "password": password},
                      headers={"X-Forwarded-For": f"192.0.2.{100 + i}"}, timeout=300).status_code
print("ready", flush=True)
sys.stdin.readline()
with concurrent.futures.ThreadPoolExecutor(32) as pool:
    print(json.dumps(list(pool.map(one, range(32)))))
"""
HOLD_S = 120  # how long a held check waits to be let go: a test that failed on the way lets its server go on


class HeldChecks:
    """The console's password checks from now on, each held before it hashes until ``release()`` (the real
    scrypt check runs then): the threads they ran on, and how many ran at once."""

    def __init__(self, monkeypatch):
        self.threads: list[int] = []
        self.running = self.most_at_once = 0
        self.started = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()
        verify = admin.access.verify_password

        def held(password, stored):
            with self._lock:
                self.threads.append(threading.get_ident())
                self.running += 1
                self.most_at_once = max(self.most_at_once, self.running)
            self.started.set()
            try:
                self._released.wait(HOLD_S)
                return verify(password, stored)
            finally:
                with self._lock:
                    self.running -= 1

        monkeypatch.setattr(admin.access, "verify_password", held)

    def release(self) -> None:
        self._released.set()


def test_thirty_two_logins_at_once_do_not_stall_the_server(proxied, engine_loop, monkeypatch):
    # Whether the server stalls is asked of where the hashing runs, not of how long anything took: a check held
    # on a thread leaves the event loop free to answer, the same check held on the loop answers nothing until it
    # is let go (scrypt on the loop took /healthz from 3 ms to 1.2 s), however busy or idle the machine is.
    loop = loop_thread(engine_loop)
    checks = HeldChecks(monkeypatch)
    logins = subprocess.Popen([sys.executable, "-c", LOGINS, proxied, OPERATOR[1]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert logins.stdout.readline() == "ready\n"  # its imports done: they are no part of the attack
        logins.stdin.write("go\n")
        logins.stdin.flush()
        assert checks.started.wait(HOLD_S), "no login reached its password check"
        # The checks fill their slots and the rest queue for a turn, while the server answers everything else.
        wait_until(lambda: checks.running == HASH_CONCURRENCY, 60,
                   lambda: f"{HASH_CONCURRENCY} checks at once ({checks.running} running)")
        try:
            health = httpx.get(proxied + "healthz", timeout=30)
        except httpx.TimeoutException:
            raise AssertionError("/healthz did not answer while a password check was running") from None
        assert (health.status_code, health.json()["ok"]) == (200, True)
        assert loop not in checks.threads, "a password was hashed on the event loop"
    finally:
        checks.release()
    out, _ = logins.communicate(timeout=300)
    statuses = json.loads(out)
    assert statuses == [200] * 32  # 32 fresh addresses with the right password: each let in, in its turn
    assert len(checks.threads) == 32 and loop not in checks.threads
    assert checks.most_at_once == HASH_CONCURRENCY  # a few at a time: the rest of the cores for the loop
    print(f"\n32 concurrent logins: {statuses.count(200)} ok, hashed {HASH_CONCURRENCY} at a time on "
          f"{len(set(checks.threads))} threads, none of them the event loop's")


def counting_hashes(monkeypatch) -> list[str]:
    """The passwords the console hashes from now on (the real scrypt check still runs)."""
    hashed: list[str] = []
    verify = admin.access.verify_password

    def counted(password, stored):
        hashed.append(password)
        return verify(password, stored)

    monkeypatch.setattr(admin.access, "verify_password", counted)
    return hashed


def at_once(calls) -> list[httpx.Response]:
    results: list = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i, call):
        start.wait()
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_a_burst_of_guesses_from_one_address_is_hashed_only_for_the_free_attempts(proxied, monkeypatch):
    hashed = counting_hashes(monkeypatch)
    answers = at_once([lambda i=i: login(proxied, f"burst {i}", "203.0.113.90") for i in range(16)])
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [401] * 3 + [429] * 13  # PREFIXDESK_ADMIN_LOGIN_ATTEMPTS=3
    assert len(hashed) == 3
    for r in answers:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1"
            assert r.json() == {"detail": "Too many failed logins from your address; try again in 1 s."}


def test_sixty_four_addresses_guessing_at_once_do_not_keep_the_operator_out(proxied):
    done = threading.Event()
    attempts: list[int] = []

    def guess(n: int):
        i = 0
        while not done.is_set():
            attempts.append(login(proxied, f"flood {i}", f"198.18.7.{n}").status_code)
            i += 1

    flood = [threading.Thread(target=guess, args=(n,)) for n in range(1, 65)]
    for t in flood:
        t.start()
    # A real flood before the operator tries: on average every address has had a guess hashed (waited for as a
    # count: a fixed second's head start made how many there were depend on the machine's speed).
    wait_until(lambda: attempts.count(401) >= 64, 120, lambda: f"64 guesses hashed ({attempts.count(401)} so far)")
    tries, waits_ms = [], []
    for _ in range(6):
        started = time.monotonic()
        r = httpx.post(proxied + "admin/login", data={"username": OPERATOR[0], "password": OPERATOR[1]},
                       headers={"X-Forwarded-For": "198.51.100.9", "Accept": "text/html"}, timeout=60)
        waits_ms.append((time.monotonic() - started) * 1000)
        tries.append((r.status_code, r.headers.get("location")))
    done.set()
    for t in flood:
        t.join()
    print(f"\n64 addresses sent {len(attempts)} wrong passwords ({attempts.count(401)} hashed, "
          f"{attempts.count(429)} told to wait); the operator's logins took {statistics.median(waits_ms):.0f} ms "
          f"(p50), {max(waits_ms):.0f} ms at most")
    assert tries == [(303, "/admin/")] * 6
    assert attempts.count(401) >= 64  # still so at the end


def test_the_operators_own_browser_logs_in_ahead_of_fresh_addresses(services, aio):
    """Before: every address with no failures had the operator's rank, so 300 addresses with one guess each kept
    the operator's login waiting 28 s. After: the device mark of an earlier login puts it first in the queue."""
    operator(services, *OPERATOR)
    access = AdminAccess(services.db, ttl_s=60, free_attempts=5)
    _, mark = aio(access.login(name=OPERATOR[0], password=OPERATOR[1], client="198.51.100.30"))
    other_mark = aio(access.login(name=OPERATOR[0], password=OPERATOR[1], client="198.51.100.30"))[1]
    flood, rounds = 24, iter(range(10, 20))

    async def race(device: str | None) -> tuple[int, bool]:
        """(where the operator's login finished among the flood's, whether it was let in); each race's guesses come
        from addresses of their own, fresh (no failures: the operator's rank without a mark)."""
        finished: list[str] = []
        fresh = next(rounds)

        async def attempt(password: str, client: str, device: str | None = None) -> bool:
            try:
                await access.login(name=OPERATOR[0], password=password, client=client, device=device)
                return True
            except admin.access.LoginRefused:
                return False
            finally:
                finished.append(client)

        tasks = [asyncio.create_task(attempt(f"guess {i}", f"198.18.{fresh}.{i}")) for i in range(flood)]
        while access._hashing.num_queued() < flood:  # every guess let in and queued before the operator comes
            await asyncio.sleep(0.01)
        let_in = await attempt(OPERATOR[1], "198.51.100.31", device)
        await asyncio.gather(*tasks)
        return finished.index("198.51.100.31"), let_in

    position, let_in = aio(race(mark))
    print(f"\nwith its mark the operator's login finished {position + 1}. of {flood + 1}")
    # Ahead of every guess waiting: only the checks running when it came (HASH_CONCURRENCY), and those that took
    # the slots they freed meanwhile, finish before it.
    assert let_in and position < 2 * HASH_CONCURRENCY
    # A mark that is not this operator's current one (forged, or from before a new password) is no mark: the
    # login waits its turn behind every fresh address, as one from a browser without a mark does.
    forged = mark.split(".")[0] + "." + "0" * 64
    assert aio(race(forged)) == (flood, True)
    assert aio(race(None)) == (flood, True)
    operator(services, OPERATOR[0], "a new passphrase 10")
    assert aio(race(other_mark))[0] == flood  # the password changed: the old marks are void
    operator(services, *OPERATOR)


def test_a_login_gives_the_browser_its_device_mark(proxied):
    first = login(proxied, OPERATOR[1], "198.51.100.40")
    assert first.status_code == 200
    cookie = [h for h in first.headers.get_list("set-cookie") if h.startswith(DEVICE_COOKIE + "=")]
    assert len(cookie) == 1
    assert "; HttpOnly" in cookie[0] and "; Path=/admin/login" in cookie[0] and "; SameSite=strict" in cookie[0]
    assert "Max-Age=7776000" in cookie[0]
    again = httpx.post(proxied + "admin/login", data={"username": OPERATOR[0], "password": OPERATOR[1]},
                       headers={"X-Forwarded-For": "198.51.100.41"}, cookies={DEVICE_COOKIE: first.cookies[DEVICE_COOKIE]},
                       timeout=30)
    assert again.status_code == 200
