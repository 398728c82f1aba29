"""One validated Settings object, read once from the environment.

Each setting is declared once, as a field of ``Settings``: its name, type, default, help text and
check sit on one line. The parser comes from the type, ``SETTINGS`` (and with it docs/settings.md's table and
``python -m app --help``) from the fields, and ``load_settings`` runs every field's check, then the
rules that tie several settings together. This is the only module that reads ``os.environ``; it
imports nothing else of the app, so every layer may import it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "PREFIXDESK_"
# Model names that stand for a folder the app prepares itself (app/engine/models/aliases.py).
BUILT_IN_MODELS = ("qwen2.5-0.5b-demo",)
# Refused as an admin password unless admin_demo is on: anyone would guess them.
WEAK_PASSWORDS = frozenset({"admin", "password", "changeme", "secret", "prefixdesk", "12345678", "123456789",
                            "password1", "qwertyui", "letmein1"})
MIN_PASSWORD_CHARS = 8
MIN_METRICS_TOKEN_CHARS = 16  # a scraper's token is typed once into its config: long enough that guessing is hopeless
QUANTIZATIONS = ("fp8", "awq", "gptq")  # PREFIXDESK_QUANTIZATION's values besides empty (app/engine/precision.py)

Check = Callable[[Any], "str | None"]  # a value's problem ("must be ..."), or None when it is fine


class SettingsError(ValueError):
    """A setting has a value the app cannot run with; the message names the variable to fix."""


# -- checks (each returns what is wrong with a value, or None) ------------------------------------------


def between(lo: float, hi: float) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}, not {v}"


def at_least(lo: float, unit: str = "", *, off: bool = False) -> Check:
    """``off``: 0 is also accepted (it turns the feature off)."""
    def check(v):
        if v >= lo or (off and v == 0):
            return None
        return f"must be 0 (off) or at least {lo}{unit}, not {v}" if off else f"must be at least {lo}{unit}, not {v}"
    return check


def one_of(*choices: str) -> Check:
    return lambda v: None if v in choices else f"must be {' or '.join(choices)}, not {v!r}"


def _share(v: float) -> str | None:
    return None if 0 < v <= 1 else f"must be in (0, 1], not {v}"


def _block_size(v: int) -> str | None:
    return None if v >= 0 and v % 16 == 0 else f"must be 0 or a multiple of 16 (32 on CPU), not {v}"


def _kv_cache_dtype(v: str) -> str | None:
    return None if v in ("", "auto") or v.startswith("fp8") else f"must be empty, auto or an fp8 type, not {v!r}"


def zmq_endpoint_problem(endpoint: str) -> str | None:
    """What is wrong with a KV-event endpoint (``ipc://PATH``, ``tcp://IPV4:PORT`` or ``tcp://*:PORT``), or None.

    A tcp endpoint names the address its publisher binds (vLLM binds only an IPv4 address it is given in
    a form of its own; app/engine/residency.py), so a host name or an IPv6 address cannot be one."""
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return None
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not endpoint.startswith("tcp://") or not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return f"must be ipc://PATH or tcp://HOST:PORT, not {endpoint!r}"
    if host != "*":
        try:
            ipaddress.IPv4Address(host.removeprefix("[::ffff:").removesuffix("]"))
        except ValueError:
            return f"must name an IPv4 address (or *) in {endpoint!r}, the address its publisher listens on"
    return None


def _zmq_endpoint(v: str) -> str | None:
    return zmq_endpoint_problem(v) if v else None


def _http_urls(v: str) -> str | None:
    bad = [u for u in (x.strip() for x in v.split(",")) if u and not u.startswith(("http://", "https://"))]
    return f"must be http(s) URLs, not {bad[0]!r}" if bad else None


def _metrics_token(v: str) -> str | None:
    if not v:
        return None
    if len(v) < MIN_METRICS_TOKEN_CHARS or not v.isascii() or not v.isprintable() or " " in v:
        return f"must be empty or at least {MIN_METRICS_TOKEN_CHARS} printable ASCII characters without spaces"
    return None


def _not_blank(v: str) -> str | None:
    return None if v.strip() else "must not be empty"


def _parsed_by(parse: Callable[[str], Any]) -> Check:
    def check(v):
        try:
            parse(v)
        except ValueError as exc:
            return f"is invalid: {exc}"
        return None
    return check


def parse_networks(value: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``"127.0.0.1, 10.0.0.0/8"`` → networks; raises ValueError naming the bad entry."""
    networks = []
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or network (e.g. 127.0.0.1 or 10.0.0.0/8)") from None
    return tuple(networks)


def kv_event_sources(text: str) -> dict[str, str]:
    """``URL=ENDPOINT,URL=ENDPOINT`` (the form of vllm-router's --kv-event-source) as a dict; raises
    ValueError naming an item of another form."""
    sources = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        url, sep, endpoint = item.partition("=")
        if not sep or not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"{item!r} is not REPLICA_URL=tcp://HOST:PORT")
        if problem := zmq_endpoint_problem(endpoint):
            raise ValueError(f"the endpoint of {url!r} {problem}")
        sources[url.rstrip("/")] = endpoint
    return sources


