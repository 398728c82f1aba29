"""Which cookie owns a Gradio session hash (app/web/sessions.py), and which owners are forgotten first."""

import time

from app.web.sessions import SessionOwners

A, B = b"a" * 16, b"b" * 16


def test_the_first_cookie_to_name_a_hash_owns_it():
    owners = SessionOwners(capacity=10)
    assert owners.claim(("", "h1"), A) is True
    assert owners.claim(("", "h1"), B) is False
    assert owners.claim(("", "h1"), A) is True
    assert owners.claim(("/admin", "h1"), B) is True  # another app's session of the same name


def test_the_oldest_idle_owners_are_forgotten_and_one_in_use_never():
    owners = SessionOwners(capacity=2)
    for name in ("h1", "h2", "h3"):
        assert owners.claim(("", name), A)
    assert len(owners) == 2 and owners.claim(("", "h1"), B)  # h1 was forgotten: anyone may name it anew
    # h2 went for B's h1: now h3 (A's), then h1 (B's). While h3 streams, the next claim forgets h1, not h3.
    with owners.in_use(("", "h3")):
        assert owners.claim(("", "h4"), A)
        assert owners.claim(("", "h3"), B) is False
        assert owners.claim(("", "h1"), A) is True  # forgotten
    assert len(owners) == 2


def test_a_live_page_is_never_forgotten_and_a_silent_one_is_reported_once():
    owners, now = SessionOwners(capacity=2), time.monotonic()
    assert owners.claim(("", "h1"), A) and owners.claim(("", "h2"), A)
    owners.beat(("", "h1"), until=now + 50)  # h1's page said it is alive, until now + 50
    owners.beat(("", "h2"), until=now + 1000)  # h2's, later
    assert owners.expired(now + 40) == []
    assert owners.expired(now + 60) == [("", "h1")]  # h1 not heard of since: reported once
    assert owners.expired(now + 60) == []
    owners.end(("", "h1"))  # its page said it closed: its owner may be forgotten, h2's never while it is alive
    assert owners.claim(("", "h3"), B)  # forgets h1, not h2 (alive)
    assert owners.claim(("", "h1"), B) is True and owners.claim(("", "h2"), B) is False
    owners.beat(("", "h2"), until=now + 2000)  # heard of again: reported only past its new deadline
    assert owners.expired(now + 1500) == [] and owners.expired(now + 2500) == [("", "h2")]
