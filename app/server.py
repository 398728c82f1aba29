"""The composition root, the only module that imports admin: settings → database → template catalog →
engine → desk → one FastAPI app with the chat at /, the console at /admin and the OpenAI-compatible API at /v1.

Start-up order matters: the database and templates are checked before the (slow) engine starts,
and every template must fit the model's context, so a bad setting fails fast with its name. Until
every published template is warm, /healthz answers 503 "warming", so a load balancer sends the
first customer to a server whose cache already holds the templates; a warm-up that failed is tried
again, and /healthz says so (never "ready") until one succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from app import template_files
from app.core.callers import ProxyTrust
from app.core.catalog import TemplateCatalog
from app.core.desk import Desk
from app.core.limits import ClientLimiter, FeedbackLimiter
from app.core.metrics import DeskMetrics
from app.core.prompts import PromptBuilder, system_text
from app.core.session_keys import SessionKeys
from app.db import Database, open_database
from app.db import templates as db_templates
from app.db.person_queue import PersonCaps
from app.engine import Engine, build_engine, resolve_model_path, resolve_tokenizer
from app.log_text import RateLimitedLog
from app.settings import Settings, SettingsError
from app.web.connections import ConnectionLimits, guarded_protocol, raise_file_limit, total_connections
from app.web.guards import SECURITY_HEADERS, EventTriggers, GradioRoutes, RequestGuard
from app.web.metrics_route import build_metrics_router
from app.web.openai_api import build_openai_router

if TYPE_CHECKING:
    import gradio as gr

    from admin.access import Clock

log = logging.getLogger(__name__)

CHAT_PROGRESS_POLL_S = 1.0  # the chat reports no gr.Progress: the queue's progress scan can all but sleep
CONSOLE_PROGRESS_POLL_S = 0.25  # the console's publish progress bar: four updates a second
# An idle Gradio queue looks for a new event every 1 ms on Linux (its default), and so does a busy one between
# events: 1,000 wake-ups of the event loop a second for each of the chat's and the console's queues. Measured on
# an idle `python -m app` (2-core CPU machine, 30 s): 10.2% of a core at 1 ms, 4.2% at 5 ms, 2.5% at 20 ms (the
# rest is the app's own 1-2 s timers). At 5 ms a new answer starts at most 5 ms later.
QUEUE_POLL_S = 0.005
WARMUP_RETRY_S = 10.0  # between start-up warm-ups, after one failed


@dataclass
class Services:
    """The process-wide singletons, built once and handed to the UIs."""

    settings: Settings
    db: Database
    engine: Engine
    prompts: PromptBuilder
    catalog: TemplateCatalog
    desk: Desk
    trust: ProxyTrust
    ready: asyncio.Event | None = field(default=None)  # set once the templates are warm
    warmup_failed: str = ""  # why the last start-up warm-up failed, while none has succeeded

    def close(self) -> None:
        self.engine.shutdown()
        self.db.close()


def build_services(settings: Settings, *, engine: Engine | None = None) -> Services:
    """Open the database (seeding templates), check the templates fit the context, start the engine.

    The templates are checked with the tokenizer alone, before the (slow) engine starts.
    """
    db = open_database(settings.database_url)
    added = db.run(db_templates.seed, template_files.read_folder(settings.templates_dir))
    if added:
        log.info("seeded %d templates from %s", added, settings.templates_dir)
    model = engine.info.model if engine else resolve_model_path(settings)
    prompts = PromptBuilder(resolve_tokenizer(settings, model), max_model_len=settings.max_model_len,
                            max_tokens=settings.max_tokens, drop_oldest_turns=settings.drop_oldest_turns,
                            trust_remote_code=settings.trust_remote_code)
    catalog = TemplateCatalog(db, prompts)
    catalog.load()
    _check_templates_fit(catalog, prompts, settings)
    engine = engine or build_engine(settings, model)
    limiter = ClientLimiter(per_minute=settings.rate_limit_per_minute, concurrent=settings.max_streams_per_client,
                            per_address_per_minute=settings.rate_limit_per_address_per_minute,
                            per_address_concurrent=settings.max_streams_per_address)
    desk = Desk(db=db, catalog=catalog, engine=engine, prompts=prompts, limiter=limiter,
                tenant_secret=_secret(settings, "tenant-salt.key"), family_shards=settings.family_shards,
                ignore_eos=settings.ignore_eos, step_delay_ms=settings.step_delay_ms,
                metrics=DeskMetrics(multiproc_dir=settings.metrics_dir),
                person_caps=PersonCaps(per_client=settings.person_waiting_per_client,
                                       per_session=settings.person_waiting_per_session,
                                       total=settings.person_waiting_max),
                feedback=FeedbackLimiter(per_client=settings.feedback_per_client,
                                         per_session=settings.feedback_per_session))
    trust = ProxyTrust(settings.trusted_proxies, forwarded_header=settings.forwarded_for_header,
                       tenant_header=settings.tenant_header)
    return Services(settings, db, engine, prompts, catalog, desk, trust)


def create_app(services: Services, *, admin_clock: Clock | None = None) -> FastAPI:
    """The web app over ``services``; ``admin_clock`` is the time console sessions and login delays
    keep (tests move one by hand)."""
    # Gradio (and the console, which needs it) is imported here, not at module level, so that
    # build_services and create_api_app run where Gradio is not installed (a GPU benchmark machine).
    import gradio as gr

    from admin.access import AdminAccess
    from admin.context import build_admin_context  # the composition root mounts admin here
    from admin.exports import ExportFiles
    from admin.login import AdminGate, build_login_router
    from admin.operators import sync_settings_operator
    from admin.queue_ui import admin_js
    from admin.ui import CSS as CONSOLE_CSS
    from admin.ui import build_admin
    from app.chat.page import CSS as CHAT_CSS
    from app.chat.page import build_chat, page_js
    from app.chat.text import TEXT as CHAT_TEXT
    from app.chat.text import gradio_words, model_label
    from app.web.gradio_state import PAGE_LIFE_HEAD, end_session, keep_no_snapshots, no_heartbeat_stream
    from app.web.page_cache import PageCache
    from app.web.page_locale import speak, translations
    from app.web.sessions import SessionGuard

    settings = services.settings
    _preload_matplotlib()
    app = FastAPI(title="prefixdesk", docs_url=None, redoc_url=None, openapi_url=None)
    sync_settings_operator(services.db, settings)
    access = AdminAccess(services.db, ttl_s=settings.admin_session_ttl_s, free_attempts=settings.admin_login_attempts,
                           language=settings.ui_language, clock=admin_clock)
    admin_files = _admin_folder()
    exports = ExportFiles(admin_files, clock=admin_clock.monotonic if admin_clock else time.monotonic)
    console = build_admin_context(settings=settings, db=services.db, engine=services.engine, desk=services.desk,
                            catalog=services.catalog, access=access, exports=exports)
    _lifespan(app, services, folders=(admin_files,), on_stop=exports.close)
    _add_healthz(app, services)

    async def admin_open() -> bool:
        from app.db import operators as db_operators

        return await services.db.read(db_operators.any_active)

    app.include_router(build_openai_router(services.desk, services.trust))
    app.include_router(build_metrics_router(settings, services.desk))
    app.include_router(build_login_router(access, services.trust, admin_open=admin_open))
    mount = dict(footer_links=[], show_error=False, enable_monitoring=False, run_history=False, mcp_server=False,
                 pwa=False, ssr_mode=False, head=PAGE_LIFE_HEAD)
    blocks = build_admin(console)
    _queue(blocks, settings.queue_max_size, services.engine.info.max_concurrent_requests,
           progress_poll_s=CONSOLE_PROGRESS_POLL_S)
    no_heartbeat_stream(blocks)
    speak(blocks, settings.ui_language)
    gr.mount_gradio_app(app, blocks, path="/admin", css=CONSOLE_CSS, js=admin_js(settings.ui_language),
                        max_file_size=f"{settings.max_upload_mib}mb", i18n=translations(settings.ui_language),
                        blocked_paths=_blocked_paths(settings), **mount)
    _keep_files_in(app, "/admin", blocks, admin_files)
    chat = build_chat(services.desk, services.engine.info, language=settings.ui_language,
                      updates_per_s=settings.chat_updates_per_s,
                      browser_secret=_secret(settings, "browser-state.key"),
                      keys=SessionKeys(_secret(settings, "session-key.key")), trust=services.trust,
                      model_name=model_label(settings.model, settings.ui_language))
    _queue(chat, settings.queue_max_size, services.engine.info.max_concurrent_requests,
           progress_poll_s=CHAT_PROGRESS_POLL_S)
    no_heartbeat_stream(chat)
    # Gradio's own words on the page (its buttons' labels) in the page's language, whatever the browser's: the
    # page's own words for its chatbot's buttons, Gradio's for the rest (app/web/page_locale.py).
    speak(chat, settings.ui_language)
    gr.mount_gradio_app(app, chat, path="", css=CHAT_CSS, js=page_js(settings.ui_language), max_file_size="1kb",
                        blocked_paths=[*_blocked_paths(settings), str(admin_files)],
                        i18n=translations(settings.ui_language, gradio_words(settings.ui_language)), **mount)
    keep_no_snapshots(app, blocks)
    keep_no_snapshots(app, chat)
    for mounted in (blocks, chat):
        # Gradio checks the paths a request names against allowed/blocked paths only in launched apps;
        # mounted ones must say so, or any server file named in an event's value would be served.
        mounted.has_launched = True
    # Innermost: the page and its config as Gradio built them for the first browser, with each browser's cookies and
    # headers added by the layers around it.
    app.add_middleware(PageCache, paths=frozenset({"/", "/config"}))
    app.add_middleware(SessionGuard, trust=services.trust, text=CHAT_TEXT[settings.ui_language],
                       secret=_secret(settings, "pd-browser.key").encode(),
                       claims_per_minute=settings.session_claims_per_minute, page_gone_s=settings.page_gone_s,
                       on_gone=lambda mount, session_hash: end_session(blocks if mount else chat, session_hash))
    # Behind the gate: a stranger learns nothing of the console's routes.
    app.add_middleware(GradioRoutes, unqueued={"": _unqueued(chat), "/admin": _unqueued(blocks)},
                       inputs={"": _inputs(chat), "/admin": _inputs(blocks)},
                       triggers={"": _triggers(chat), "/admin": _triggers(blocks)},
                       streams={"": _streams(chat), "/admin": _streams(blocks)})
    app.add_middleware(AdminGate, access=access)
    app.add_middleware(RequestGuard, max_request_bytes=settings.max_request_kib << 10,
                       max_upload_bytes=settings.max_upload_mib << 20)
    return app


def _unqueued(blocks: gr.Blocks) -> frozenset[int]:
    """The fn_index of each of ``blocks``' events that runs outside the queue (``queue=False``)."""
    return frozenset(fn_id for fn_id, fn in blocks.fns.items() if not fn.queue)


