"""The scriptable /chat endpoint against a real server: streaming, stored rows, stop, concurrency."""

import threading

import sqlite_utils
from gradio_client import Client

from app.core.desk import check_history
from app.core.prompts import Turn, common_prefix_len, system_text
from tests.helpers.servers import SecondServer, full_blocks, slow_answers
from tests.helpers.waiting import eventually, wait_until


def chat(client, message, template="电商客服", history=None, conversation_id=None):
    job = client.submit(message, history, template, conversation_id, None, api_name="/chat")
    updates = list(job)
    return updates, job.outputs()[-1]


def test_answer_streams_deltas_and_its_caption_matches_the_stored_row(client, db, held_answers):
    held_answers.release()
    chat(client, "你好")  # the template is warm after this, whatever other tests did to the cache
    held_answers.hold_again()  # the next answer held after its first text: a busy machine cannot send it whole
    held_before = held_answers.held
    job = client.submit("我想申请价格保护，需要什么材料？", None, "电商客服", None, None, api_name="/chat")
    wait_until(lambda: any(not u["done"] for u in job.outputs()), 120, "the answer's first text")
    assert (held_answers.held, job.done()) == (held_before + 1, False)  # a delta arrived before the end
    held_answers.release()
    updates = list(job)
    final = updates[-1]
    partial = [u for u in updates if not u["done"]]
    assert all(final["text"].startswith(p["text"]) for p in partial)  # each update is the answer so far
    assert len(partial[0]["text"]) < len(final["text"])
    assert final["status"] == "ok"

    row = db["messages"].get(final["message_id"])
    assert row["role"] == "assistant" and row["status"] == "ok" and row["text"] == final["text"]
    # The caption's title is the browser's measure of the first text on screen; a script has none.
    assert final["caption"] == "已回复"  # no browser measured when its first text showed
    assert (final["num_cached_tokens"], final["prompt_tokens"]) == (row["num_cached_tokens"], row["prompt_tokens"])
    assert final["num_cached_tokens"] == 1024  # the template's 1,042-token prefix in whole 32-token blocks
    user = db["messages"].get(final["message_id"] - 1)
    assert user["role"] == "user" and user["text"] == "我想申请价格保护，需要什么材料？"
    assert user["conversation_id"] == row["conversation_id"] == final["conversation_id"]


def test_second_turn_continues_the_conversation_with_its_history(client, db, services, block_size):
    _, first = chat(client, "发票多久能开出来？")
    history = [{"role": "user", "content": "发票多久能开出来？"}, {"role": "assistant", "content": first["text"]}]
    _, second = chat(client, "可以换开抬头吗？", history=history, conversation_id=first["conversation_id"])
    assert second["conversation_id"] == first["conversation_id"]
    system = system_text(services.catalog.get("电商客服").chain)
    first_ids = services.prompts.build(system, [], "发票多久能开出来？").token_ids
    turns = check_history([Turn(m["role"], m["content"]) for m in history])  # as the desk cleans them
    second_ids = services.prompts.build(system, turns, "可以换开抬头吗？").token_ids
    assert second["prompt_tokens"] == len(second_ids)
    # The second prompt repeats the first up to the answer, so it reuses at least those full blocks; the
    # customer is told only of the template's (app/core/cache_figures.py), the database keeps the truth.
    stored = db["messages"].get(second["message_id"])["num_cached_tokens"]
    assert stored >= full_blocks(common_prefix_len(first_ids, second_ids), block_size) > 1024
    assert second["num_cached_tokens"] == 1024
    rows = list(db["messages"].rows_where("conversation_id = ?", [first["conversation_id"]], order_by="id"))
    assert [(r["role"], r["status"]) for r in rows] == [("user", "ok"), ("assistant", "ok")] * 2


def test_stop_mid_stream_aborts_the_request_and_stores_the_partial_answer(services, engine_loop, engine, tmp_path,
                                                                          held_answers):
    with SecondServer(services, engine_loop, tmp_path, **slow_answers()) as url:
        job = Client(url, verbose=False).submit("请详细介绍一下会员积分规则", [], "电商客服", None, None, api_name="/chat")
        wait_until(job.outputs, 60, "the answer's first text")
        partial = job.outputs()[-1]
        assert partial["done"] is False
        job.cancel()  # mid-answer: held at its first text (held_answers)
        db = sqlite_utils.Database(tmp_path / "prefixdesk.db")

        def stopped() -> list[dict]:
            rows = list(db["messages"].rows_where("conversation_id = ? and role = 'assistant'",
                                                  [partial["conversation_id"]]))
            return rows if rows[0]["status"] != "generating" and engine.num_unfinished_requests() == 0 else []

        rows = wait_until(stopped, 30, "the answer to be stored as stopped and vLLM to drop it")
    assert engine.num_unfinished_requests() == 0  # vLLM dropped the request
    assert engine.in_flight == 0
    assert rows[0]["status"] == "stopped"
    assert rows[0]["error"] == "stopped before the answer was complete"
    assert rows[0]["text"].startswith(partial["text"])  # what the client saw, and maybe a little more
    assert rows[0]["output_tokens"] is None  # no stats: it never finished
    assert eventually(lambda: engine.snapshot().running, 0) == 0


def test_eight_concurrent_chats_are_batched_by_the_engine(server_url, engine, db):
    engine.reset_max_running_seen()
    finals = [None] * 8
    clients = [Client(server_url, verbose=False) for _ in range(8)]  # connected before any chat begins
    together = threading.Barrier(8)

    def one(i):
        together.wait(60)
        finals[i] = chat(clients[i], f"第{i}位顾客：订单什么时候发货？")[1]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [f["status"] for f in finals] == ["ok"] * 8
    stored = [db["messages"].get(f["message_id"]) for f in finals]
    assert [s["status"] for s in stored] == ["ok"] * 8
    assert engine.snapshot().max_running_seen > 1  # vLLM ran several at once: Gradio did not queue them


def test_more_chats_than_gradios_forty_threads_stream_at_once(services, engine_loop, engine, tmp_path):
    """Gradio runs at most ``max_threads`` events at once (40 by default in a mounted app), whatever the
    concurrency limits say; the chat raises it to what the engine takes, so 48 customers stream together."""
    engine.reset_max_running_seen()
    # Every answer streams for 15 s or more: all 48 are still running when the last one starts.
    with SecondServer(services, engine_loop, tmp_path, **slow_answers()) as url:
        clients = [Client(url, verbose=False) for _ in range(4)]  # gradio_client runs 40 jobs at most per client
        jobs = [c.submit(f"第{i}位顾客：请详细介绍会员等级", [], "电商客服", None, None, api_name="/chat")
                for i, c in enumerate(clients * 12)]
        try:
            # 40 when Gradio's threads were the limit
            assert eventually(lambda: engine.snapshot().max_running_seen, 48, timeout_s=90) == 48
        finally:
            for job in jobs:
                job.cancel()
            eventually(lambda: engine.in_flight or engine.snapshot().running, 0, timeout_s=60)
            for c in clients:
                c.close()
    assert (engine.in_flight, engine.snapshot().running) == (0, 0)
