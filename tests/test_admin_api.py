"""The console's API through a real server: login, publish with warmup, hit rates, and access control."""

import uuid

import httpx
import pytest
from gradio_client import Client

from admin import auth

OPERATOR = ("op-api", "correct horse battery")
TEXT = "\n".join(f"Policy {i}: refunds for order type {i} take {i + 1} business days." for i in range(11))


@pytest.fixture(scope="module")
def admin_url(server_url, services):
    auth.set_password(store=services.store, name=OPERATOR[0], password=OPERATOR[1])
    return server_url + "admin/"


@pytest.fixture(scope="module")
def admin(admin_url):
    return Client(admin_url, auth=OPERATOR, verbose=False)


def rows_of(table_value) -> list[list]:
    return table_value["data"] if isinstance(table_value, dict) else table_value


def test_publish_warms_the_prefix_and_the_next_chat_hits_exactly_its_full_blocks(admin, server_url, services, db):
    name = f"warm-{uuid.uuid4().hex[:8]}"
    admin.predict(name, "", "en", TEXT, api_name="/create")
    status, result, _ = admin.predict(name, 1, api_name="/publish")

    prefix = len(services.prompts.prefix_ids(TEXT))
    full_blocks = prefix // 32 * 32
    # 319 = 9 full blocks + 31: the warmup's probe token fills block 10, which a chat must not hit
    assert (prefix, full_blocks) == (319, 288)
    assert result["num_prefix_tokens"] == 319
    assert result["was_cached_tokens"] == 0  # a new text: nothing of it was cached
    assert result["num_cached_tokens"] == 288
    assert result["action"] == "publish"
    assert f"{result['elapsed_ms']:.0f} ms: 288 of 319 prefix tokens are cached" in status

    chat = Client(server_url, verbose=False)
    final = chat.predict("How long does a refund take?", [], name, None, api_name="/chat")
    assert final["status"] == "ok"
    assert final["num_cached_tokens"] == 288  # the warmed full blocks, nothing more
    again = chat.predict("And for order type 3?", [], name, None, api_name="/chat")

    table, _, _ = admin.predict(api_name="/templates")
    row = next(r for r in rows_of(table) if r[0] == name)
    answers = list(db.query(
        "select m.num_cached_tokens, m.prompt_tokens from messages m join template_versions v "
        "on m.template_version_id = v.id join templates t on v.template_id = t.id "
        "where t.name = ? and m.role = 'assistant'", [name]))
    assert [a["num_cached_tokens"] for a in answers] == [288, again["num_cached_tokens"]]
    expected = sum(a["num_cached_tokens"] for a in answers) / sum(a["prompt_tokens"] for a in answers)
    assert row[5:10] == [319, 9, "", 2, round(expected, 4)]  # tokens, full blocks, pinned, answers, hit rate
    assert row[3] == 1  # published version


def test_stale_save_and_parent_delete_are_refused_through_the_api(admin, services):
    name = f"stale-{uuid.uuid4().hex[:8]}"
    admin.predict(name, "", "en", TEXT, api_name="/create")
    admin.predict(name, TEXT + "\nPolicy 10: be kind.", 1, api_name="/save")
    with pytest.raises(Exception, match="Conflict: you edited .* from version 1, but version 2 was saved since"):
        admin.predict(name, TEXT + "\nPolicy 10: be quick.", 1, api_name="/save")
    child = f"child-{uuid.uuid4().hex[:8]}"
    admin.predict(child, name, "en", "Category: boots.", api_name="/create")
    with pytest.raises(Exception, match="is the parent of"):
        admin.predict(name, api_name="/delete")
    audit = rows_of(admin.predict(api_name="/audit"))
    assert [r[1:6] for r in audit[:3]] == [
        ["op-api", "create", child, "", "1"],
        ["op-api", "save", name, "1", "2"],
        ["op-api", "create", name, "", "1"],
    ]


def test_every_admin_endpoint_refuses_unauthenticated_and_wrong_password_clients(admin, admin_url):
    endpoints = sorted(admin.view_api(print_info=False, return_format="dict")["named_endpoints"])
    console = {"/audit", "/create", "/delete", "/diff", "/export", "/import", "/open", "/pin", "/pinned", "/preview",
               "/publish", "/save", "/templates", "/touch_pinned", "/warm"}
    assert console <= set(endpoints)  # and the Cache tab's own endpoints, all checked below
    for endpoint in endpoints:
        r = httpx.post(f"{admin_url}gradio_api/call{endpoint}", json={"data": []})
        assert r.status_code == 401, endpoint
    assert httpx.get(f"{admin_url}config").status_code == 401
    with pytest.raises(Exception, match="Invalid credentials|Could not login"):
        Client(admin_url, auth=(OPERATOR[0], "wrong password!"), verbose=False)


def test_handlers_check_the_operator_themselves_so_a_disabled_account_is_refused_at_once(admin_url, services):
    auth.set_password(store=services.store, name="op-temp", password="another long secret")
    client = Client(admin_url, auth=("op-temp", "another long secret"), verbose=False)
    assert rows_of(client.predict(api_name="/templates")[0])  # logged in: it works
    auth.disable_operator(store=services.store, name="op-temp")
    with pytest.raises(Exception, match="Operator 'op-temp' is disabled or unknown"):
        client.predict(api_name="/templates")  # same session cookie, refused by the handler


def test_the_chat_app_exposes_no_admin_endpoint(server_url):
    endpoints = Client(server_url, verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert sorted(endpoints) == ["/chat"]