def _setting(default: Any, help: str, *, check: Check | None = None, secret: bool = False) -> Any:
    return field(default=default, repr=not secret, metadata={"help": help, "check": check})


# -- the settings ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Settings:
    # Server
    host: str = _setting("127.0.0.1", "Address the web server listens on.")
    port: int = _setting(7860, "Port of the web server (chat at /, admin console at /admin).", check=between(1, 65535))
    web_processes: int = _setting(0, "Web processes behind one port (Caddy in front, each browser kept with one process "
                                  "by a cookie; with PREFIXDESK_ENGINE=local they share one vllm serve that the app "
                                  "starts on loopback). 0 picks: half the cores (2 to 8) on a GPU machine, 1 elsewhere "
                                  "(the in-process engine). Above 8 on SQLite, use PostgreSQL.", check=between(0, 64))
    tier_port: int = _setting(0, "First of the loopback ports the web processes (PREFIXDESK_WEB_PROCESSES above 1), "
                              "then the shared engine and its KV events take, in a row; 0: the ports after "
                              "PREFIXDESK_PORT.", check=between(0, 65535))
    data_dir: Path = _setting(Path("var"), "Folder for the SQLite database, the demo model and other state.")
    database_url: str = _setting("", "SQLAlchemy URL of the database; empty means sqlite:///<data_dir>/prefixdesk.db.")
    templates_dir: Path = _setting(Path("templates"), "Folder of template files that seed an empty database.")
    ui_language: str = _setting("zh", "Language of the chat and console text: zh or en.", check=one_of("zh", "en"))
    # Model
    model: str = _setting("", "Hugging Face id or local path of the model, or qwen2.5-0.5b-demo (a real small chat "
                          "model that `make demo-model` prepares); empty uses the built-in random-weight demo model.")
    engine: str = _setting("local", "Where answers are generated: local (vLLM in this process) or remote (an "
                           "OpenAI-compatible server at PREFIXDESK_ENGINE_URL, normally vllm-router in front of vllm "
                           "serve replicas).", check=one_of("local", "remote"))
    engine_url: str = _setting("", "Base URL of the remote engine (PREFIXDESK_ENGINE=remote), e.g. "
                               "http://127.0.0.1:8000.")
    engine_connect_timeout_s: float = _setting(120.0, "Seconds the app waits at start-up for PREFIXDESK_ENGINE_URL to "
                                               "serve a model (remote engine).", check=at_least(1, " second"))
    replica_urls: str = _setting("", "Base URLs of the vllm serve replicas behind PREFIXDESK_ENGINE_URL, "
                                 "comma-separated (remote engine): the console's per-replica view and the cache reset "
                                 "use them. Empty: ask the router (vllm-router's /list_workers), or with no router use "
                                 "PREFIXDESK_ENGINE_URL itself.", check=_http_urls)
    engine_api_key: str = _setting("", "Bearer token the app sends to the remote engine (the router and every "
                                   "replica); python -m app.cluster starts the replicas with it as vLLM's --api-key, "
                                   "which they then ask for on every route but /health. Empty: none.", secret=True)
    replica_kv_events: str = _setting("", "KV-cache event publishers of the replicas, as REPLICA_URL=ZMQ_ENDPOINT "
                                      "pairs separated by commas (remote engine): tcp://HOST:PORT, the private address "
                                      "the replica binds its publisher on (python -m app.cluster's --host), which the "
                                      "app subscribes to; tcp://*:PORT means a publisher on all of this host's "
                                      "addresses (reached at 127.0.0.1). Empty: no per-replica residency.",
                                      check=_parsed_by(kv_event_sources))
    engine_stall_timeout_s: float = _setting(30.0, "Seconds an engine may hold unfinished requests without finishing "
                                             "a step (a chunk of a prompt counts; however slowly their answers are "
                                             "read) before /healthz reports it down and it is restarted as after a "
                                             "crash.",
                                             check=at_least(1, " second"))
    tokenizer: str = _setting("", "Tokenizer id or path, when it differs from the model. Empty: the model's own; "
                              "for a Baichuan2 folder, its tokenizer.model converted to a fast tokenizer with the "
                              "Baichuan2 chat template under the data dir on first use.")
    dtype: str = _setting("auto", "Weight and activation dtype (auto, bfloat16, float16, float32).")
    quantization: str = _setting("", "Weight quantization: empty (the checkpoint's own weights, or the "
                                 "quantization_config its config.json carries), fp8 (weights quantized to fp8 as they "
                                 "load; GPUs of compute capability 8.9 or newer), awq or gptq (a checkpoint quantized "
                                 "that way). Not available on CPU.", check=lambda v: None if v in ("", *QUANTIZATIONS)
                                 else f"must be empty or one of {', '.join(QUANTIZATIONS)}, not {v!r}")
    trust_remote_code: bool = _setting(False, "Allow the model's own Python code (models neither vLLM nor prefixdesk "
                                       "supports; Baichuan2 needs none).")
    load_format: str = _setting("auto", "vLLM load format; 'dummy' loads random weights for benchmarks.")
    tensor_parallel_size: int = _setting(1, "Number of GPUs one model is split across.", check=at_least(1))
    gpu_memory_utilization: float = _setting(0.9, "Share of GPU memory vLLM may take (GPU only).", check=_share)
    max_model_len: int = _setting(4096, "Context length in tokens: system prompt, history and answer together.",
                                  check=at_least(256, " tokens"))
    block_size: int = _setting(0, "Tokens per KV-cache block; 0 picks 32 on CPU and 16 on GPU.", check=_block_size)
    kv_cache_mib: int = _setting(256, "KV-cache size in MiB on CPU machines (GPU sizes it from memory).",
                                 check=at_least(1))
    kv_cache_dtype: str = _setting("", "KV-cache dtype (auto, fp8); empty picks auto on CPU and fp8 on GPU.",
                                   check=_kv_cache_dtype)
    max_num_seqs: int = _setting(0, "Most requests vLLM runs at once; 0 picks 64 on CPU and 1024 on GPU.",
                                 check=at_least(0))
    max_num_batched_tokens: int = _setting(0, "Token budget of one engine step (longer prompts are prefilled in "
                                           "chunks of it); 0 picks 128 on CPU (at least max_num_seqs), 16384 on GPU.",
                                           check=at_least(0))
    enforce_eager: bool | None = _setting(None, "Skip torch.compile and CUDA graphs (fast start, slower steps); "
                                          "empty picks true on CPU and false on GPU.")
    cascade_attention: bool = _setting(True, "Let vLLM read a shared prefix once per decode step (GPU).")
    prefix_caching: bool = _setting(True, "Reuse cached prompt blocks across requests; off only to measure what "
                                    "reuse buys.")
    cuda_graph_max_batch: int = _setting(0, "Largest batch captured as a CUDA graph (GPU); 0 keeps vLLM's 512.",
                                         check=at_least(0))
    stream_interval: int = _setting(0, "Tokens vLLM gathers before handing a stream more text (the first is always "
                                    "sent at once); 1 sends each at once. 0 picks 4 for a served engine on a GPU (the "
                                    "web tier's and the cluster's vllm serve), 1 elsewhere.", check=at_least(0))
    # Generation
    max_tokens: int = _setting(256, "Most tokens in one answer.", check=at_least(1))
    temperature: float = _setting(0.7, "Sampling temperature of answers.", check=between(0, 2))
    top_p: float = _setting(0.9, "Nucleus sampling threshold of answers.", check=_share)
    seed: int = _setting(0, "Seed of the engine's sampler.")
    ignore_eos: bool = _setting(False, "Answers always run to PREFIXDESK_MAX_TOKENS, past the model's end token: for "
                                "load tests and soak runs, where every answer must cost the same. Off for customers.")
    engine_step_delays: bool = _setting(False, "Tests only: the engine (with the launcher, every replica) lets an "
                                        "answer ask for a pause after each engine step, so a test can stop, kill or "
                                        "signal an answer that is certainly still streaming. Off: no extra logits "
                                        "processor runs.")
    step_delay_ms: int = _setting(0, "Tests only: every answer asks the engine for this pause (milliseconds) after "
                                  "each step; needs PREFIXDESK_ENGINE_STEP_DELAYS. 0: none.", check=between(0, 1000))
    max_concurrent_requests: int = _setting(0, "Answers generated at once; more are told the desk is busy. 0 picks "
                                            "twice max_num_seqs (128 on CPU, 2048 on GPU), or 256 per replica with the "
                                            "remote engine.", check=at_least(0))
    drop_oldest_turns: bool = _setting(True, "Drop the oldest turns when a conversation outgrows the context.")
    rate_limit_per_minute: int = _setting(30, "Messages one browser (by the key the chat issued it) may send a minute; a "
                                          "caller without one (/v1, /chat) is limited by its address. 0 turns the "
                                          "limit off.", check=at_least(0))
    max_streams_per_client: int = _setting(8, "Answers one browser (by the key the chat issued it) may have streaming "
                                           "at once; a caller without one (/v1, /chat) is limited by its address. 0 "
                                           "turns the limit off.", check=at_least(0))
    rate_limit_per_address_per_minute: int = _setting(300, "Messages one client address may send a minute, all its "
                                                      "browsers and callers together: a coarse outer bound, several "
                                                      "times one browser's, that an office behind one NAT address "
                                                      "stays under. 0 turns it off.", check=at_least(0))
    max_streams_per_address: int = _setting(64, "Answers one client address may have streaming at once, all its "
                                            "browsers and callers together (an outer bound, like "
                                            "PREFIXDESK_RATE_LIMIT_PER_ADDRESS_PER_MINUTE). 0 turns it off.",
                                            check=at_least(0))
    person_waiting_per_client: int = _setting(3, "Conversations one client address (an IPv6 address's /64) may have "
                                              "waiting for a person at once; a further request is refused in plain "
                                              "words and counted on the console's Conversations tab. 0 turns the cap "
                                              "off.", check=at_least(0))
    person_waiting_per_session: int = _setting(1, "Conversations one browser may have waiting for a person at once "
                                               "(refused and counted like the address's). 0 turns the cap off.",
                                               check=at_least(0))
    person_waiting_max: int = _setting(100, "Conversations waiting for a person at once, all customers together: "
                                       "further customers are asked to try again in a few minutes, and the console "
                                       "says the queue is full. 0 turns the cap off.", check=at_least(0))
    feedback_per_client: int = _setting(30, "Ratings one client address may have counted an hour, and as many "
                                        "first-text times (the browser's own report): more are not counted, so a "
                                        "few scripted clients cannot decide a split's ratings. 0 turns the limit "
                                        "off.", check=at_least(0))
    feedback_per_session: int = _setting(15, "The same per browser: ratings, and as many first-text times, one "
                                         "browser may have counted an hour. 0 turns the limit off.",
                                         check=at_least(0))
    chat_updates_per_s: int = _setting(2000, "Screen updates a second the chat sends, all streaming answers together: "
                                       "each answer gets at most ten a second, fewer when more answers stream at "
                                       "once, so that under load the text comes in larger pieces rather than the "
                                       "server falling behind.", check=at_least(10))
    queue_max_size: int = _setting(256, "Chat requests the web server holds at once; more are told to retry.",
                                   check=at_least(1))
    max_connections_per_client: int = _setting(256, "Connections one client address may hold open at once, per web "
                                               "process, while the process has room (an office behind one NAT "
                                               "address needs several per browser); more are closed as they arrive. "
                                               "A trusted proxy's own connections count only against "
                                               "PREFIXDESK_MAX_CONNECTIONS (limit per client at the proxy). 0 turns "
                                               "the limit off.", check=at_least(0))
    connections_reserved_percent: int = _setting(20, "Share of PREFIXDESK_MAX_CONNECTIONS (percent) kept for new "
                                                 "clients: once the process holds the rest, an address that "
                                                 "already has PREFIXDESK_MAX_CONNECTIONS_PER_CLIENT_WHEN_BUSY "
                                                 "connections gets no more, so a fresh customer still gets in when "
                                                 "many addresses fill the server. 0: nothing kept.",
                                                 check=between(0, 90))
    max_connections_per_client_when_busy: int = _setting(8, "Connections an address may hold once the process is "
                                                         "into its reserved share "
                                                         "(PREFIXDESK_CONNECTIONS_RESERVED_PERCENT): enough for one "
                                                         "browser's page and its streams.", check=at_least(1))
    max_connections: int = _setting(0, "Connections one web process holds open at once; more are closed as they "
                                    "arrive. 0 picks the process's file limit (raised to its hard limit at start) "
                                    "less 512 for the engine, the database and logs; a larger value refuses to start.",
                                    check=at_least(0))
    request_arrival_timeout_s: float = _setting(20.0, "Seconds a client has to send a request's headers and body once "
                                                "it has begun; a slower one is answered 408 and closed. Answers, "
                                                "streamed or not, are not timed.", check=at_least(0.1, " seconds"))
    session_claims_per_minute: int = _setting(30, "New chat or console pages (Gradio sessions) one browser cookie, and "
                                              "one client address, may open a minute; more are answered 429. 0 "
                                              "turns the limit off.", check=at_least(0))
    page_gone_s: float = _setting(150.0, "Seconds after a chat or console page's last sign of life (it sends one "
                                  "every 15 s, a background tab at least once a minute) when the server takes it "
                                  "as closed and drops what it kept for it; a page that is closed says so at once.",
                                  check=at_least(1, " seconds"))
    max_request_kib: int = _setting(1024, "Largest request body the server reads, in KiB; larger ones get 413 before "
                                    "any work.", check=at_least(64))
    max_upload_mib: int = _setting(1, "Largest file an operator may upload to the console (template files), in MiB; "
                                   "the chat accepts no uploads at all.", check=at_least(1))
    trusted_proxies: str = _setting("", "Comma-separated addresses or networks of the reverse proxies in front of the "
                                    "server (e.g. 127.0.0.1 or 10.0.0.0/8). Only from them are the X-Forwarded-For "
                                    "address and the tenant header believed; empty: none, the connecting address is "
                                    "the client.", check=_parsed_by(parse_networks))
    forwarded_for_header: str = _setting("x-forwarded-for", "Header in which a trusted proxy names the client's "
                                         "address.")
    tenant_header: str = _setting("", "HTTP header in which a trusted proxy names the tenant; each tenant gets its own "
                                  "cache_salt, so no tenant can see from timing what another has cached. Sent by "
                                  "anyone else, it is refused. Empty: one tenant.")
    family_shards: int = _setting(1, "Routing keys per template family (family:0 … family:k-1): 1 keeps a family on "
                                  "one replica; more spread a hot family over several (remote engine).",
                                  check=between(1, 64))
    warm_on_start: bool = _setting(True, "Warm every published template, then the sampler (one batch of requests at "
                                   "once with the customers' sampling), before /healthz reports ready, so the first "
                                   "customer already hits the cache and waits for no compile.")
    # Cache view
    kv_events: bool = _setting(True, "Mirror vLLM's KV-cache events so the console shows which templates are cached.")
    kv_events_endpoint: str = _setting("", "ZMQ endpoint vLLM publishes KV-cache events on (it binds it: "
                                       "tcp://127.0.0.1:PORT or ipc://PATH); empty picks a private ipc socket in the "
                                       "temp folder.", check=_zmq_endpoint)
    kv_cache_metrics: bool = _setting(False, "Let vLLM sample KV blocks as they are evicted (its --kv-cache-metrics, 1% "
                                      "of blocks): the cache page then shows how long blocks live and sit idle "
                                      "before eviction.")
    sample_interval_s: float = _setting(2.0, "Seconds between the cache samples kept for the console's plots.",
                                        check=at_least(0.1, " seconds"))
    sample_retention_h: int = _setting(168, "Hours of cache samples kept in the database; older ones are deleted.",
                                       check=at_least(1, " hour"))
    keep_warm_interval_s: float = _setting(30.0, "Seconds between re-sends of pinned templates' prefixes, which keep "
                                           "them cached; 0 turns keep-warm off.", check=at_least(0))
    # Metrics
    metrics_token: str = _setting("", "Bearer token a Prometheus scraper sends for /metrics (the app's own figures: "
                                  "docs/metrics.md); at least 16 characters. Empty: /metrics is not served (404), "
                                  "since the chat's port is usually public.", check=_metrics_token, secret=True)
    # Admin console
    admin_user: str = _setting("admin", "Operator account that PREFIXDESK_ADMIN_PASSWORD creates for the console at "
                               "/admin.", check=_not_blank)
    admin_password: str = _setting("", "Password of PREFIXDESK_ADMIN_USER; empty creates no account (the console stays "
                                   "closed until one exists, e.g. from `python -m admin create-user NAME`). A "
                                   "weak one refuses to start.", secret=True)
    admin_demo: bool = _setting(False, "Demo mode: accept a weak admin password; the console shows a warning.")
    admin_session_ttl_s: int = _setting(28800, "Seconds a console login lasts before the operator must log in again.",
                                        check=at_least(1))
    admin_login_attempts: int = _setting(5, "Failed console logins from one client address before each further try "
                                         "must wait 1 s, then 2, 4, … up to 5 minutes (per address, so no one can lock "
                                         "an operator out).", check=at_least(1))

    @property
    def uses_demo_model(self) -> bool:
        return not self.model

    @property
    def metrics_dir(self) -> Path | None:
        """Where the web processes keep their metric values for /metrics to add up (prometheus_client's
        multiprocess mode); None with one process, which keeps them in memory."""
        return Path(self.data_dir) / "metrics" if self.web_processes > 1 else None

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated again."""
        return _validated(dataclasses.replace(self, **changes))


# -- rules over several settings ------------------------------------------------------------------------


def password_weakness(password: str) -> str | None:
    """Why ``password`` is too weak for an operator account, or None when it is acceptable."""
    if len(password) < MIN_PASSWORD_CHARS:
        return f"it has {len(password)} characters; use at least {MIN_PASSWORD_CHARS}"
    if password.lower() in WEAK_PASSWORDS:
        return "it is a well-known placeholder password"
    return None


def _weak_password(s: Settings) -> str | None:
    weakness = password_weakness(s.admin_password) if s.admin_password else None
    if weakness and not s.admin_demo:
        return (f"is too weak ({weakness}); choose a stronger one, or set PREFIXDESK_ADMIN_DEMO=true for a demo that "
                "nobody else can reach")
    return None


def _model_exists(s: Settings) -> str | None:
    if (s.model and s.model not in BUILT_IN_MODELS and not _looks_like_hub_id(s.model)
            and not Path(s.model).exists()):
        return f"points to {s.model!r}, which does not exist; give a local model folder or a hub id"
    return None


def _looks_like_hub_id(model: str) -> bool:
    # "org/name" with no leading ./ or / is a hub id; anything else is a path.
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "/", "~"))


# (the setting the message names, its problem or None), checked after every field's own check
RULES: tuple[tuple[str, Callable[[Settings], str | None]], ...] = (
    ("max_tokens", lambda s: f"must be between 1 and max_model_len - 1 ({s.max_model_len - 1})"
                             if s.max_tokens >= s.max_model_len else None),
    ("tenant_header", lambda s: "needs PREFIXDESK_TRUSTED_PROXIES: only a proxy may name the tenant"
                                if s.tenant_header and not s.trusted_proxies else None),
    ("engine_url", lambda s: f"must be an http(s) URL when PREFIXDESK_ENGINE=remote, not {s.engine_url!r}"
                             if s.engine == "remote" and not s.engine_url.startswith(("http://", "https://")) else None),
    ("step_delay_ms", lambda s: "needs PREFIXDESK_ENGINE_STEP_DELAYS=true: the engine ignores it otherwise"
                                if s.step_delay_ms and not s.engine_step_delays else None),
    ("admin_password", _weak_password),
    ("model", _model_exists),
)


# -- derived from the fields --------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One field of ``Settings`` as the environment, docs/settings.md and ``--help`` see it."""

    name: str
    default: Any
    help: str
    parse: Callable[[str], Any]
    check: Check | None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected true/false, got {raw!r}")


