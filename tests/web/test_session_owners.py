"""Which cookie owns a Gradio session hash (app/web/sessions.py), and which owners are forgotten first."""

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
