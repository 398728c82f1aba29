"""One validated Settings object, read once from the environment.

Every setting is declared as data in ``SETTINGS`` (name, default, help), so the README table, the
``python -m app --help`` text and the validation all come from the same place. This is the only
module that reads ``os.environ``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.model_aliases import ALIASES

ENV_PREFIX = "PREFIXDESK_"
QUANTIZATIONS = ("fp8", "awq", "gptq")  # PREFIXDESK_QUANTIZATION's values besides empty (app/engine/precision.py)


class SettingsError(ValueError):
    """A setting has a value the app cannot run with; the message names the variable to fix."""


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"expected true/false, got {raw!r}")


def _parse_optional_bool(raw: str) -> bool | None:
    return None if not raw.strip() else _parse_bool(raw)


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


SETTINGS: tuple[Setting, ...] = (
    # Server
    Setting("host", "127.0.0.1", "Address the web server listens on."),
    Setting("port", 7860, "Port of the web server (chat at /, admin console at /admin).", int),
    Setting("web_processes", 1, "Web server processes sharing the port. More than 1 needs PREFIXDESK_ENGINE=remote "
            "(each process would otherwise start an engine of its own) and, for more than a few, PostgreSQL.", int),
    Setting("data_dir", "var", "Folder for the SQLite database, the demo model and other state."),
    Setting("database_url", "", "SQLAlchemy URL of the database; empty means sqlite:///<data_dir>/prefixdesk.db."),
    Setting("templates_dir", "templates", "Folder of template files that seed an empty database."),
    Setting("ui_language", "zh", "Language of the chat and console text: zh or en."),
    # Model
    Setting("model", "", "Hugging Face id or local path of the model, or qwen2.5-0.5b-demo (a real small chat model that `make demo-model` prepares); empty uses the built-in random-weight demo model."),
    Setting("engine", "local", "Where answers are generated: local (vLLM in this process) or remote (an "
            "OpenAI-compatible server at PREFIXDESK_ENGINE_URL, normally vllm-router in front of vllm serve replicas)."),
    Setting("engine_url", "", "Base URL of the remote engine (PREFIXDESK_ENGINE=remote), e.g. http://127.0.0.1:8000."),
    Setting("engine_connect_timeout_s", 120.0, "Seconds the app waits at start-up for PREFIXDESK_ENGINE_URL to "
            "serve a model (remote engine).", float),
    Setting("replica_urls", "", "Base URLs of the vllm serve replicas behind PREFIXDESK_ENGINE_URL, comma-separated "
            "(remote engine): the console's per-replica view and the cache reset use them. Empty: ask the router "
            "(vllm-router's /list_workers), or with no router use PREFIXDESK_ENGINE_URL itself."),
    Setting("replica_kv_events", "", "KV-cache event publishers of the replicas, as REPLICA_URL=ZMQ_ENDPOINT pairs "
            "separated by commas (remote engine). tcp://*:PORT subscribes to a publisher on this host; "
            "tcp://HOST:PORT binds here for a replica that publishes to this host. Empty: no per-replica residency."),
    Setting("engine_stall_timeout_s", 30.0, "Seconds an engine may hold requests without any progress before "
            "/healthz reports it down and it is restarted as after a crash.", float),
    Setting("tokenizer", "", "Tokenizer id or path, when it differs from the model. Empty: the model's own; for a "
            "Baichuan2 folder, its tokenizer.model converted to a fast tokenizer with the Baichuan2 chat template "
            "under the data dir on first use."),
    Setting("dtype", "auto", "Weight and activation dtype (auto, bfloat16, float16, float32)."),
    Setting("quantization", "", "Weight quantization: empty (the checkpoint's own weights, or the "
            "quantization_config its config.json carries), fp8 (weights quantized to fp8 as they load; GPUs of "
            "compute capability 8.9 or newer), awq or gptq (a checkpoint quantized that way). Not available on CPU."),
    Setting("trust_remote_code", False, "Allow the model's own Python code (models neither vLLM nor prefixdesk "
            "supports; Baichuan2 needs none).", _parse_bool),
    Setting("load_format", "auto", "vLLM load format; 'dummy' loads random weights for benchmarks."),
    Setting("tensor_parallel_size", 1, "Number of GPUs one model is split across.", int),
    Setting("gpu_memory_utilization", 0.9, "Share of GPU memory vLLM may take (GPU only).", float),
    Setting("max_model_len", 4096, "Context length in tokens: system prompt, history and answer together.", int),
    Setting("block_size", 0, "Tokens per KV-cache block; 0 picks 32 on CPU and 16 on GPU.", int),
    Setting("kv_cache_mib", 256, "KV-cache size in MiB on CPU machines (GPU sizes it from memory).", int),
    Setting("kv_cache_dtype", "", "KV-cache dtype (auto, fp8); empty picks auto on CPU and fp8 on GPU."),
    Setting("max_num_seqs", 0, "Most requests vLLM runs at once; 0 picks 64 on CPU and 1024 on GPU.", int),
    Setting("max_num_batched_tokens", 0, "Token budget of one engine step; 0 picks 4096 on CPU, 16384 on GPU.", int),
    Setting("enforce_eager", None, "Skip torch.compile and CUDA graphs (fast start, slower steps); "
            "empty picks true on CPU and false on GPU.", _parse_optional_bool),
    Setting("cascade_attention", True, "Let vLLM read a shared prefix once per decode step (GPU).", _parse_bool),
    Setting("prefix_caching", True, "Reuse cached prompt blocks across requests; off only to measure what reuse buys.",
            _parse_bool),
    Setting("cuda_graph_max_batch", 0, "Largest batch captured as a CUDA graph (GPU); 0 keeps vLLM's 512.", int),
    Setting("stream_interval", 1, "Tokens vLLM gathers before handing a stream more text; 1 sends each at once.", int),
    # Generation
    Setting("max_tokens", 256, "Most tokens in one answer.", int),
    Setting("temperature", 0.7, "Sampling temperature of answers.", float),
    Setting("top_p", 0.9, "Nucleus sampling threshold of answers.", float),
    Setting("seed", 0, "Seed of the engine's sampler.", int),
    Setting("ignore_eos", False, "Answers always run to PREFIXDESK_MAX_TOKENS, past the model's end token: for load "
            "tests and soak runs, where every answer must cost the same. Off for customers.", _parse_bool),
    Setting("max_concurrent_requests", 0, "Answers generated at once; more are told the desk is busy. "
            "0 picks twice max_num_seqs (128 on CPU, 2048 on GPU), or 256 per replica with the remote engine.", int),
    Setting("drop_oldest_turns", True, "Drop the oldest turns when a conversation outgrows the context.", _parse_bool),
    Setting("rate_limit_per_minute", 30, "Messages one client address may send a minute (chat, /chat and /v1 "
            "together); 0 turns the limit off.", int),
    Setting("max_streams_per_client", 8, "Answers one client address may have streaming at once; 0 turns the "
            "limit off.", int),
    Setting("queue_max_size", 256, "Chat requests the web server holds at once; more are told to retry.", int),
    Setting("max_request_kib", 1024, "Largest request body the server reads, in KiB; larger ones get 413 before "
            "any work.", int),
    Setting("max_upload_mib", 1, "Largest file an operator may upload to the console (template files), in MiB; "
            "the chat accepts no uploads at all.", int),
    Setting("trusted_proxies", "", "Comma-separated addresses or networks of the reverse proxies in front of the "
            "server (e.g. 127.0.0.1 or 10.0.0.0/8). Only from them are the X-Forwarded-For address and the tenant "
            "header believed; empty: none, the connecting address is the client."),
    Setting("forwarded_for_header", "x-forwarded-for", "Header in which a trusted proxy names the client's "
            "address."),
    Setting("tenant_header", "", "HTTP header in which a trusted proxy names the tenant; each tenant gets its own "
            "cache_salt, so no tenant can see from timing what another has cached. Sent by anyone else, it is "
            "refused. Empty: one tenant."),
    Setting("family_shards", 1, "Routing keys per template family (family:0 … family:k-1): 1 keeps a family on "
            "one replica; more spread a hot family over several (remote engine).", int),
    Setting("warm_on_start", True, "Warm every published template before /healthz reports ready, so the first "
            "customer already hits the cache.", _parse_bool),
    # Cache view
    Setting("kv_events", True, "Mirror vLLM's KV-cache events so the console shows which templates are cached.",
            _parse_bool),
    Setting("kv_events_endpoint", "", "ZMQ endpoint vLLM publishes KV-cache events on; empty picks a private "
            "ipc socket in the temp folder.", str),
    Setting("sample_interval_s", 2.0, "Seconds between the cache samples kept for the console's plots.", float),
    Setting("sample_retention_h", 168, "Hours of cache samples kept in the database; older ones are deleted.", int),
    Setting("keep_warm_interval_s", 30.0, "Seconds between re-sends of pinned templates' prefixes, which keep "
            "them cached; 0 turns keep-warm off.", float),
    # Admin console
    Setting("admin_user", "admin", "Operator account that PREFIXDESK_ADMIN_PASSWORD creates for the console at /admin."),
    Setting("admin_password", "", "Password of PREFIXDESK_ADMIN_USER; empty creates no account (the console stays "
            "closed until one exists, e.g. from `python -m admin create-user NAME`). A weak one refuses to start."),
    Setting("admin_demo", False, "Demo mode: accept a weak admin password; the console shows a warning.", _parse_bool),
    Setting("admin_session_ttl_s", 28800, "Seconds a console login lasts before the operator must log in again.", int),
    Setting("admin_login_attempts", 5, "Failed console logins from one client address before each further try must "
            "wait 1 s, then 2, 4, … up to 5 minutes (per address, so no one can lock an operator out).", int),
)

# Refused as an admin password unless admin_demo is on: anyone would guess them.
WEAK_PASSWORDS = frozenset({"admin", "password", "changeme", "secret", "prefixdesk", "12345678", "123456789",
                            "password1", "qwertyui", "letmein1"})
MIN_PASSWORD_CHARS = 8


def password_weakness(password: str) -> str | None:
    """Why ``password`` is too weak for an operator account, or None when it is acceptable."""
    if len(password) < MIN_PASSWORD_CHARS:
        return f"it has {len(password)} characters; use at least {MIN_PASSWORD_CHARS}"
    if password.lower() in WEAK_PASSWORDS:
        return "it is a well-known placeholder password"
    return None


@dataclass(frozen=True)
class Settings:
    host: str
    port: int
    web_processes: int
    data_dir: Path
    database_url: str
    templates_dir: Path
    ui_language: str
    model: str
    engine: str
    engine_url: str
    engine_connect_timeout_s: float
    replica_urls: str
    replica_kv_events: str
    engine_stall_timeout_s: float
    tokenizer: str
    dtype: str
    quantization: str
    trust_remote_code: bool
    load_format: str
    tensor_parallel_size: int
    gpu_memory_utilization: float
    max_model_len: int
    block_size: int
    kv_cache_mib: int
    kv_cache_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool | None  # None: true on CPU, false on GPU
    cascade_attention: bool
    prefix_caching: bool
    cuda_graph_max_batch: int
    stream_interval: int
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    ignore_eos: bool
    max_concurrent_requests: int
    drop_oldest_turns: bool
    rate_limit_per_minute: int
    max_streams_per_client: int
    queue_max_size: int
    max_request_kib: int
    max_upload_mib: int
    trusted_proxies: str
    forwarded_for_header: str
    tenant_header: str
    family_shards: int
    warm_on_start: bool
    kv_events: bool
    kv_events_endpoint: str
    sample_interval_s: float
    sample_retention_h: int
    keep_warm_interval_s: float
    admin_user: str
    admin_password: str = dataclasses.field(repr=False)
    admin_demo: bool
    admin_session_ttl_s: int
    admin_login_attempts: int

    @property
    def uses_demo_model(self) -> bool:
        return not self.model

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated again."""
        return _validated(dataclasses.replace(self, **changes))


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the Settings from ``environ`` (default: the process environment) and ``overrides``.

    Raises SettingsError naming the environment variable of the first bad value.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.name in overrides:
            values[setting.name] = overrides.pop(setting.name)
        elif setting.env in environ:
            try:
                values[setting.name] = setting.parse(environ[setting.env])
            except ValueError as exc:
                raise SettingsError(f"{setting.env}: {exc}. {setting.help}") from None
        else:
            values[setting.name] = setting.default
    if overrides:
        raise TypeError(f"unknown settings: {', '.join(sorted(overrides))}")
    values["data_dir"] = Path(values["data_dir"])
    values["templates_dir"] = Path(values["templates_dir"])
    if not values["database_url"]:
        values["database_url"] = f"sqlite:///{values['data_dir'] / 'prefixdesk.db'}"
    return _validated(Settings(**values))


