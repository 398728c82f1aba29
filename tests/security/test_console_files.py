"""Attack, from inside: an operator's console naming a server path, and uploads past their limit.

Before: the console's template import took any server path in its file value (the same missing
allowed-path check as the chat), and uploads had no size limit (20 MB were accepted).
After: an event's file value must be a file uploaded to this app; uploads are limited to
PREFIXDESK_MAX_UPLOAD_MIB (1 MiB) and the chat takes none at all.

And from outside: the console's exports and uploads landed in Gradio's temp dir, which the public
chat served at /gradio_api/file= without a cookie (200, internal templates included). Now they live
in a folder of the console's own, which the chat blocks, and the chat's file routes answer 404.
"""

import json
from pathlib import Path

import httpx

from tests.helpers.attack import call_event, config
from tests.helpers.servers import operator

ACCOUNT = ("op-files", "operator files 77")


def session_cookie(url: str) -> dict:
    r = httpx.post(url + "admin/login", data={"username": ACCOUNT[0], "password": ACCOUNT[1]})
    return {"prefixdesk_console": r.cookies["prefixdesk_console"]}


def test_the_import_refuses_a_file_that_was_not_uploaded(server_url, services):
    operator(services, *ACCOUNT)
    cookies = session_cookie(server_url)
    cfg = httpx.get(server_url + "admin/config", cookies=cookies).json()
    [index] = [i for i, d in enumerate(cfg["dependencies"]) if d.get("api_name") == "import"]
    dep = cfg["dependencies"][index]
    secret = {"path": "/etc/passwd", "orig_name": "passwd.txt", "meta": {"_type": "gradio.FileData"}}
    messages = call_event(server_url + "admin/", dep.get("id", index), [[secret]], cookies=cookies,
                          trigger_id=dep["targets"][0][0])
    text = json.dumps(messages, ensure_ascii=False)
    assert "root:x:0:0" not in text
    final = messages[-1]
    assert (final["msg"], final["success"]) == ("process_completed", False)  # refused before the handler ran


def test_uploads_past_the_limit_are_refused_and_the_chat_takes_none(server_url, services):
    operator(services, *ACCOUNT)
    cookies = session_cookie(server_url)
    big = httpx.post(server_url + "admin/gradio_api/upload", cookies=cookies,
                     files={"files": ("big.txt", b"x" * (2 << 20))})
    assert (big.status_code, big.json()) == (413, {"detail": "The request body is larger than 1,088 KiB; send less "
                                                             "(the limit is PREFIXDESK_MAX_UPLOAD_MIB)."})
    small = httpx.post(server_url + "admin/gradio_api/upload", cookies=cookies,
                       files={"files": ("t.txt", "name: x\n---\ntext\n".encode())})
    assert small.status_code == 200 and small.json()[0].endswith("t.txt")
    assert httpx.post(server_url + "admin/gradio_api/upload", files={"files": ("t.txt", b"x")}).status_code == 401
    assert config(server_url)["max_file_size"] == 1024  # the chat's own limit, below Gradio's


def test_the_chat_serves_none_of_the_consoles_files(server_url, services):
    operator(services, *ACCOUNT)
    cookies = session_cookie(server_url)
    cfg = httpx.get(server_url + "admin/config", cookies=cookies).json()
    [index] = [i for i, d in enumerate(cfg["dependencies"]) if d.get("api_name") == "export"]
    dep = cfg["dependencies"][index]
    final = call_event(server_url + "admin/", dep.get("id", index), [], cookies=cookies,
                       trigger_id=dep["targets"][0][0])[-1]
    assert final["success"] is True
    exported = {Path(f["path"]).name: f["path"] for f in final["output"]["data"][0]}
    assert "support-en.txt" in exported
    uploaded = httpx.post(server_url + "admin/gradio_api/upload", cookies=cookies,
                          files={"files": ("internal.txt", "name: x\n---\ninternal text\n".encode())}).json()[0]
    for path in (exported["support-en.txt"], uploaded):
        for route in ("gradio_api/file=", "file=", "gradio_api/file/"):
            r = httpx.get(server_url + route + path)
            assert (route, r.status_code, r.text) == (route, 404, '{"detail":"Not Found"}')
        own = httpx.get(server_url + "admin/gradio_api/file=" + path, cookies=cookies)
        assert own.status_code == 200 and own.content == Path(path).read_bytes()
        assert httpx.get(server_url + "admin/gradio_api/file=" + path).status_code == 401
        assert Path(path).parent.parent.name.startswith("prefixdesk-console-"), path  # a folder of the console's own