def _inputs(blocks: gr.Blocks) -> dict[int, int]:
    """How many inputs each of ``blocks``' events takes, by fn_index."""
    return {fn_id: len(fn.inputs) for fn_id, fn in blocks.fns.items()}


def _triggers(blocks: gr.Blocks) -> dict[int, EventTriggers]:
    """Each of ``blocks``' events' triggers (``click``, ``select``, ``like`` …) and whether its handler reads the
    event's data, by fn_index."""
    return {fn_id: EventTriggers(frozenset(name for _, name in fn.targets), fn.collects_event_data)
            for fn_id, fn in blocks.fns.items()}


def _streams(blocks: gr.Blocks):
    """Whether a session hash has a queue stream in ``blocks`` (it joined an event): Gradio's own record of it."""
    return lambda session_hash: session_hash in blocks._queue.pending_messages_per_session


def _admin_folder() -> Path:
    """A folder of this process's console for its uploads and exports (0700), inside Gradio's upload folder:
    Gradio accepts an uploaded file in an event only from there. The chat blocks it and serves no files."""
    from gradio.utils import get_upload_folder

    root = Path(get_upload_folder())
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"prefixdesk-console-{secrets.token_hex(8)}"
    folder.mkdir(mode=0o700)
    return folder


def _keep_files_in(app: FastAPI, path: str, blocks: gr.Blocks, folder: Path) -> None:
    """Make the Gradio app mounted at ``path`` upload to, and cache its components' files in, ``folder``."""
    from starlette.routing import Mount

    [mounted] = [r.app for r in app.routes if isinstance(r, Mount) and r.path == path]
    mounted.uploaded_file_dir = str(folder)
    blocks.GRADIO_CACHE = str(folder)
    for block in blocks.blocks.values():
        block.GRADIO_CACHE = str(folder)


