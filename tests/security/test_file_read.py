"""Attack: make Gradio serve a server file by naming it in an event's value (the chat is public).

Before: a chat history whose message named /proc/self/environ, sent to one of ChatInterface's own
events, made Gradio copy the file into its cache and hand back a URL anyone could download — the
process environment with the admin password, the SQLite database, the browser-state key. Gradio
skips its allowed-path check in apps that were mounted rather than launched.
After: the mounted apps say they are launched (the check runs), the data dir and the code are
blocked paths, and the chat's outputs never echo a value a browser sent. Every event the page's
config lists is tried with a file-shaped value in every input.
"""

import json
from urllib.parse import quote

import httpx
import pytest

from tests.helpers.attack import call_event, config

FILE_DATA = {"meta": {"_type": "gradio.FileData"}}
MARKERS = ("root:x:0:0", "PREFIXDESK_", "SQLite format 3")


def targets(settings) -> list[str]:
    data = settings.data_dir.resolve()
    return ["/etc/passwd", "/proc/self/environ", str(data / "prefixdesk.db"), str(data / "tenant-salt.key"),
            str(data / "browser-state.key")]


def shapes(path: str) -> list:
    """The forms a file can take in a component's value: bare, in a list, in a chat message."""
    one = {"path": path, "orig_name": "x.txt", **FILE_DATA}
    return [one, [one], {"role": "user", "content": [{"file": one, "alt_text": None}]},
            [{"role": "user", "content": {"file": one}}], {"files": [one], "text": "hi"}]


def test_no_event_of_the_public_chat_serves_a_file_named_in_its_input(server_url, settings):
    cfg = config(server_url)
    events = [(i, d) for i, d in enumerate(cfg["dependencies"]) if d.get("backend_fn")]
    # The page's events and their inputs: send ×2, retry, continue, a suggested question, an edited question, the
    # sidebar after each, stop, the first-text report, thumbs, the reason ×2, a person, the person's poll, following
    # an answer asked for before a reload, load,
    # open conversation, new / topic, rename, delete, the topics' refresh, the trash icon, /chat.
    assert [(d.get("api_name"), len(d["inputs"])) for _, d in events] == [
        ("send", 5), ("send_1", 5), ("retry", 3), ("go_on", 3), ("ask_suggested", 4), ("edit", 3),
        ("after_answer", 4), ("after_answer_1", 4), ("after_answer_2", 4), ("after_answer_3", 4),
        ("after_answer_4", 4), ("after_answer_5", 4), ("after_stop", 3), ("report_first_visible", 4), ("rated", 2),
        ("send_reason", 3), ("send_reason_1", 3), ("ask_person", 3), ("poll", 4), ("follow", 3), ("on_load", 2),
        ("open_conversation", 2), ("fresh", 1), ("change_topic", 3), ("rename", 3), ("delete", 3), ("lambda", 0),
        ("fresh_1", 1), ("chat", 5)]
    secrets_on_disk = [(settings.data_dir / n).read_text() for n in ("tenant-salt.key", "browser-state.key")]
    tried, named = 0, set()
    paths = targets(settings)
    for index, dep in events:
        for position in range(len(dep["inputs"])):
            for kind in range(5):  # each shape once, each with another of the paths (every path and shape per input)
                path = paths[(position + kind) % len(paths)]
                data = [None] * len(dep["inputs"])
                data[position] = shapes(path)[kind]
                messages = call_event(server_url, dep.get("id", index), data,
                                      trigger_id=(dep.get("targets") or [[None]])[0][0])
                text = json.dumps(messages, ensure_ascii=False)
                assert "/file=" not in text and "gradio_api/file" not in text, (dep.get("api_name"), text[:500])
                assert not any(m in text for m in MARKERS + tuple(secrets_on_disk)), dep.get("api_name")
                tried += 1
                named.add((path, kind))
    assert tried == 92 * 5  # every input of every event (92 in all), in each of the 5 shapes
    assert len(named) == 5 * 5  # every path in every shape


@pytest.mark.parametrize("name", ["/etc/passwd", "/proc/self/environ", "prefixdesk.db", "tenant-salt.key"])
def test_the_file_route_refuses_server_paths(server_url, settings, name):
    path = name if name.startswith("/") else str(settings.data_dir.resolve() / name)
    for prefix in ("gradio_api/file=", "file="):
        r = httpx.get(server_url + prefix + quote(path))
        assert r.status_code in (403, 404), (prefix, r.status_code)
        assert not any(m in r.text for m in MARKERS)


def test_the_chat_accepts_no_upload_and_gradio_extras_are_off(server_url):
    r = httpx.post(server_url + "gradio_api/upload", files={"files": ("a.txt", b"x" * 10)})
    assert (r.status_code, r.json()) == (403, {"detail": "This chat accepts no uploads: send your question as text."})
    for path in ("monitoring", "gradio_api/monitoring", "runs", "gradio_api/run-history/records", "docs",
                 "gradio_api/vibe-code"):
        assert httpx.get(server_url + path).status_code in (403, 404, 405), path