def _parse_optional_bool(raw: str) -> bool | None:
    return None if not raw.strip() else _parse_bool(raw)


_PARSERS: dict[Any, Callable[[str], Any]] = {str: str, int: int, float: float, Path: Path, bool: _parse_bool,
                                             bool | None: _parse_optional_bool}
_TYPES = typing.get_type_hints(Settings)
SETTINGS: tuple[Setting, ...] = tuple(
    Setting(f.name, f.default, f.metadata["help"], _PARSERS[_TYPES[f.name]], f.metadata["check"])
    for f in dataclasses.fields(Settings))
_BY_NAME = {s.name: s for s in SETTINGS}


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the Settings from ``environ`` (default: the process environment) and ``overrides``.

    Raises SettingsError naming the environment variable of the first bad value.
    """
    environ = os.environ if environ is None else environ
    unknown = set(overrides) - set(_BY_NAME)
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.name in overrides:
            value = overrides[setting.name]
            values[setting.name] = Path(value) if setting.parse is Path else value
        elif setting.env in environ:
            try:
                values[setting.name] = setting.parse(environ[setting.env])
            except ValueError as exc:
                raise SettingsError(f"{setting.env}: {exc}. {setting.help}") from None
    settings = Settings(**values)
    if not settings.database_url:
        settings = dataclasses.replace(settings, database_url=f"sqlite:///{settings.data_dir / 'prefixdesk.db'}")
    return _validated(settings)


def _validated(settings: Settings) -> Settings:
    for setting in SETTINGS:
        if setting.check and (problem := setting.check(getattr(settings, setting.name))):
            _fail(setting.name, problem)
    for name, rule in RULES:
        if problem := rule(settings):
            _fail(name, problem)
    return settings


def _fail(name: str, problem: str) -> typing.NoReturn:
    setting = _BY_NAME[name]
    raise SettingsError(f"{setting.env} {problem}. {setting.help}")


def help_text() -> str:
    """Every setting with its variable, default and help, as ``python -m app --help`` prints it."""
    lines = ["prefixdesk settings (environment variables):", ""]
    for s in SETTINGS:
        lines.append(f"  {s.env} (default {_shown(s.default, quoted=False)})")
        lines.append(f"      {s.help}")
    return "\n".join(lines)


def markdown_table() -> str:
    """docs/settings.md's settings table, generated from ``SETTINGS`` (tests/test_docs.py keeps the two equal)."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    rows += [f"| `{s.env}` | {_shown(s.default)} | {s.help} |" for s in SETTINGS]
    return "\n".join(rows)


def _shown(default: Any, *, quoted: bool = True) -> str:
    if default in ("", None):
        return "(empty)"
    text = str(default).lower() if isinstance(default, bool) else str(default)
    return f"`{text}`" if quoted else text