def _queue(blocks: gr.Blocks, max_size: int, at_once: int, *, progress_poll_s: float) -> None:
    """Gradio's queue, running as many events at once as the engine takes answers. Gradio runs at most
    ``max_threads`` events at once (40 unless launch() says otherwise, and a mounted app never launches),
    concurrency limits or not: on a GPU that, not the engine, capped the chat at 40 answers in flight.

    Every 10 ms the queue walks all ``max_threads`` job slots looking for gr.Progress updates, loaded or
    idle: with slots for every answer the engine takes that walk alone held the event loop most of the
    time (47% of it under a CPU load test with 100,000 slots). The chat sends no progress, and the
    console's one progress bar (publishing) needs no more than a few updates a second."""
    blocks.max_threads = max(at_once, 40)
    blocks.queue(default_concurrency_limit=None, max_size=max_size)
    queue = blocks._queue
    queue.progress_update_sleep_when_free = progress_poll_s
    queue.sleep_when_free = QUEUE_POLL_S
    # After every event the queue summarizes the last 10,000 events' analytics with pandas, on a thread of the
    # process's 40 (9 ms of GIL each on this CPU; the GPU profile's pandas frames): for its monitoring page,
    # which the app does not serve. Keep one event's record and never summarize.
    queue.ANALYTICS_MAX_EVENTS = 1
    queue.ANAYLTICS_CACHE_FREQUENCY = 2**62  # sic: Gradio's spelling


