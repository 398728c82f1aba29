"""The OpenAI-compatible endpoint, driven by the openai SDK against the real server and engine."""

import uuid

import openai
import pytest

from app.core.prompts import Turn, common_prefix_len, system_text

TEMPLATE = "电商客服"


@pytest.fixture(scope="module")
def client(server_url):
    with openai.OpenAI(base_url=server_url + "v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def system(services):
    return system_text(services.catalog.get(TEMPLATE).chain)


def stream_answer(client, messages, *, salt, max_tokens=5):
    stream = client.chat.completions.create(
        model=TEMPLATE, messages=messages, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, "cache_salt": salt})
    return list(stream)


def test_models_are_the_published_templates(client, services):
    ids = [m.id for m in client.models.list()]
    assert ids == [t.name for t in services.catalog.customer_facing()]


def test_streamed_answer_uses_the_template_prompt_and_reports_cached_tokens(client, services, engine, system):
    salt = uuid.uuid4().hex  # a private cache namespace: nothing else in the session shares it
    first_q, second_q = "我刚买的耳机左耳没声音怎么办？", "价格保护的差价怎么退给我？"
    first = stream_answer(client, [{"role": "user", "content": first_q}], salt=salt)
    second = stream_answer(client, [{"role": "user", "content": second_q}], salt=salt)

    assert first[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in first if c.choices][-1] == "length"
    first_ids = services.prompts.build(system, [], first_q).token_ids
    second_ids = services.prompts.build(system, [], second_q).token_ids
    usage = first[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(first_ids), 5)
    assert usage.prompt_tokens_details.cached_tokens == 0
    block = engine.info.block_size
    expected = common_prefix_len(first_ids, second_ids) // block * block
    assert second[-1].usage.prompt_tokens_details.cached_tokens == expected


def test_history_is_rendered_as_in_the_chat(client, services, system):
    history = [Turn("user", "你好"), Turn("assistant", "您好，请问有什么可以帮您？")]
    messages = [{"role": t.role, "content": t.text} for t in history] + [{"role": "user", "content": "怎么开发票？"}]
    chunks = stream_answer(client, messages, salt=uuid.uuid4().hex, max_tokens=2)
    expected = services.prompts.build(system, history, "怎么开发票？").token_ids
    assert chunks[-1].usage.prompt_tokens == len(expected)


def test_whole_answer_without_streaming(client):
    reply = client.chat.completions.create(model=TEMPLATE, messages=[{"role": "user", "content": "运费多少？"}],
                                           max_tokens=3, extra_body={"ignore_eos": True})
    assert reply.object == "chat.completion"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


def test_a_system_message_is_refused_because_the_template_supplies_it(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=TEMPLATE, messages=[{"role": "system", "content": "x"},
                                                                 {"role": "user", "content": "hi"}])
    assert err.value.code == "system_message_not_allowed"
    assert err.value.param == "messages[0]"


def test_an_unknown_template_is_a_404_naming_the_choices(client, services):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-template", messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "model_not_found"
    names = ", ".join(t.name for t in services.catalog.customer_facing())
    assert err.value.body["message"] == f"There is no published template named 'no-such-template'. Choose one of: {names}."


def test_the_last_message_must_be_the_users(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=TEMPLATE, messages=[{"role": "user", "content": "hi"},
                                                                 {"role": "assistant", "content": "hello"}])
    assert err.value.code == "invalid_messages"
