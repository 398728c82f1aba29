"""Attack: turn the console's login against its operator, or keep a session that should be over.

Before: five wrong passwords from anywhere locked the real operator out for five minutes, again and
again (a lock per account; cross-origin form posts counted too); scrypt ran on the event loop, so 32
concurrent logins took /healthz from 3 ms to 1.2 s; an expired session worked again when a decoy
``access-token-*`` cookie came before the real one.
After: failures delay only the address they come from (1 s, 2 s, 4 s … after the free attempts), a
form posted from another origin is refused, passwords are hashed on a thread a few at a time, and a
session is one exact cookie checked against the database.
"""

import json
import subprocess
import sys
import time

import httpx

from app.console.passwords import hash_password, verify_password
from tests.helpers.clocks import ManualClock
from tests.helpers.latency import LoopCpu
from tests.helpers.servers import SecondServer

OPERATOR = ("admin", "operator passphrase 9")  # the proxied server's PREFIXDESK_ADMIN_USER / _PASSWORD


def login(url: str, password: str, client: str, **headers) -> httpx.Response:
    return httpx.post(url + "admin/login", data={"username": OPERATOR[0], "password": password},
                      headers={"X-Forwarded-For": client, **headers}, timeout=30)


def test_a_stranger_guessing_passwords_cannot_lock_the_operator_out(proxied):
    stranger, operator_address = "203.0.113.66", "198.51.100.5"
    statuses = [login(proxied, f"guess {i}", stranger).status_code for i in range(3)]
    assert statuses == [401, 401, 401]  # the free attempts (PREFIXDESK_ADMIN_LOGIN_ATTEMPTS=3) ...
    assert login(proxied, "guess 3", stranger).status_code == 401  # ... then each failure costs a wait
    waited = login(proxied, "guess 4", stranger)
    assert (waited.status_code, waited.headers["retry-after"]) == (429, "1")
    assert waited.json() == {"detail": "Too many failed logins from your address; try again in 1 s."}
    ok = login(proxied, OPERATOR[1], operator_address)  # the operator, meanwhile, from their own address
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
                      admin_session_ttl_s=60, console_clock=clock) as url:
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
                      headers={"X-Forwarded-For": f"192.0.2.{100 + i}"}, timeout=60).status_code
print("ready", flush=True)
sys.stdin.readline()
with concurrent.futures.ThreadPoolExecutor(32) as pool:
    print(json.dumps(list(pool.map(one, range(32)))))
"""


def test_thirty_two_logins_at_once_do_not_stall_the_server(proxied, engine_loop):
    loop_cpu = LoopCpu(engine_loop)
    stored = hash_password(OPERATOR[1])
    started = time.thread_time()
    assert verify_password(OPERATOR[1], stored)
    one_hash_s = time.thread_time() - started  # the CPU of one login's check
    logins = subprocess.Popen([sys.executable, "-c", LOGINS, proxied, OPERATOR[1]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert logins.stdout.readline() == "ready\n"  # its imports done: they are no part of the attack
    started_cpu, started = loop_cpu(), time.monotonic()
    out, _ = logins.communicate("go\n", timeout=120)
    on_loop_s, elapsed_s = loop_cpu() - started_cpu, time.monotonic() - started
    statuses = json.loads(out)
    # Hashed two at a time on threads: the logins queue (the excess are told to retry), the server answers.
    assert statuses.count(200) + statuses.count(429) == 32 and statuses.count(200) >= 16
    # Hashing on the event loop would spend one hash's CPU there for every login let in (scrypt on the loop took
    # /healthz from 3 ms to 1.2 s). Two hashes at once fill both cores of this machine, so the latency of
    # anything else then waits for a core; the CPU the loop itself spends does not, and is a small part of that.
    hashed_s = statuses.count(200) * one_hash_s
    assert on_loop_s < hashed_s / 2, f"the event loop spent {on_loop_s:.2f} s of CPU; the hashes took {hashed_s:.2f} s"
    print(f"\n32 concurrent logins in {elapsed_s:.1f} s: {statuses.count(200)} ok, {statuses.count(429)} told to "
          f"retry; the event loop spent {on_loop_s * 1000:.0f} ms of CPU, the hashes {hashed_s * 1000:.0f} ms")