def create_api_app(services: Services) -> FastAPI:
    """Only ``/healthz`` and the OpenAI-compatible ``/v1``, with the same start-up (warmup, background
    loops) and request guard as ``create_app``, and no chat or console: ``python -m app --api-only``.

    It imports no Gradio, so it serves where Gradio is not installed (the benchmarks' GPU machine,
    whose carried files cannot hold it); the /v1 handlers are the same objects as in the full app.
    """
    settings = services.settings
    app = FastAPI(title="prefixdesk", docs_url=None, redoc_url=None, openapi_url=None)
    _lifespan(app, services, folders=())
    _add_healthz(app, services)
    app.include_router(build_openai_router(services.desk, services.trust))
    app.include_router(build_metrics_router(settings, services.desk))
    app.add_middleware(RequestGuard, max_request_bytes=settings.max_request_kib << 10,
                       max_upload_bytes=settings.max_upload_mib << 20)
    return app


def serve(services: Services, app: FastAPI) -> None:
    """Run the web server until SIGINT/SIGTERM, then stop in-flight answers and close cleanly.

    On a signal every answer in progress is aborted in the engine first, so each is stored as
    ``stopped`` with its partial text; then the server stops and the engine shuts down.
    """
    import signal

    import uvicorn

    class _Server(uvicorn.Server):
        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            pass

        @contextlib.contextmanager
        def capture_signals(self):  # uvicorn >= 0.29 re-raises the signal after shutdown; we exit 0
            yield

    server = _Server(uvicorn_config(app, services.settings))

    async def stop() -> None:
        aborted = await services.engine.abort_all()
        if aborted:
            log.info("stopping %d answers in progress", aborted)
            await asyncio.sleep(0.5)  # let each answer's handler store its partial text
        server.should_exit = True

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(stop()))
        loop.set_exception_handler(_quiet_accept_errors())
        await server.serve()

    try:
        asyncio.run(main())
    finally:
        services.close()


