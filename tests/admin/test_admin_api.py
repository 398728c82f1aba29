"""The console's API through a real server: login, publish with warmup, hit rates, refusals, access control."""

import re
import uuid

import httpx
import pytest
from gradio_client import Client

from app.core.prompts import common_prefix_len
from tests.helpers.servers import full_blocks, operator

OPERATOR = ("op-api", "correct horse battery")
TEXT = "\n".join(f"Policy {i}: refunds for order type {i} take {i + 1} business days." for i in range(11))


@pytest.fixture(scope="module")
def admin_url(server_url, services):
    operator(services, *OPERATOR)
    return server_url + "admin/"


@pytest.fixture(scope="module")
def admin(admin_url):
    return Client(admin_url, auth=OPERATOR, verbose=False)


def rows_of(table_value) -> list[list]:
    return table_value["data"] if isinstance(table_value, dict) else table_value


def test_publish_warms_the_prefix_and_the_next_chat_hits_exactly_its_full_blocks(admin, server_url, services, db,
                                                                                  block_size):
    name = f"warm-{uuid.uuid4().hex[:8]}"
    admin.predict(name, "", "en", TEXT, api_name="/create")
    status, _, info = admin.predict(name, 1, api_name="/publish")

    prefix = len(services.prompts.prefix_ids(TEXT))
    # 319 = 9 full blocks + 31: the warmup's probe token fills block 10, which a chat must not hit
    assert (prefix, full_blocks(prefix, block_size)) == (319, 288)
    assert re.fullmatch(rf"已发布 '{name}'：— → v1。预热用时 \d+ ms：前缀 319 个 token 中有 288 个已缓存。", status)
    assert info == "父模板：— · 语言：en · 已发布：v1 · 版本：v1 (op-api)"  # the summary line is current

    chat = Client(server_url, verbose=False)
    final = chat.predict("How long does a refund take?", [], name, None, None, api_name="/chat")
    assert final["status"] == "ok"
    assert final["num_cached_tokens"] == 288  # the warmed full blocks, nothing more
    again = chat.predict("And for order type 3?", [], name, None, None, api_name="/chat")
    # The second question shares the first's prompt past the prefix (its turn's opening): the database and
    # the console count that; the customer is told of the template's blocks only (app/core/cache_figures.py).
    first_ids, again_ids = (services.prompts.build(TEXT, [], q).token_ids
                            for q in ("How long does a refund take?", "And for order type 3?"))
    assert again["num_cached_tokens"] == 288

    table, _, _ = admin.predict(api_name="/templates")
    row = next(r for r in rows_of(table) if r[0] == name)
    answers = list(db.query(
        "select m.num_cached_tokens, m.prompt_tokens from messages m join template_versions v "
        "on m.template_version_id = v.id join templates t on v.template_id = t.id "
        "where t.name = ? and m.role = 'assistant'", [name]))
    assert [a["num_cached_tokens"] for a in answers] == [288, full_blocks(common_prefix_len(first_ids, again_ids),
                                                                          block_size)]
    expected = sum(a["num_cached_tokens"] for a in answers) / sum(a["prompt_tokens"] for a in answers)
    assert row[3:11] == [1, 1, 319, 9, "", "", 2, f"{expected:.1%}"]  # versions, size, flags, answers, hit rate


def test_stale_save_and_parent_delete_are_refused_in_the_status_line(admin):
    name = f"stale-{uuid.uuid4().hex[:8]}"
    admin.predict(name, "", "en", TEXT, api_name="/create")
    admin.predict(name, TEXT + "\nPolicy 10: be kind.", 1, api_name="/save")
    status, *_ = admin.predict(name, TEXT + "\nPolicy 10: be quick.", 1, api_name="/save")
    assert status == (f"⛔ 冲突：您是在版本 1 的基础上修改 '{name}' 的，但之后已经保存了版本 2。没有覆盖任何内容；请重新载入版本 2，"
                      "再做一次修改后保存。")  # the zh console's words
    child = f"child-{uuid.uuid4().hex[:8]}"
    admin.predict(child, name, "en", "Category: boots.", api_name="/create")
    status, *_ = admin.predict(name, api_name="/delete")
    assert status == f"⛔ '{name}' 是 '{child}' 的父模板；请先删除或重新创建这些模板。"
    audit = rows_of(admin.predict(api_name="/audit"))
    assert [r[1:7] for r in audit[:3]] == [  # the zh console's words for the actions and fields
        ["op-api", "创建", child, "最新版本", "", "1"],
        ["op-api", "保存", name, "最新版本", "1", "2"],
        ["op-api", "创建", name, "最新版本", "", "1"],
    ]


def test_pin_and_internal_are_audited_with_what_they_change(admin, services):
    name = f"flags-{uuid.uuid4().hex[:8]}"
    admin.predict(name, "", "zh", "用于测试的规则。", api_name="/create")
    admin.predict(name, 1, api_name="/publish")
    assert admin.predict(name, True, api_name="/pin")[0] == f"'{name}' 已设为常驻：后台保持预热。"
    assert admin.predict(name, True, api_name="/internal")[0] == f"'{name}' 已设为内部模板：顾客不再看到它。"
    assert name not in [t.name for t in services.catalog.customer_facing()]
    audit = rows_of(admin.predict(api_name="/audit"))
    assert [r[2:7] for r in audit[:2]] == [["设为内部", name, "内部", "否", "是"],
                                           ["设为常驻", name, "常驻", "否", "是"]]


def test_every_console_route_refuses_a_client_without_a_session(admin, admin_url):
    endpoints = sorted(admin.view_api(print_info=False, return_format="dict")["named_endpoints"])
    console = {"/audit", "/create", "/delete", "/diff", "/export", "/import", "/open", "/pin", "/internal", "/pinned",
               "/preview", "/publish", "/save", "/templates", "/touch_pinned", "/warm", "/reset_prefix_cache",
               "/cold_vs_warm", "/bench_ab", "/reset_and_rewarm", "/versions", "/start_split", "/promote_candidate",
               "/end_split", "/conversations", "/transcript", "/take", "/reply", "/release", "/hide_transcripts",
               "/export_conversations", "/present"}
    assert set(endpoints) == console
    for endpoint in endpoints:
        r = httpx.post(f"{admin_url}gradio_api/call{endpoint}", json={"data": []})
        assert (r.status_code, r.json()) == (401, {"detail": "未登录：请打开 /admin/login。"}), endpoint
    for path in ("", "config", "gradio_api/info", "gradio_api/upload", "gradio_api/queue/join", "theme.css"):
        assert httpx.get(f"{admin_url}{path}").status_code in (303, 401), path
    with pytest.raises(Exception, match="Invalid credentials|Could not login"):
        Client(admin_url, auth=(OPERATOR[0], "wrong password!"), verbose=False)


def test_the_chat_app_exposes_no_console_endpoint(server_url):
    endpoints = Client(server_url, verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert sorted(endpoints) == ["/chat"]
