"""Attack: learn another customer's message by guessing it and reading how much of the prompt was cached.

Before: without tenants every customer shares one cache namespace, and the chat's caption, /chat and
/v1's usage reported the exact cached-token count: a right guess of another customer's recent
message came back with 480 tokens cached, a wrong guess with 384 (the template's prefix).
After: the figures customers and /v1 callers see are capped at the template's prefix in whole KV
blocks (what every customer of it shares), unless the request ran in a cache namespace of its own;
the database keeps the true count for the console.
"""

import uuid

import httpx
from gradio_client import Client

from app.core.prompts import common_prefix_len, system_text
from tests.helpers.attack import config, dependency, output, run
from tests.helpers.servers import full_blocks

TEMPLATE = "电商客服"  # a template of the page's language (zh), so the page offers it too
# Long enough that a right guess shares several KV blocks past the template's prefix.
MESSAGE = ("Order {tag}: my parcel was due last Tuesday but the tracking page still says it is waiting in the "
           "warehouse in Rotterdam, and nobody answers the phone there. Could you check it? Thanks, {name}.")


def hit_tokens(services, block_size: int, message: str, earlier: list[str]) -> int:
    """The cached tokens of ``message``'s prompt after the prompts of ``earlier``: its longest common prefix
    with one of them, in whole blocks."""
    system = system_text(services.catalog.get(TEMPLATE).chain)
    ids = services.prompts.build(system, [], message).token_ids
    return max(full_blocks(common_prefix_len(ids, services.prompts.build(system, [], m).token_ids), block_size)
               for m in earlier)


def test_a_right_guess_of_another_customers_message_reads_like_a_wrong_one(server_url, services, block_size, db):
    tag = uuid.uuid4().hex[:8]
    victim = MESSAGE.format(tag=tag, name="Ann")
    right, wrong = MESSAGE.format(tag=tag, name="Bob"), MESSAGE.format(tag=uuid.uuid4().hex[:8], name="Bob")
    shared = full_blocks(len(services.catalog.prefix_ids(TEMPLATE)), block_size)
    assert shared == 1024  # its 1,042-token prefix in whole 32-token blocks

    assert Client(server_url, verbose=False).predict(victim, None, TEMPLATE, None, None, api_name="/chat")["status"] == "ok"
    attacker = Client(server_url, verbose=False)
    guessed = attacker.predict(right, None, TEMPLATE, None, None, api_name="/chat")
    missed = attacker.predict(wrong, None, TEMPLATE, None, None, api_name="/chat")
    assert (guessed["num_cached_tokens"], missed["num_cached_tokens"]) == (shared, shared)

    # The guess did reuse the victim's blocks, and the database keeps that for the console.
    hit = hit_tokens(services, block_size, right, [victim])
    assert hit > shared
    assert db["messages"].get(guessed["message_id"])["num_cached_tokens"] == hit
    assert db["messages"].get(missed["message_id"])["num_cached_tokens"] == shared

    # /v1 says the same of another right guess and of a wrong one.
    v1_guesses = [MESSAGE.format(tag=tag, name="Cy"), MESSAGE.format(tag=uuid.uuid4().hex[:8], name="Cy")]
    for guess in v1_guesses:
        r = httpx.post(server_url + "v1/chat/completions", timeout=60, json={
            "model": TEMPLATE, "messages": [{"role": "user", "content": guess}], "max_tokens": 2})
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == shared

    # And so does the caption under the answer in the page.
    cfg = config(server_url)
    page_guess = MESSAGE.format(tag=tag, name="Dee")
    with httpx.Client(timeout=120) as page:
        session = uuid.uuid4().hex
        key = output(run(page, server_url, dependency(cfg, "on_load"), ["", None], session))[0]
        shown = output(run(page, server_url, dependency(cfg, "send"), [page_guess, TEMPLATE, None, key, None], session))[0]
    caption = shown[-1]["content"][0]["text"]
    assert " · 已读资料复用 100%" in caption, caption  # the shared prefix, all of it: no more
    stored = db.execute("select num_cached_tokens from messages where role = 'assistant' and conversation_id = "
                        "(select conversation_id from messages where text = ?)", [page_guess]).fetchall()
    assert stored == [(hit_tokens(services, block_size, page_guess, [victim, right, wrong, *v1_guesses]),)]


def test_in_a_namespace_of_its_own_a_caller_sees_the_true_figures(server_url, services, block_size):
    salt = uuid.uuid4().hex  # /v1's own cache_salt: no one else's blocks can be in it
    question = MESSAGE.format(tag=salt[:8], name="Eve")
    body = {"model": TEMPLATE, "messages": [{"role": "user", "content": question}], "max_tokens": 2,
            "cache_salt": salt}
    first = httpx.post(server_url + "v1/chat/completions", json=body, timeout=60).json()["usage"]
    second = httpx.post(server_url + "v1/chat/completions", json=body, timeout=60).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    # The whole prompt but its last token is cached (vLLM computes that one again), in whole blocks.
    assert second["prompt_tokens_details"]["cached_tokens"] == full_blocks(second["prompt_tokens"] - 1, block_size)
    assert second["prompt_tokens_details"]["cached_tokens"] > full_blocks(
        len(services.catalog.prefix_ids(TEMPLATE)), block_size)
