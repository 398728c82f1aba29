"""Attack: read customers' prompts off the cluster, or steer it, from another machine on the network.

Before: each replica published its KV-cache events on ``tcp://*:PORT`` although the launcher's
``--host`` was 127.0.0.1, so anyone on the network could subscribe and decode ``BlockStored``
token ids into customers' text; the replicas had no API key, so their /v1 and their dev endpoints
(/reset_prefix_cache, /collective_rpc ...) answered anyone who reached them.
After: every socket of the cluster listens on ``--host`` only (the KV events as
``tcp://[::ffff:HOST]:PORT``, which vLLM binds; the app subscribes to ``tcp://HOST:PORT``), and with
PREFIXDESK_ENGINE_API_KEY the replicas ask for it as a Bearer token on /v1 (vLLM's --api-key) and on
every other route but /health (our middleware), and the app's remote engine sends it.

The attacks meet the cluster tests/cluster/test_cluster.py uses (two replicas, the router, an API key:
tests/cluster/conftest.py). "Another machine" is 127.0.0.2: Linux routes all of 127/8 to lo, so an address other than --host
reaches this host the way a LAN address would.
"""

from __future__ import annotations

import socket
import time
import uuid

import httpx
import pytest

from app.engine.replicas import parse_metrics

from tests.helpers.cluster import API_KEY, BEARER
from tests.helpers.servers import collect

OTHER_ADDRESS = "127.0.0.2"


pytestmark = pytest.mark.usefixtures("serving")  # every replica up (test_cluster.py, run before, kills some)


def completion(url: str, prompt: list[int], **headers) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": "prefixdesk-demo", "prompt": prompt, "max_tokens": 2,
                                                     "ignore_eos": True}, headers=headers, timeout=60)


def test_every_socket_of_the_cluster_listens_on_the_chosen_host_only(cluster):
    listening = cluster.listening()
    o = cluster.options
    chosen = {o.replica_port, o.replica_port + 1, o.kv_events_port, o.kv_events_port + 1, o.router_port,
              o.router_metrics_port}  # both replicas' API and KV events, the router's two
    assert chosen <= {port for _, _, port in listening}, listening
    assert [s for s in listening if s[1] != "127.0.0.1"] == []
    for port in sorted(chosen):
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.settimeout(5)
            s.connect((OTHER_ADDRESS, port))


def test_a_stranger_subscribing_to_the_kv_events_gets_nothing_while_the_app_sees_every_block(cluster):
    import msgspec
    import zmq

    from app.engine.residency import ResidencyMirror

    replica = cluster.replica_urls[0]  # it publishes on kv_events_port
    app_mirror = ResidencyMirror(cluster.kv_events[replica], block_size=32)
    app_mirror.start()
    stranger = zmq.Context.instance().socket(zmq.SUB)
    stranger.setsockopt(zmq.SUBSCRIBE, b"")
    stranger.connect(f"tcp://{OTHER_ADDRESS}:{cluster.options.kv_events_port}")
    try:
        time.sleep(1.0)  # a ZMQ subscriber misses what is published before it is connected
        prompt = [uuid.uuid4().int % 3000 + 100] + list(range(300, 379))  # 80 tokens: 2 full blocks and a tail
        assert completion(replica, prompt, **BEARER).status_code == 200
        deadline, received = time.monotonic() + 5, []
        while time.monotonic() < deadline:
            if stranger.poll(100):
                received.append(msgspec.msgpack.decode(stranger.recv_multipart()[-1]))
        assert received == []
        assert app_mirror.wait_quiet(0.5, 15)
        assert app_mirror.match(prompt).resident_blocks == 2
    finally:
        stranger.close(linger=0)
        app_mirror.close()


def test_the_router_admin_routes_are_out_of_reach_from_another_address(cluster):
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"http://{OTHER_ADDRESS}:{cluster.options.router_port}/add_worker",
                   params={"url": f"http://{OTHER_ADDRESS}:9"}, timeout=5)
    workers = httpx.get(f"{cluster.router_url}/list_workers", timeout=5).json()
    assert sorted(workers["urls"]) == cluster.replica_urls


def test_the_replicas_ask_for_the_api_key_on_every_route_but_health(cluster):
    replica = cluster.replica_urls[0]
    assert completion(replica, [1, 2, 3]).status_code == 401
    assert completion(replica, [1, 2, 3], Authorization="Bearer guessed").status_code == 401
    assert completion(cluster.router_url, [1, 2, 3]).status_code == 401  # the router passes the replica's answer on
    for method, path in (("POST", "/reset_prefix_cache"), ("GET", "/metrics"), ("POST", "/tokenize"),
                         ("POST", "/collective_rpc"), ("POST", "/sleep"), ("GET", "/server_info")):
        r = httpx.request(method, f"{replica}{path}", json={}, timeout=10)
        assert (path, r.status_code, r.json()) == (path, 401, {"error": "Unauthorized"})
    assert httpx.get(f"{replica}/health", timeout=5).status_code == 200
    assert completion(cluster.router_url, [1, 2, 3], **BEARER).status_code == 200
    assert parse_metrics(httpx.get(f"{replica}/metrics", headers=BEARER, timeout=5).text).block_size == 32


def test_the_app_reaches_the_cluster_with_the_key(cluster, aio):
    from app.engine import RequestStats, build_engine, resolve_model_path

    assert cluster.settings.engine_api_key == API_KEY
    settings = cluster.settings.replace(engine="remote", engine_url=cluster.router_url,
                                        replica_urls=",".join(cluster.replica_urls),
                                        replica_kv_events=",".join(f"{u}={e}" for u, e in cluster.kv_events.items()))
    engine = build_engine(settings, resolve_model_path(settings))
    try:
        assert [(v.up, v.reason, v.block_size) for v in engine.replicas()] == [(True, "", 32)] * 2
        events = aio(collect(engine.stream(list(range(500, 600)), max_tokens=3, ignore_eos=True, routing_key="k")))
        assert isinstance(events[-1], RequestStats) and events[-1].output_tokens == 3
        assert aio(engine.reset_prefix_cache()) is True
    finally:
        engine.shutdown()
