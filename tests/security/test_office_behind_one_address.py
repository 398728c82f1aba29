"""Attack (on ourselves): an office of customers behind one NAT address is locked out by limits meant for one.

Before: every per-client limit was keyed on the TCP address alone, so 30 customers behind one address
shared one customer's 30 messages a minute and 8 answers at once: 16 of 60 questions were answered, the
rest refused ("still on its way" ×14, "a little fast" ×6).
After: a browser that holds a key this server issued has the per-client limits to itself; the address
as a whole is held only to a coarse outer bound (PREFIXDESK_RATE_LIMIT_PER_ADDRESS_PER_MINUTE,
PREFIXDESK_MAX_STREAMS_PER_ADDRESS), which one host minting keys still cannot pass. Callers without a
browser key (/v1, /chat) keep the per-client limits per address.

The limits are the settings' defaults; the limiter's clock stands still, so the minute never ends
whatever time the answers take on this machine.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from app.core.desk import Desk, DeskInputError, Finished
from app.core.limits import ClientLimiter, RateLimited
from app.core.session_keys import SessionKeys
from app.settings import Settings
from tests.helpers.desks import desk_for

OFFICE = "203.0.113.10"  # the office's one NAT address
DEFAULTS = Settings()
PER_BROWSER, STREAMS = DEFAULTS.rate_limit_per_minute, DEFAULTS.max_streams_per_client
PER_ADDRESS, ADDRESS_STREAMS = DEFAULTS.rate_limit_per_address_per_minute, DEFAULTS.max_streams_per_address
QUESTIONS = ("Where is my parcel?", "Can I change the size?")


def default_limiter() -> ClientLimiter:
    return ClientLimiter(per_minute=PER_BROWSER, concurrent=STREAMS, per_address_per_minute=PER_ADDRESS,
                         per_address_concurrent=ADDRESS_STREAMS, clock=lambda: 1000.0)


async def customer(desk: Desk, key: str) -> list[str]:
    """One browser asks its two questions, the second in the conversation of the first; the outcome of each."""
    outcomes, conversation_id = [], None
    for question in QUESTIONS:
        try:
            events = [e async for e in desk.answer(session_key=key, client=OFFICE, template_name="support-en",
                                                   message=question, conversation_id=conversation_id,
                                                   max_tokens=2)]
        except DeskInputError as exc:
            outcomes.append(exc.code)
            continue
        finished = events[-1]
        assert isinstance(finished, Finished)
        conversation_id = finished.message.conversation_id
        outcomes.append(finished.message.status)
    return outcomes


async def office(desk: Desk, keys: list[str]) -> list[list[str]]:
    return list(await asyncio.gather(*(customer(desk, key) for key in keys)))


def test_thirty_customers_behind_one_address_each_get_their_answers(services, aio):
    assert (PER_BROWSER, STREAMS, PER_ADDRESS, ADDRESS_STREAMS) == (30, 8, 300, 64)
    keys = SessionKeys("office-test")
    browsers = [keys.mint_browser() for _ in range(30)]
    desk = desk_for(services, limiter=default_limiter())

    outcomes = aio(office(desk, browsers), timeout=900)
    assert Counter(outcome for pair in outcomes for outcome in pair) == {"ok": 60}
    assert outcomes == [["ok", "ok"]] * 30  # all 60 answered, each browser's two
    assert desk.limiter.num_keys() == 31  # each browser's minute and the address's; no answer still held

    # One browser past its own limit is refused; its neighbours behind the same address are not.
    loud = browsers[0]
    for _ in range(PER_BROWSER - len(QUESTIONS)):
        desk.admit(client=OFFICE, message="again", browser=loud)
    with pytest.raises(DeskInputError) as exc:
        desk.admit(client=OFFICE, message="one too many", browser=loud)
    assert exc.value.code == "rate"
    assert str(exc.value) == "You are sending messages faster than 30 a minute; please wait 61 s and send again."
    assert desk.admit(client=OFFICE, message="still fine", browser=browsers[1]).text == "still fine"


def test_one_host_minting_browser_keys_stops_at_the_address_bound():
    keys = SessionKeys("office-test")
    limiter = default_limiter()
    admitted = 0
    with pytest.raises(RateLimited) as exc:
        while True:  # fresh keys, each within its own limit
            key = keys.mint_browser()
            for _ in range(PER_BROWSER):
                limiter.check_rate(OFFICE, browser=key)
                admitted += 1
    assert admitted == PER_ADDRESS == 300
    assert exc.value.code == "address_rate"
    assert str(exc.value) == ("Your network's address is sending messages faster than 300 a minute, all its browsers "
                              "together; please wait 61 s and send again.")
    limiter.check_rate("198.51.100.20", browser=keys.mint_browser())  # another address is not held up

    # Answers at once: each browser 8 of its own, the address 64 in all.
    slots = [limiter.stream(OFFICE, browser=key) for key in [keys.mint_browser() for _ in range(8)]
             for _ in range(STREAMS)]
    assert len(slots) == ADDRESS_STREAMS == 64
    with pytest.raises(RateLimited) as exc:
        limiter.stream(OFFICE, browser=keys.mint_browser())
    assert (exc.value.code, str(exc.value)) == ("address_streams", (
        "Your network's address already has 64 answers in progress, all its browsers together; the limit is 64. "
        "Wait for one to finish, then send again."))
    slots.pop().release()
    slots.append(limiter.stream(OFFICE, browser=keys.mint_browser()))  # a slot given back is free again
    for slot in slots:
        slot.release()
    assert limiter.num_keys() == 13  # the minutes of 10 browsers and the office, of the other address and its browser


def test_a_caller_without_a_browser_key_is_limited_by_its_address():
    limiter = default_limiter()
    for _ in range(PER_BROWSER):
        limiter.check_rate(OFFICE)
    with pytest.raises(RateLimited) as exc:
        limiter.check_rate(OFFICE)
    assert exc.value.code == "rate"
    slots = [limiter.stream(OFFICE) for _ in range(STREAMS)]
    with pytest.raises(RateLimited) as exc:
        limiter.stream(OFFICE)
    assert (exc.value.code, str(exc.value)) == (
        "streams", "You already have 8 answers in progress; the limit is 8. Wait for one to finish, then send again.")
    for slot in slots:
        slot.release()
