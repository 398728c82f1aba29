"""Attack: read another tenant's cache timing by naming its tenant, or by computing its cache salt.

Before: the tenant salt's HMAC key was the secret every page sends to browsers (BrowserState), so
anyone could compute another tenant's cache_salt; and any client could send the tenant header or
/chat's tenant argument itself: 512 of 519 tokens came back cached on another tenant's private prompt.
After: the salt's key is a server-side file no response carries; a tenant is believed only from a
trusted proxy (PREFIXDESK_TRUSTED_PROXIES); from anyone else the header or argument is refused.
"""

import uuid

import httpx
from gradio_client import Client

from tests.helpers.servers import SecondServer

BODY = {"model": "support-en", "messages": [{"role": "user", "content": "Where is my parcel?"}], "max_tokens": 2}
REFUSED = ("The tenant header 'x-tenant' is accepted only from the reverse proxy (PREFIXDESK_TRUSTED_PROXIES); "
           "send the request through it.")


def cached(url: str, tenant: str | None, question: str = "Where is my parcel?") -> int:
    headers = {"X-Tenant": tenant} if tenant else {}
    body = {**BODY, "messages": [{"role": "user", "content": question}]}
    r = httpx.post(url + "v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_behind_the_trusted_proxy_each_tenant_reuses_only_its_own_blocks(proxied):
    victim, attacker = f"victim-{uuid.uuid4().hex[:6]}", f"attacker-{uuid.uuid4().hex[:6]}"
    assert cached(proxied, victim) == 0
    assert cached(proxied, victim, "Can I change the size?") == 384  # the victim reuses its own prefix
    assert cached(proxied, attacker) == 0  # the identical prompt, another tenant: nothing to time


def test_a_client_that_is_not_the_proxy_cannot_name_a_tenant(server_url, settings):
    # The session server trusts no proxy and names no tenant header: X-Tenant is just ignored there ...
    assert httpx.post(server_url + "v1/chat/completions", json=BODY, headers={"X-Tenant": "victim"},
                      timeout=60).status_code == 200
    # ... and /chat's tenant argument is refused outright.
    out = Client(server_url, verbose=False).predict("hi", None, "support-en", None, "victim", api_name="/chat")
    assert out["error"] == "租户只能由反向代理通过 PREFIXDESK_TENANT_HEADER 指定；请去掉 tenant 参数。"


def test_behind_a_proxy_a_direct_caller_naming_a_tenant_is_refused(services, engine_loop, tmp_path):
    # The proxy is 10.9.9.9; this test connects from 127.0.0.1, as a client that bypassed it would.
    with SecondServer(services, engine_loop, tmp_path, trusted_proxies="10.9.9.9", tenant_header="X-Tenant") as url:
        r = httpx.post(url + "v1/chat/completions", json=BODY, headers={"X-Tenant": "victim"}, timeout=60)
        assert (r.status_code, r.json()["error"]) == (403, {"message": REFUSED, "type": "permission_error",
                                                             "param": None, "code": "tenant_refused"})
        chat = Client(url, verbose=False, headers={"X-Tenant": "victim"})
        out = chat.predict("hi", None, "support-en", None, None, api_name="/chat")
        assert (out["status"], out["error"]) == ("rejected", REFUSED)
        assert httpx.post(url + "v1/chat/completions", json=BODY, timeout=60).status_code == 200  # no tenant: fine


def test_the_salt_key_is_in_no_page_the_server_sends(server_url, settings):
    key = (settings.data_dir / "tenant-salt.key").read_text().strip()
    browser_key = (settings.data_dir / "browser-state.key").read_text().strip()
    assert key != browser_key
    for path in ("", "config", "gradio_api/info", "healthz", "v1/models"):
        assert key not in httpx.get(server_url + path).text, path