def _validated(settings: Settings) -> Settings:
    def fail(name: str, problem: str) -> None:
        setting = next(s for s in SETTINGS if s.name == name)
        raise SettingsError(f"{setting.env} {problem}. {setting.help}")

    if not 0 < settings.port < 65536:
        fail("port", f"must be between 1 and 65535, not {settings.port}")
    if not 1 <= settings.web_processes <= 64:
        fail("web_processes", f"must be between 1 and 64, not {settings.web_processes}")
    if settings.web_processes > 1 and settings.engine != "remote":
        fail("web_processes", "above 1 needs PREFIXDESK_ENGINE=remote: each process would start an engine of its own")
    if settings.ui_language not in ("zh", "en"):
        fail("ui_language", f"must be zh or en, not {settings.ui_language!r}")
    if settings.tensor_parallel_size < 1:
        fail("tensor_parallel_size", "must be at least 1")
    if not 0 < settings.gpu_memory_utilization <= 1:
        fail("gpu_memory_utilization", "must be in (0, 1]")
    if settings.max_model_len < 256:
        fail("max_model_len", f"must be at least 256 tokens, not {settings.max_model_len}")
    if settings.block_size < 0 or settings.block_size % 16:
        fail("block_size", f"must be 0 or a multiple of 16 (32 on CPU), not {settings.block_size}")
    if settings.kv_cache_dtype not in ("", "auto") and not settings.kv_cache_dtype.startswith("fp8"):
        fail("kv_cache_dtype", f"must be empty, auto or an fp8 type, not {settings.kv_cache_dtype!r}")
    if settings.quantization and settings.quantization not in QUANTIZATIONS:
        fail("quantization", f"must be empty or one of {', '.join(QUANTIZATIONS)}, not {settings.quantization!r}")
    if settings.cuda_graph_max_batch < 0:
        fail("cuda_graph_max_batch", "must be 0 or more")
    if settings.stream_interval < 1:
        fail("stream_interval", "must be at least 1")
    if settings.kv_cache_mib < 1:
        fail("kv_cache_mib", "must be at least 1")
    if settings.max_tokens < 1 or settings.max_tokens >= settings.max_model_len:
        fail("max_tokens", f"must be between 1 and max_model_len - 1 ({settings.max_model_len - 1})")
    if not 0 <= settings.temperature <= 2:
        fail("temperature", "must be between 0 and 2")
    if not 0 < settings.top_p <= 1:
        fail("top_p", "must be in (0, 1]")
    if settings.rate_limit_per_minute < 0:
        fail("rate_limit_per_minute", "must be 0 (off) or more")
    if settings.max_streams_per_client < 0:
        fail("max_streams_per_client", "must be 0 (off) or more")
    if settings.max_request_kib < 64:
        fail("max_request_kib", f"must be at least 64, not {settings.max_request_kib}")
    if settings.max_upload_mib < 1:
        fail("max_upload_mib", f"must be at least 1, not {settings.max_upload_mib}")
    try:
        from app.clients import parse_networks

        parse_networks(settings.trusted_proxies)
    except ValueError as exc:
        fail("trusted_proxies", f"is invalid: {exc}")
    if settings.tenant_header and not settings.trusted_proxies:
        fail("tenant_header", "needs PREFIXDESK_TRUSTED_PROXIES: only a proxy may name the tenant")
    if not 1 <= settings.family_shards <= 64:
        fail("family_shards", f"must be between 1 and 64, not {settings.family_shards}")
    if settings.queue_max_size < 1:
        fail("queue_max_size", "must be at least 1")
    if settings.max_concurrent_requests < 0:
        fail("max_concurrent_requests", "must be 0 (twice max_num_seqs) or more")
    if settings.sample_interval_s < 0.1:
        fail("sample_interval_s", f"must be at least 0.1 seconds, not {settings.sample_interval_s}")
    if settings.keep_warm_interval_s < 0:
        fail("keep_warm_interval_s", "must be 0 (off) or more")
    if settings.sample_retention_h < 1:
        fail("sample_retention_h", "must be at least 1 hour")
    if settings.kv_events_endpoint and not settings.kv_events_endpoint.startswith(("tcp://", "ipc://")):
        fail("kv_events_endpoint", f"must start with tcp:// or ipc://, not {settings.kv_events_endpoint!r}")
    if settings.admin_session_ttl_s < 1:
        fail("admin_session_ttl_s", "must be at least 1")
    if settings.admin_login_attempts < 1:
        fail("admin_login_attempts", "must be at least 1")
    if not settings.admin_user.strip():
        fail("admin_user", "must not be empty")
    weakness = password_weakness(settings.admin_password) if settings.admin_password else None
    if weakness and not settings.admin_demo:
        fail("admin_password", f"is too weak ({weakness}); choose a stronger one, or set PREFIXDESK_ADMIN_DEMO=true "
             "for a demo that nobody else can reach")
    if settings.engine not in ("local", "remote"):
        fail("engine", f"must be local or remote, not {settings.engine!r}")
    if settings.engine == "remote" and not settings.engine_url.startswith(("http://", "https://")):
        fail("engine_url", f"must be an http(s) URL when PREFIXDESK_ENGINE=remote, not {settings.engine_url!r}")
    if settings.engine_connect_timeout_s < 1:
        fail("engine_connect_timeout_s", f"must be at least 1 second, not {settings.engine_connect_timeout_s}")
    bad = [u for u in (x.strip() for x in settings.replica_urls.split(",")) if u and not u.startswith(("http://", "https://"))]
    if bad:
        fail("replica_urls", f"must be http(s) URLs, not {bad[0]!r}")
    if settings.replica_kv_events:
        from app.engine.replicas import kv_event_sources

        try:
            kv_event_sources(settings.replica_kv_events)
        except ValueError as exc:
            fail("replica_kv_events", f"is invalid: {exc}")
    if settings.engine_stall_timeout_s < 1:
        fail("engine_stall_timeout_s", f"must be at least 1 second, not {settings.engine_stall_timeout_s}")
    if (settings.model and settings.model not in ALIASES and not _looks_like_hub_id(settings.model)
            and not Path(settings.model).exists()):
        fail("model", f"points to {settings.model!r}, which does not exist; give a local model folder or a hub id")
    return settings


def _looks_like_hub_id(model: str) -> bool:
    # "org/name" with no leading ./ or / is a hub id; anything else is a path.
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "/", "~"))


def help_text() -> str:
    """Every setting with its variable, default and help, as ``python -m app --help`` prints it."""
    lines = ["prefixdesk settings (environment variables):", ""]
    for s in SETTINGS:
        lines.append(f"  {s.env} (default {s.default!r})")
        lines.append(f"      {s.help}")
    return "\n".join(lines)


def markdown_table() -> str:
    """README's settings table, generated from ``SETTINGS`` (tests/test_docs.py keeps the two equal)."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for s in SETTINGS:
        default = s.default
        shown = "(empty)" if default in ("", None) else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        rows.append(f"| `{s.env}` | {shown} | {s.help} |")
    return "\n".join(rows)
