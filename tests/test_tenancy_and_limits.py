"""Tenants share no cached blocks with each other; a browser session is rate-limited."""

import uuid

import pytest

from app.desk import Desk, DeskInputError, Finished


def ask(client, message, tenant):
    return client.predict(message, [], "support-en", None, tenant, api_name="/chat")


def test_two_tenants_share_no_blocks_while_one_tenant_shares_its_own(client, services):
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    template = services.store.get_published("support-en")
    prefix_blocks = len(services.desk.prefix_ids(template)) // 32 * 32

    first_alice = ask(client, "Where is my parcel?", alice)
    first_bob = ask(client, "Where is my parcel?", bob)  # the identical prompt, another tenant
    second_alice = ask(client, "Can I change the size?", alice)

    assert first_alice["num_cached_tokens"] == 0
    assert first_bob["num_cached_tokens"] == 0  # Alice's blocks are invisible to Bob
    assert second_alice["num_cached_tokens"] == prefix_blocks  # ... but Alice reuses her own
    assert services.desk.tenant_salt(alice) != services.desk.tenant_salt(bob)
    assert services.desk.tenant_salt("") is None


def test_a_session_sending_too_fast_is_told_how_long_to_wait(services, aio):
    desk = Desk(store=services.store, engine=services.engine, prompts=services.prompts, rate_limit_per_minute=2)

    async def send(message):
        return [e async for e in desk.answer(session_key="fast-typist", template_name="support-en", history=[],
                                             message=message, max_tokens=2)]

    assert isinstance(aio(send("one"))[-1], Finished)
    assert isinstance(aio(send("two"))[-1], Finished)
    with pytest.raises(DeskInputError) as exc:
        aio(send("three"))
    assert str(exc.value) == "You are sending messages faster than 2 a minute; please wait 60 s and send again."
    assert isinstance(aio(desk_answer(desk, "someone-else"))[-1], Finished)  # other sessions are not held up


async def desk_answer(desk, session_key):
    return [e async for e in desk.answer(session_key=session_key, template_name="support-en", history=[],
                                         message="hello", max_tokens=2)]