def uvicorn_config(app: FastAPI, settings: Settings, **overrides):
    """How uvicorn serves the app (tests serve it the same way): its HTTP protocol guarded by the connection
    limits and the arrival timeout (app/web/connections.py). Raises SettingsError when
    PREFIXDESK_MAX_CONNECTIONS does not fit the process's file limit, which it first raises to the hard one."""
    import uvicorn

    trust = ProxyTrust(settings.trusted_proxies, forwarded_header=settings.forwarded_for_header,
                       tenant_header=settings.tenant_header)
    limits = ConnectionLimits(per_client=settings.max_connections_per_client,
                              total=total_connections(settings, raise_file_limit()), trust=trust,
                              reserved_percent=settings.connections_reserved_percent,
                              per_client_when_busy=settings.max_connections_per_client_when_busy)
    # Open browser streams would hold a graceful shutdown forever; after 5 s they are cancelled.
    # Forwarded headers are judged by app/core/callers.py against PREFIXDESK_TRUSTED_PROXIES: uvicorn
    # would otherwise believe X-Forwarded-For from any local peer. No page uses a WebSocket (Gradio streams
    # over SSE), and an upgraded connection would leave the guarded protocol. uvicorn's loggers write
    # through the process's handlers (python -m app: one escaped line per record).
    # The security headers go on every response uvicorn writes: the app's, and its own 400s, 500s and 408s.
    options = dict(host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=5,
                   proxy_headers=False, server_header=False, lifespan="on", ws="none", log_config=None,
                   headers=[(name.decode(), value.decode()) for name, value in SECURITY_HEADERS],
                   http=guarded_protocol(limits, settings.request_arrival_timeout_s))
    return uvicorn.Config(app, **(options | overrides))


def _quiet_accept_errors():
    """The loop's exception handler, but one line a second (no traceback) for a failed accept(): out of
    file descriptors, asyncio's default handler writes a traceback for every connection it cannot take."""
    accept_failed = RateLimitedLog(log, level=logging.ERROR)

    def handle(loop, context) -> None:
        if context.get("message", "").startswith("socket.accept() out of system resource"):
            accept_failed("could not accept a connection: %s; lower PREFIXDESK_MAX_CONNECTIONS or raise the "
                          "file limit", context.get("exception"))
        else:
            loop.default_exception_handler(context)

    return handle


def _add_healthz(app: FastAPI, services: Services) -> None:
    @app.get("/livez")
    async def livez():
        """This process serves (whatever the engine's state: the page then tells its customers itself). The web
        tier's proxy checks it (app/cluster/tier.py); /healthz says whether answers can be had."""
        return JSONResponse({"ok": True, "process": os.getpid()})

    @app.get("/healthz")
    async def healthz():
        health = await services.engine.health()
        ready = services.ready is not None and services.ready.is_set()
        info = services.engine.info
        reason = health.reason or ("" if ready else services.warmup_failed or "warming the templates")
        body = {"ok": health.ok and ready, "ready": ready, "reason": reason, "model": info.model,
                "demo_model": info.is_demo_model, "backend": info.backend, "block_size": info.block_size,
                "num_blocks": info.num_blocks, "precision": info.precision, "restarts": services.engine.restarts,
                "restarting": services.engine.restarting,
                "process": os.getpid()}  # which web process answered (PREFIXDESK_WEB_PROCESSES above 1)
        if replicas := services.engine.replicas():
            body["replicas"] = [{"url": r.url, "up": r.up, "reason": r.reason} for r in replicas]
        return JSONResponse(body, status_code=200 if body["ok"] else 503)


