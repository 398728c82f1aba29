"""Attack: the Gradio routes this app never uses.

Before: /gradio_api/dev/reload was mounted in production (6,000 idle streams, each waking every
50 ms, took the server's CPU from 6% to 54% and /v1's p50 from 0.4 to 3.4 s); /gradio_api/deep_link
returned a session's state; /gradio_api/process_recording took uploads; /gradio_api/run/<name>
ran any event outside the queue (even by fn_index) and answered a bad call with 500 and a 3 KB
traceback in the log (31 MB in 10 s).
After: an allow-list of the routes the chat and the console use (the page: queue/join, queue/data,
heartbeat, cancel, reset, and app_id, which a page asks after a lost connection until the server is back;
gradio_client: info too; the console: upload, upload_progress, file=);
every other path under /gradio_api/ answers 404 with a short JSON body, logs no traceback, and is
logged as one line a second at most. An event sent fewer values than its inputs (Gradio: 500 and a traceback)
is refused with 400 and a sentence.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.helpers.servers import EDGE_OPERATOR

UNUSED = [("GET", "dev/reload"), ("GET", "deep_link?deep_link=x"), ("POST", "process_recording"),
          ("POST", "run/nonexistent"), ("POST", "run/chat"), ("POST", "run/predict"), ("POST", "api/chat"),
          ("POST", "call/chat"), ("GET", "startup-events"), ("GET", "token"), ("GET", "user"),
          ("GET", "login_check"), ("GET", "openapi.json"), ("POST", "stream/x"), ("POST", "vibe-edit"),
          ("GET", "monitoring"), ("GET", "runs"), ("GET", "profiling/traces"), ("POST", "component_server")]
CHAT_ONLY_UNUSED = [("GET", "file=/etc/hostname")]  # (the chat's upload routes answer 403: no uploads)
CHAT_ARGS = {"data": ["你好", None, "电商客服", None, None]}


def console_cookie(url: str) -> dict:
    r = httpx.post(url + "admin/login", data={"username": EDGE_OPERATOR[0], "password": EDGE_OPERATOR[1]})
    assert r.status_code == 200, r.text
    return {"prefixdesk_console": r.cookies["prefixdesk_console"]}


@pytest.mark.parametrize("prefix", ["", "admin/"])
def test_routes_the_app_does_not_use_answer_404_and_log_no_traceback(edge, prefix):
    cookies = console_cookie(edge.url) if prefix else {}
    routes = UNUSED + (CHAT_ONLY_UNUSED if not prefix else [])
    took_s = []

    def refuse_them():
        began = time.monotonic()
        for method, route in routes:  # each answered whole (a stream held open would run out the timeout)
            r = httpx.request(method, f"{edge.url}{prefix}gradio_api/{route}", json=CHAT_ARGS, cookies=cookies,
                              timeout=10)
            assert (route, r.status_code, r.json()) == (route, 404, {"detail": "Not Found"})
        took_s.append(time.monotonic() - began)
        if prefix:
            assert httpx.get(f"{edge.url}admin/gradio_api/dev/reload", timeout=10).status_code == 401  # the gate first

    new = edge.lines_logged_by(refuse_them)  # refusals are logged one line a second at most
    [elapsed_s] = took_s
    assert [line for line in new if "Traceback" in line or "Error" in line] == []
    assert 1 <= len(new) <= int(elapsed_s) + 1, new  # one line a second at most, however many are refused
    assert f"refused {routes[0][0]} /{prefix}gradio_api/{routes[0][1].split('?')[0]} from 127.0.0.1" in new[0]


def test_the_routes_the_pages_and_gradio_client_use_still_work(edge):
    from gradio_client import Client

    client = Client(edge.url, verbose=False)
    final = client.predict("价格保护怎么申请？", None, "电商客服", None, None, api_name="/chat")
    assert final["done"] is True and final["prompt_tokens"] > 0
    assert httpx.get(edge.url + "gradio_api/info").status_code == 200
    assert httpx.get(edge.url + "config").status_code == 200


def test_run_predict_runs_only_the_events_the_app_runs_outside_the_queue(edge):
    browser = httpx.Client(timeout=30)
    events = [d for d in browser.get(edge.url + "config").json()["dependencies"] if d["backend_fn"]]
    outside = [d for d in events if d["queue"] is False]
    queued = [d for d in events if d["queue"] is not False]
    # Outside: the page load, the sidebar after an answer, and the page's short events (thumbs, a person, rename…);
    # the answers' events (send, retry, continue) are queued.
    assert {"load", "then"} <= {t[1] for d in outside for t in d["targets"]}
    assert {"send", "send_1", "retry", "go_on"} <= {d["api_name"] for d in queued}
    session = "predict0001"
    load = next(d for d in outside if d["targets"][0][1] == "load")
    r = browser.post(edge.url + "gradio_api/run/predict", json={
        "data": [""] + [None] * (len(load["inputs"]) - 1), "fn_index": load["id"], "session_hash": session,
        "event_data": None, "trigger_id": None})
    assert r.status_code == 200 and len(r.json()["data"]) == len(load["outputs"])  # the session key, the topics …
    for d in queued:  # the send event among them: it runs in the queue, which admits it, or not at all
        r = browser.post(edge.url + "gradio_api/run/predict", json={
            "data": [None] * len(d["inputs"]), "fn_index": d["id"], "session_hash": session, "event_data": None})
        assert (d["id"], r.status_code, r.json()) == (d["id"], 404, {"detail": "Not Found"})
    for fn_index in (None, "0", 10**6, [load["id"]]):
        r = browser.post(edge.url + "gradio_api/run/predict", json={"data": [""], "fn_index": fn_index,
                                                                    "session_hash": session})
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})


@pytest.mark.parametrize("prefix", ["", "admin/"])
def test_app_id_tells_a_page_the_server_is_back_and_nothing_else(edge, prefix):
    cookies = console_cookie(edge.url) if prefix else {}
    r = httpx.get(f"{edge.url}{prefix}gradio_api/app_id", cookies=cookies, timeout=10)
    assert r.status_code == 200
    assert list(r.json()) == ["app_id"]


def test_an_event_sent_fewer_values_than_its_inputs_is_refused_in_words_and_logs_no_traceback(edge):
    cfg = httpx.get(edge.url + "config", timeout=30).json()
    load = next(d for d in cfg["dependencies"] if d["backend_fn"] and d["targets"][0][1] == "load")
    send = next(d for d in cfg["dependencies"] if d.get("api_name") == "send")

    def send_too_few():
        with httpx.Client(timeout=30) as browser:
            browser.get(edge.url + "config")  # the session cookie: the page load below names a session
            for route, dep in (("run/predict", load), ("queue/join", send)):
                for data in ([], [""] * (len(dep["inputs"]) - 1), "not a list", None):
                    r = browser.post(f"{edge.url}gradio_api/{route}", json={
                        "data": data, "fn_index": dep["id"], "session_hash": "fewer0001", "event_data": None,
                        "trigger_id": dep["targets"][0][0]})
                    assert (route, data, r.status_code, r.json()) == (route, data, 400, {
                        "detail": f"This event takes {len(dep['inputs'])} values in its data list; send every one "
                                  "of them."})
            # Every value sent: the page load answers as before.
            r = browser.post(edge.url + "gradio_api/run/predict", json={
                "data": [""] + [None] * (len(load["inputs"]) - 1), "fn_index": load["id"],
                "session_hash": "fewer0001", "event_data": None, "trigger_id": None})
            assert r.status_code == 200 and len(r.json()["data"]) == len(load["outputs"])

    new = edge.lines_logged_by(send_too_few)
    assert [line for line in new if "Traceback" in line or "Error" in line] == []
