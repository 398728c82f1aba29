"""Tenants share no cached blocks with each other; a client address is rate- and concurrency-limited."""

import uuid

import pytest

from app.core.desk import Desk, DeskInputError, Finished
from app.core.limits import ClientLimiter
from tests.helpers.desks import desk_for
from tests.helpers.servers import full_blocks


async def answers(desk: Desk, message: str, *, client: str = "198.51.100.7", tenant: str = "",
                  template: str = "support-en") -> list:
    return [e async for e in desk.answer(session_key=f"s-{uuid.uuid4().hex}", client=client, template_name=template,
                                         message=message, tenant=tenant, max_tokens=2)]


def test_two_tenants_share_no_blocks_while_one_tenant_shares_its_own(services, aio, block_size):
    desk = desk_for(services, limiter=ClientLimiter(per_minute=0, concurrent=0))
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    prefix_blocks = full_blocks(len(services.catalog.prefix_ids("support-en")), block_size)

    first_alice = aio(answers(desk, "Where is my parcel?", tenant=alice))[-1].message
    first_bob = aio(answers(desk, "Where is my parcel?", tenant=bob))[-1].message  # the identical prompt
    second_alice = aio(answers(desk, "Can I change the size?", tenant=alice))[-1].message

    assert first_alice.num_cached_tokens == 0
    assert first_bob.num_cached_tokens == 0  # Alice's blocks are invisible to Bob
    assert second_alice.num_cached_tokens == prefix_blocks == 384  # ... but Alice reuses her own
    assert desk.tenant_salt(alice) != desk.tenant_salt(bob)
    assert desk.tenant_salt("") is None


def test_a_client_sending_too_fast_is_told_how_long_to_wait(services, aio):
    now = [1000.0]  # the limiter's clock: the answers take what time they take on this machine
    desk = desk_for(services, limiter=ClientLimiter(per_minute=2, concurrent=0, clock=lambda: now[0]))
    assert isinstance(aio(answers(desk, "one"))[-1], Finished)
    now[0] += 0.5
    assert isinstance(aio(answers(desk, "two"))[-1], Finished)  # each call is a fresh session: no help
    with pytest.raises(DeskInputError) as exc:
        aio(answers(desk, "three"))
    assert str(exc.value) == "You are sending messages faster than 2 a minute; please wait 60 s and send again."
    assert isinstance(aio(answers(desk, "hello", client="198.51.100.8"))[-1], Finished)  # others are not held up


def test_idle_clients_are_pruned_from_the_limiter():
    now = [1000.0]
    limiter = ClientLimiter(per_minute=1000, concurrent=2, clock=lambda: now[0])
    for i in range(300):
        limiter.check_rate(f"10.0.{i // 256}.{i % 256}")
    assert limiter.num_keys() == 300
    now[0] += 61
    for i in range(256):  # the sweep runs every 256 calls
        limiter.check_rate("10.9.9.9")
    assert limiter.num_keys() == 1
    with limiter.stream("10.9.9.9"), limiter.stream("10.9.9.9"):
        with pytest.raises(Exception) as exc:
            limiter.stream("10.9.9.9")
        assert str(exc.value) == ("You already have 2 answers in progress; the limit is 2. Wait for one to finish, "
                                  "then send again.")
    assert limiter.num_keys() == 1