def _lifespan(app: FastAPI, services: Services, *, folders: tuple[Path, ...],
              on_stop: Callable[[], None] | None = None) -> None:
    """Start-up warmup and the background loops around the app's own lifespan; at the end ``on_stop`` runs and
    ``folders`` are removed."""
    from app.core.background import background, warm_published
    from app.core.warmup import probe_token, warm_sampling

    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        services.ready = asyncio.Event()

        async def warm() -> None:
            if services.settings.warm_on_start:
                probe_id = probe_token(services.prompts.tokenizer)
                n = await warm_published(engine=services.engine, catalog=services.catalog, probe_id=probe_id,
                                         shards=services.settings.family_shards)
                ran = await warm_sampling(services.engine, probe_id=probe_id)
                log.info("warmed %d templates and the sampler (%d requests at once)", n, ran)

        async def warm_then_ready() -> None:
            # Ready means warm: a server whose warm-up failed (an engine that broke off, or was busy with
            # another server's answers) reports why and tries again, while the chat answers meanwhile.
            for attempt in itertools.count():
                try:
                    await warm()
                    break
                except Exception as exc:  # the engine's errors, or the database's; the cause goes to the log
                    services.warmup_failed = (f"the start-up warm-up failed ({type(exc).__name__}); "
                                              f"trying again every {WARMUP_RETRY_S:.0f} s")
                    log.warning("start-up warmup failed; trying again in %.0f s", WARMUP_RETRY_S,
                                exc_info=attempt == 0)
                finally:
                    if attempt == 0:
                        _freeze_heap()
                await asyncio.sleep(WARMUP_RETRY_S)
            services.warmup_failed = ""
            services.ready.set()

        warming = asyncio.create_task(warm_then_ready(), name="warm-on-start")
        try:
            async with background(settings=services.settings, engine=services.engine, db=services.db,
                                  catalog=services.catalog, tokenizer=services.prompts.tokenizer), inner(a) as state:
                yield state
        finally:
            warming.cancel()
            # Answers whose pages went away are written on by themselves (app/core/answering.py): stored as
            # stopped now, before the engine goes.
            await services.desk.stop_all()
            if on_stop is not None:
                on_stop()
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)

    app.router.lifespan_context = lifespan


def _freeze_heap() -> None:
    """Move everything alive after start-up (vLLM, torch, Gradio: millions of objects) out of the
    garbage collector's reach. A full collection over that heap pauses the whole process — every
    stream of every user — for most of a second; afterwards it only scans what requests allocate."""
    gc.collect()
    gc.freeze()


def _preload_matplotlib() -> None:
    """Gradio asks matplotlib for its backend in every event, and the first ask imports pyplot (half a
    second) on the event loop, under the first customer's answer. Import it at start-up instead."""
    try:
        import matplotlib

        matplotlib.use("agg")
        import matplotlib.pyplot  # noqa: F401
    except ImportError:  # Gradio skips matplotlib when it is not installed
        pass


def _blocked_paths(settings: Settings) -> list[str]:
    """Paths Gradio must never serve: the data dir (database, keys, models) and the code."""
    return [str(Path(settings.data_dir).resolve()), os.getcwd()]


def _secret(settings: Settings, name: str) -> str:
    """A random key kept in data_dir (0600), so it outlives restarts and is the same for every web process."""
    path = Path(settings.data_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # another web process made it first
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    for _ in range(50):
        if key := path.read_text().strip():
            return key
        time.sleep(0.01)  # the other process has created the file but not written it yet
    raise SettingsError(f"{path} is empty; delete it and start again")


def _check_templates_fit(catalog: TemplateCatalog, prompts: PromptBuilder, settings: Settings) -> None:
    limit = prompts.max_model_len - settings.max_tokens
    for template in catalog.all():
        n = len(prompts.prefix_ids(system_text(template.chain)))
        if n > limit:
            raise SettingsError(
                f"PREFIXDESK_MAX_MODEL_LEN is {prompts.max_model_len}, but template {template.name!r} alone is "
                f"{n} tokens and answers need {settings.max_tokens} more; raise PREFIXDESK_MAX_MODEL_LEN "
                f"or lower PREFIXDESK_MAX_TOKENS"
            )
