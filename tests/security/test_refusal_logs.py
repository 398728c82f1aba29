"""Attack: fill the server's log with bad requests (each one cheap to send, each one kilobytes of log).

Before: ``GET queue/data`` for a session that joined no event wrote two tracebacks (6.4 KB; Gradio raised
its 404 after its 200 had started); a ``/v1`` or login body that came too slowly got its 408 and then a
4.1 KB traceback (64 at once: 254 KB); an fn_index sent as ``"0"`` or ``0.0`` passed the guard's value count
and failed in Gradio (1.5 KB); and event data of the wrong shape (null, a string, ``{}``, a list) on the
suggested-question, edit and like events failed with a traceback each (~1.3 KB), like with a 500.
After: each is refused with a clear status and a sentence before Gradio reads it, and writes exactly one
log line, with no traceback.
"""

from __future__ import annotations

import logging
import socket
import uuid

import httpx
import pytest

from app.log_text import OneLineFormatter
from tests.helpers.attack import config, dependency
from tests.helpers.servers import SecondServer
from tests.helpers.waiting import wait_until

ARRIVAL_TIMEOUT_S = 2
NO_STREAM = {"detail": "This session has no event waiting: join one (queue/join) before reading its stream."}
NO_SUCH_EVENT = {"detail": "fn_index must be the number (an integer) of one of this page's events, as its config "
                           "lists them."}
FORMAT = OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


@pytest.fixture(scope="module")
def server(services, engine_loop, tmp_path_factory):
    """A server whose requests must arrive within ARRIVAL_TIMEOUT_S."""
    server = SecondServer(services, engine_loop, tmp_path_factory.mktemp("refusals"),
                          request_arrival_timeout_s=ARRIVAL_TIMEOUT_S)
    with server as url:
        server.url = url
        yield server


@pytest.fixture
def log_of(caplog, server):
    """``log_of(action)``: what ``action`` returned, and the server's log lines from its start until every request
    has ended (each one's lines written), formatted as the server writes them (a traceback is several lines)."""
    caplog.set_level(logging.WARNING)

    def run(action):
        wait_until(server.idle, 60, "the server to finish the requests before")
        caplog.clear()
        result = action()
        wait_until(server.idle, 60, "the server to finish the request")
        return result, [line for record in caplog.records for line in FORMAT.format(record).splitlines()]

    return run


def page(url: str) -> httpx.Client:
    client = httpx.Client(timeout=60)
    assert client.get(url + "config").status_code == 200
    return client


def test_the_stream_of_a_session_that_joined_no_event_is_a_404_and_one_line(server, log_of):
    client = page(server.url)
    r, lines = log_of(lambda: client.get(server.url + "gradio_api/queue/data",
                                         params={"session_hash": uuid.uuid4().hex}))
    assert (r.status_code, r.json()) == (404, NO_STREAM)
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "refused GET /gradio_api/queue/data from 127.0.0.1 with 404" in lines[0]


def slow_request(url: str, head: str) -> bytes:
    """``head`` (a request line and headers announcing a 64-byte body) and one byte of its body; then nothing: the
    server's whole answer, once it closes the connection."""
    port = int(url.rsplit(":", 1)[1].strip("/"))
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"{head}Host: 127.0.0.1\r\nContent-Length: 64\r\n\r\n{{".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("head", [
    "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n",
    "POST /admin/login HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\n",
])
def test_a_body_that_comes_too_slowly_is_a_408_with_the_security_headers_and_one_line(server, log_of, head):
    answer, lines = log_of(lambda: slow_request(server.url, head))
    status, _, rest = answer.partition(b"\r\n")
    headers = dict(line.split(b": ", 1) for line in rest.split(b"\r\n\r\n", 1)[0].split(b"\r\n"))
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert (headers[b"x-frame-options"], headers[b"x-content-type-options"]) == (b"DENY", b"nosniff")
    assert b"frame-ancestors 'none'" in headers[b"content-security-policy"]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert f"did not arrive within {ARRIVAL_TIMEOUT_S} s" in lines[0]


