"""Whether a replica is shown up or down, from real scrapes of a real HTTP server on a free port that answers as
a replica does: one that answers late (a busy machine) keeps its numbers and its cache until it has answered
nothing in time for SLOW_BEFORE_DOWN_S; one that refuses the connection is down at once."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import app.engine.replicas
from app.engine.replicas import Replicas
from app.engine.residency import ResidencyMirror
from tests.engine.test_stats_adapter import METRICS


class FakeReplicaServer(ThreadingHTTPServer):
    daemon_threads = True
    late_s = 0.0  # how long each answer waits


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(self.server.late_s)
        body = b"" if self.path == "/health" else METRICS.encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the scraper gave up waiting

    def log_message(self, *args):
        pass


@pytest.fixture
def replica():
    server = FakeReplicaServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def scraper(replica, monkeypatch):
    """Replicas over ``replica`` alone, its mirror holding 2 blocks; scraped only when a test says so."""
    monkeypatch.setattr(app.engine.replicas, "SCRAPE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(app.engine.replicas, "SLOW_BEFORE_DOWN_S", 3600.0)
    url = f"http://127.0.0.1:{replica.server_address[1]}"
    replicas = Replicas([url])
    replicas.mirrors[url] = mirror = ResidencyMirror("ipc://unused", 4)
    mirror.apply([{"type": "BlockStored", "block_hashes": [b"a", b"b"], "parent_block_hash": None,
                   "token_ids": list(range(8)), "block_size": 4, "extra_keys": None}], seq=0)
    yield replicas, mirror
    replicas.close()


def test_a_replica_that_answers_late_stays_up_with_its_cache_until_the_bound(replica, scraper, monkeypatch):
    replicas, mirror = scraper
    replicas.scrape_all()
    (view,) = replicas.views()
    assert (view.up, view.reason, view.running, view.waiting) == (True, "", 2, 3)
    replica.late_s = 1.0  # five times the scrape's timeout: every scrape times out
    for _ in range(3):
        replicas.scrape_all()
        (view,) = replicas.views()
        assert (view.up, view.reason, view.running, view.waiting) == (True, "", 2, 3)  # its last numbers
        assert mirror.num_cached_blocks() == 2  # a slow replica has lost nothing
    # Past the bound (here, at once) a replica that still answers nothing in time is down, its cache unknown.
    monkeypatch.setattr(app.engine.replicas, "SLOW_BEFORE_DOWN_S", 0.0)
    replicas.scrape_all()
    (view,) = replicas.views()
    assert (view.up, view.reason) == (False, "not answering (ReadTimeout)")
    assert mirror.num_cached_blocks() == 0
    # Answering in time again, it is up at once.
    replica.late_s = 0.0
    replicas.scrape_all()
    (view,) = replicas.views()
    assert (view.up, view.reason) == (True, "")
    assert replicas.recoveries == 1


def test_a_replica_that_refuses_the_connection_is_down_at_once(replica, scraper):
    replicas, mirror = scraper
    replicas.scrape_all()
    assert [(v.up, v.reason) for v in replicas.views()] == [(True, "")]
    replica.shutdown()
    replica.server_close()  # nothing listens on its port any more
    replicas.scrape_all()
    assert [(v.up, v.reason) for v in replicas.views()] == [(False, "not answering (ConnectError)")]
    assert mirror.num_cached_blocks() == 0  # a replica that went away lost its cache
