"""/metrics is the operators': with PREFIXDESK_METRICS_TOKEN set, only a request bearing it gets the figures
(401 for anyone else, the database unread); without it, there is no /metrics at all (404). A customer's text,
or a template name a customer sent, never becomes a label value."""

from __future__ import annotations

import httpx
import pytest

from app.core.desk import DeskInputError
from app.settings import SettingsError, load_settings
from tests.helpers.metrics import METRICS_TOKEN, scrape
from tests.helpers.servers import SecondServer, collect

TAG = "zq7-canary-4491"


@pytest.fixture(scope="module")
def guarded(services, engine_loop, tmp_path_factory):
    server = SecondServer(services, engine_loop, tmp_path_factory.mktemp("metrics-guarded"),
                          metrics_token=METRICS_TOKEN)
    with server as url:
        yield server, url


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", f"Bearer {METRICS_TOKEN}x", f"Bearer {METRICS_TOKEN[:-1]}",
    f"Basic {METRICS_TOKEN}", METRICS_TOKEN, f"Bearer  {METRICS_TOKEN}",
    "Bearer " + "a" * 600, f"Bearer {METRICS_TOKEN}\u00e9",
], ids=["none", "empty", "scheme-only", "longer", "shorter", "basic", "bare", "two-spaces",
        "oversized", "non-ascii"])
def test_metrics_are_refused_without_the_exact_token(guarded, authorization):
    _, url = guarded
    headers = {} if authorization is None else {"Authorization": authorization.encode("utf-8")}
    r = httpx.get(url + "metrics", headers=headers, timeout=30)
    assert (r.status_code, r.text, r.headers["www-authenticate"]) == (401, "Unauthorized", "Bearer")
    assert "prefixdesk" not in r.text


def test_the_token_in_the_query_string_or_a_cookie_is_not_taken(guarded):
    _, url = guarded
    for r in (httpx.get(url + "metrics", params={"token": METRICS_TOKEN}, timeout=30),
              httpx.get(url + "metrics", cookies={"authorization": f"Bearer {METRICS_TOKEN}"}, timeout=30)):
        assert r.status_code == 401


def test_the_right_token_gets_the_figures_and_the_scheme_is_case_blind(guarded):
    _, url = guarded
    r = httpx.get(url + "metrics", headers={"Authorization": f"bearer {METRICS_TOKEN}"}, timeout=60)
    assert (r.status_code, r.headers["cache-control"]) == (200, "no-store")
    assert "# TYPE prefixdesk:answers_total counter" in r.text


def test_without_a_token_there_is_no_metrics_route(server_url):
    for headers in ({}, {"Authorization": f"Bearer {METRICS_TOKEN}"}):
        r = httpx.get(server_url + "metrics", headers=headers, timeout=30)
        assert (r.status_code, r.text) == (404, "Not Found")


def test_a_customers_words_never_become_a_label(guarded, aio):
    server, url = guarded
    desk = server.services.desk
    with pytest.raises(DeskInputError):
        aio(collect(desk.answer(session_key="metrics-canary", client="192.0.2.77",
                                template_name=f"<script>{TAG}</script>", message=f"hello {TAG}")))
    events = aio(collect(desk.answer(session_key="metrics-canary", client="192.0.2.77", template_name="support-en",
                                     message=f"my order {TAG} is late", max_tokens=4)))
    assert events[-1].message.status == "ok"
    r = httpx.get(url + "metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=60)
    assert TAG not in r.text
    samples = scrape(url)
    assert samples["prefixdesk:refused_total"] == {(("reason", "no_template"),): 1}
    assert {dict(k)["template"] for k in samples["prefixdesk:answers_total"]} == {"support-en"}


@pytest.mark.parametrize("token", ["short-token", "a token with spaces", "token-\u00e9-0123456789abcdef"])
def test_a_guessable_or_unsendable_token_refuses_to_start(token):
    with pytest.raises(SettingsError) as refused:
        load_settings(environ={"PREFIXDESK_METRICS_TOKEN": token})
    assert str(refused.value).startswith("PREFIXDESK_METRICS_TOKEN must be empty or at least 16 printable ASCII "
                                         "characters without spaces.")
    assert token not in str(refused.value)
