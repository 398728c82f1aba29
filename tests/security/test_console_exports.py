"""Attack, on what is left behind: exported transcripts on the server's disk (issue 28).

Before: every export made a /tmp/prefixdesk-review-* folder that nothing removed (five of them, 50.9 MB of
customers' conversations, were still there after shutdown), and Gradio kept a second copy in its cache; the
template files' export left /tmp/prefixdesk-export-* folders the same way.
After: each export is a folder of its own inside the console's private folder (Gradio serves it from there,
without a copy), removed EXPORT_TTL_S after it was made (at the next export, and by a timer) and at shutdown.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from gradio_client import Client

from admin.exports import EXPORT_TTL_S, ExportFiles
from tests.helpers.clocks import ManualClock
from tests.helpers.servers import SecondServer, operator

ACCOUNT = ("op-exports", "exports kept briefly 28")


def test_an_export_is_removed_once_its_time_is_up_and_the_rest_when_the_console_closes(tmp_path):
    clock = ManualClock()
    exports = ExportFiles(tmp_path, clock=clock)
    first = exports.new_path("a.csv")
    first.write_text("x" * 1000)
    clock.advance(EXPORT_TTL_S - 1)
    second = exports.new_path("b.jsonl")
    second.write_text("y")
    assert (exports.prune(), first.is_file(), second.is_file()) == (0, True, True)
    clock.advance(1)  # the first is EXPORT_TTL_S old: gone, its folder with it
    assert (exports.prune(), first.parent.exists(), second.is_file(), exports.kept()) == (1, False, True,
                                                                                          [second.parent])
    third = exports.new_path("c.csv")
    third.write_text("z")
    exports.close()
    assert [p.exists() for p in (second.parent, third.parent)] == [False, False]
    assert list(tmp_path.iterdir()) == [] and exports.kept() == []


def test_the_timer_removes_an_export_nobody_follows(tmp_path):
    clock = ManualClock()
    exports = ExportFiles(tmp_path, ttl_s=0, clock=clock)

    async def export_and_wait() -> None:
        path = exports.new_path("a.csv")
        path.write_text("x")
        exports.expire_later()
        while exports.kept():  # exact state: the timer's prune has run
            await asyncio.sleep(0.01)

    # On a thread of its own: the session's browser may keep an event loop running on this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, asyncio.wait_for(export_and_wait(), 60)).result()
    assert list(tmp_path.iterdir()) == []


def test_a_servers_exports_go_after_their_time_and_at_shutdown(services, engine_loop, tmp_path):
    clock = ManualClock()
    server = SecondServer(services, engine_loop, tmp_path / "data", admin_clock=clock)
    with server as url:
        operator(server.services, *ACCOUNT)
        admin = Client(url + "admin/", auth=ACCOUNT, verbose=False, download_files=False)

        def export() -> Path:
            note, file = admin.predict("", "", "", "", "", "*", "csv", api_name="/export_conversations")
            assert note == "已导出 0 条消息。 请及时下载：文件在 10 分钟后从服务器删除。"
            return Path(file["value"]["path"])

        first = export()
        admin_folder = first.parent.parent
        assert first.read_text(encoding="utf-8").startswith("conversation_id,")
        assert admin_folder.name.startswith("prefixdesk-console-") and first.parent.name.startswith("prefixdesk-export-")
        clock.advance(EXPORT_TTL_S)
        second = export()
        assert (first.parent.exists(), second.is_file(), second.parent.parent) == (False, True, admin_folder)
        # The template files export the same way: in a folder of their own inside the console's, until its end.
        files = [Path(f["path"]) for f in admin.predict(api_name="/export")]
        assert sorted(f.name for f in files) == sorted(["support-en.txt", "商城通用规则.txt", "服装鞋包.txt",
                                                        "电商客服.txt", "电子产品.txt"])
        assert {f.parent.parent for f in files} == {admin_folder} and len({f.parent for f in files}) == 1
    assert (second.exists(), files[0].exists(), admin_folder.exists()) == (False, False, False)  # nothing left
