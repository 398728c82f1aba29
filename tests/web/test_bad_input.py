"""Bad input gets a message that says what to do, the app stays up, and nothing is lost."""

import pytest
import sqlite_utils
from gradio_client import Client

from app.core.prompts import PromptTooLong, Turn, system_text
from tests.helpers.servers import SecondServer, slow_answers
from tests.helpers.waiting import wait_until


def send(client, message, template="电商客服", history=None):
    return client.predict(message, history or [], template, None, None, api_name="/chat")


def count(db, table):
    return db[table].count


@pytest.mark.parametrize("message", ["", "   ", "\n\t \n"])
def test_empty_message_is_refused_and_nothing_is_stored(client, db, message):
    before = count(db, "messages")
    out = send(client, message)
    assert out == {"text": "", "done": True, "status": "rejected", "error": "Please type a question before sending."}
    assert count(db, "messages") == before


def test_unknown_template_names_the_ones_that_exist(client, db, services):
    before = count(db, "messages")
    out = send(client, "你好", template="不存在的模板")
    assert out["status"] == "rejected"
    names = [t.name for t in services.catalog.customer_facing()]  # other tests may publish more
    assert names[:4] == ["电商客服", "support-en", "电子产品", "服装鞋包"]  # 商城通用规则 is internal
    assert out["error"] == f"There is no published template named '不存在的模板'. Choose one of: {', '.join(names)}."
    assert count(db, "messages") == before


def test_message_longer_than_the_context_is_stored_with_the_numbers(client, db, services):
    message = "退" * 3000  # one token per character with the demo tokenizer
    out = send(client, message)
    assert out["status"] == "error"
    system = system_text(services.catalog.get("电商客服").chain)
    with pytest.raises(PromptTooLong) as exc:
        services.prompts.build(system, [], message)
    needed, limit = exc.value.num_tokens, exc.value.limit
    assert limit == services.settings.max_model_len - 16
    one_char = len(services.prompts.build(system, [], "退").token_ids)
    assert needed == one_char + 2999
    assert out["error"] == (
        f"This message is too long: with the system prompt it needs {needed:,} tokens, "
        f"{needed - limit:,} more than the {limit:,} this model allows. Please shorten it."
    )
    user = db["messages"].get(out["message_id"] - 1)
    assert user["role"] == "user" and user["text"] == message  # the user's words are kept
    assert db["messages"].get(out["message_id"])["status"] == "error"


def test_long_history_drops_the_oldest_turns_but_never_the_system_prompt(client, services):
    turn = "我的订单号是123456，请帮我查询物流。" * 20
    history = []
    for i in range(12):
        history += [{"role": "user", "content": f"{i}:{turn}"}, {"role": "assistant", "content": turn}]
    out = send(client, "现在到哪里了？", history=history)
    assert out["status"] == "ok"
    # Each exchange is ~740 tokens: with the 1,042-token system prompt only the newest one fits in 2,048.
    system = system_text(services.catalog.get("电商客服").chain)
    turns = [Turn(m["role"], m["content"]) for m in history]
    assert services.prompts.build(system, turns[-2:], "现在到哪里了？").dropped_turns == 0
    assert services.prompts.build(system, turns[-4:], "现在到哪里了？").dropped_turns == 1
    assert out["dropped_turns"] == 11
    assert out["prompt_tokens"] == 1997  # within 2,048 - 48 for the answer
    # The system prompt is never dropped: the kept prompt still starts with it.
    kept = services.prompts.build(system, turns, "现在到哪里了？")
    assert kept.token_ids[: kept.prefix_tokens] == list(services.desk.prefix_ids(services.catalog.get("电商客服")))
    assert out["prompt_tokens"] == len(kept.token_ids)


def test_more_answers_than_the_cap_get_a_busy_message(services, engine_loop, engine, tmp_path, held_answers):
    with SecondServer(services, engine_loop, tmp_path, **slow_answers()) as url:
        engine.max_concurrent_requests = 1
        try:
            slow = Client(url, verbose=False).submit("请介绍一下退货流程", [], "电商客服", None, None, api_name="/chat")
            wait_until(slow.outputs, 60, "the first answer's first text")
            out = send(Client(url, verbose=False), "还有人吗？")  # while the first is held at its first text
            slow.cancel()
            wait_until(lambda: engine.in_flight == 0, 30, "the first answer to stop")
        finally:
            engine.max_concurrent_requests = engine.info.max_concurrent_requests
    assert out["status"] == "error"
    assert out["error"].startswith("The help desk is busy right now: the help desk is busy (1 answers in progress)")
    stored = sqlite_utils.Database(tmp_path / "prefixdesk.db")["messages"]
    assert stored.get(out["message_id"] - 1)["text"] == "还有人吗？"  # stored all the same


def test_control_characters_are_removed_before_storing(client, db):
    out = send(client, "退货\x00\x07流程\u200b？")
    assert out["status"] == "ok"
    assert db["messages"].get(out["message_id"] - 1)["text"] == "退货流程？"


def test_a_ten_thousand_character_template_name_is_refused_everywhere(client, db, services):
    from app.db import templates as db_templates

    name = "模" * 10_000
    before = count(db, "templates")
    with pytest.raises(db_templates.TemplateAdminError) as exc:
        services.db.run(db_templates.create, name=name, text="x", user="op", check_fits=lambda *_: None)
    assert str(exc.value) == ("A template name may have at most 100 characters; this one has 10,000. "
                              "Choose a shorter name.")
    assert count(db, "templates") == before
    out = send(client, "你好", template=name)  # the chat answers with the list, nothing stored
    assert out["status"] == "rejected" and out["error"].startswith(f"There is no published template named '{name}'")