@pytest.mark.parametrize("fn_index", ["0", 0.0, True, -1, 10**6, None, [0]])
def test_an_fn_index_that_is_not_one_events_integer_is_a_400_and_one_line(server, log_of, fn_index):
    client = page(server.url)
    send = dependency(config(server.url), "send")
    body = {"data": ["你好", "电商客服", None, "", None], "fn_index": fn_index, "session_hash": uuid.uuid4().hex,
            "event_data": None, "trigger_id": send["targets"][0][0]}
    if fn_index == "0":
        body["fn_index"] = str(send["id"])  # the send event's own number, as a string
    elif fn_index == 0.0:
        body["fn_index"] = float(send["id"])
    r, lines = log_of(lambda: client.post(server.url + "gradio_api/queue/join", json=body))
    assert (r.status_code, r.json()) == (400, NO_SUCH_EVENT)
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "refused POST /gradio_api/queue/join from 127.0.0.1 with 400: fn_index" in lines[0]


SHAPES = [None, "x", {}, [], {"index": 0}, {"value": {"text": "q"}}, {"index": 0, "value": {"text": "q"}, "extra": 1}]


@pytest.mark.parametrize("event_data", SHAPES, ids=["null", "string", "empty", "list", "no-value", "no-index",
                                                    "extra-key"])
@pytest.mark.parametrize("event", ["ask_suggested", "edit", "rated"])
def test_event_data_of_another_shape_is_a_400_and_one_line(server, log_of, event, event_data):
    client = page(server.url)
    cfg = config(server.url)
    dep = next(d for d in cfg["dependencies"] if d["backend_fn"] and d.get("api_name") == event)
    shape = {"ask_suggested": "index and value", "edit": "index and previous_value and value",
             "rated": "index and value"}[event]
    route = "run/predict" if dep["queue"] is False else "queue/join"  # 👍/👎 runs outside the queue
    if event == "edit" and isinstance(event_data, dict) and "value" in event_data:
        event_data = {**event_data, "previous_value": "q"}  # every key but the one the shape lacks
    body = {"data": [None] * len(dep["inputs"]), "fn_index": dep["id"], "session_hash": uuid.uuid4().hex,
            "event_data": event_data, "trigger_id": dep["targets"][0][0]}
    r, lines = log_of(lambda: client.post(f"{server.url}gradio_api/{route}", json=body))
    assert (r.status_code, r.json()) == (400, {
        "detail": f"This event's event_data must be a JSON object with {shape} (and no other keys than Gradio's)."})
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert f"refused POST /gradio_api/{route} from 127.0.0.1 with 400: event {dep['id']}" in lines[0]


def test_event_data_on_an_event_that_takes_none_is_a_400_and_the_right_shapes_still_run(server, log_of):
    client = page(server.url)
    cfg = config(server.url)
    send, rated = dependency(cfg, "send"), next(d for d in cfg["dependencies"] if d.get("api_name") == "rated")
    body = {"data": ["你好", "电商客服", None, "", None], "fn_index": send["id"], "trigger_id": send["targets"][0][0],
            "session_hash": uuid.uuid4().hex, "event_data": {"index": 0, "value": "x"}}
    r, lines = log_of(lambda: client.post(server.url + "gradio_api/queue/join", json=body))
    assert (r.status_code, r.json()) == (400, {"detail": "This event takes no event_data: send null."})
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    # A 👍 of the shape the page sends, on a page with nothing to rate: 200, nothing changes, nothing logged.
    body = {"data": [None, ""], "fn_index": rated["id"], "session_hash": uuid.uuid4().hex,
            "event_data": {"index": 0, "value": ["x"], "liked": True}, "trigger_id": rated["targets"][0][0]}
    r, lines = log_of(lambda: client.post(server.url + "gradio_api/run/predict", json=body))
    assert r.status_code == 200 and lines == []
