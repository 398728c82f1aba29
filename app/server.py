"""Composes the process: settings → store → engine → desk → one FastAPI app with the Gradio UIs.

Start-up order matters: the database and templates are checked before the (slow) engine starts,
and every template must fit the model's context, so a bad setting fails fast with its name.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import gradio as gr
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from app.chat import build_chat
from app.desk import Desk
from app.engine import Engine, build_engine, resolve_model_path
from app.prompts import PromptBuilder, system_text
from app.settings import Settings, SettingsError
from app.store import Store, open_store

log = logging.getLogger(__name__)


@dataclass
class Services:
    """The process-wide singletons, built once and handed to the UIs."""

    settings: Settings
    store: Store
    engine: Engine
    prompts: PromptBuilder
    desk: Desk

    def close(self) -> None:
        self.engine.shutdown()
        self.store.close()


def build_services(settings: Settings, *, engine: Engine | None = None) -> Services:
    """Open the store (seeding templates), check the templates fit the context, start the engine.

    The templates are checked with the tokenizer alone, before the (slow) engine starts.
    """
    store = open_store(settings.database_url)
    added = store.seed_templates(settings.templates_dir)
    if added:
        log.info("seeded %d templates from %s", added, settings.templates_dir)
    model = engine.info.model if engine else resolve_model_path(settings)
    prompts = PromptBuilder(
        settings.tokenizer or model,
        max_model_len=settings.max_model_len,
        max_tokens=settings.max_tokens,
        drop_oldest_turns=settings.drop_oldest_turns,
        trust_remote_code=settings.trust_remote_code,
    )
    _check_templates_fit(store, prompts, settings)
    engine = engine or build_engine(settings, model)
    desk = Desk(store=store, engine=engine, prompts=prompts, rate_limit_per_minute=settings.rate_limit_per_minute,
                salt_secret=_browser_secret(settings))
    return Services(settings, store, engine, prompts, desk)


def create_app(services: Services) -> FastAPI:
    app = FastAPI(title="prefixdesk", docs_url=None, redoc_url=None)
    _run_cache_background(app, services)  # cache sampler and keep-warm loop, while the server runs

    @app.get("/healthz")
    async def healthz():
        health = await services.engine.health()
        info = services.engine.info
        body = {"ok": health.ok, "reason": health.reason, "model": info.model, "demo_model": info.is_demo_model, "block_size": info.block_size,
                "num_blocks": info.num_blocks, "restarts": services.engine.restarts,
                "restarting": services.engine.restarting}
        return JSONResponse(body, status_code=200 if health.ok else 503)

    from app.openai_api import build_openai_router

    app.include_router(build_openai_router(services.desk, tenant_header=services.settings.tenant_header))
    from admin.console import build_console  # app/ imports admin/ only here, to mount the console
    from admin.ui import mount_admin

    mount_admin(app, build_console(services))  # /admin, before the chat takes "/"
    chat = build_chat(services.desk, services.engine.info, language=services.settings.ui_language,
                      browser_secret=_browser_secret(services.settings), tenant_header=services.settings.tenant_header)
    chat.queue(default_concurrency_limit=None, max_size=services.settings.queue_max_size)
    return gr.mount_gradio_app(app, chat, path="", footer_links=[])


def serve(services: Services, app: FastAPI) -> None:
    """Run the web server until SIGINT/SIGTERM, then stop in-flight answers and close cleanly.

    On a signal every answer in progress is aborted in vLLM first, so each is stored as
    ``stopped`` with its partial text; then the server stops and the engine shuts down.
    """
    import asyncio
    import signal

    import uvicorn

    class _Server(uvicorn.Server):
        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            pass

        @contextlib.contextmanager
        def capture_signals(self):  # uvicorn >= 0.29 re-raises the signal after shutdown; we exit 0
            yield

    settings = services.settings
    # Open browser streams would hold a graceful shutdown forever; after 5 s they are cancelled.
    server = _Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                    timeout_graceful_shutdown=5))

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
        await server.serve()

    try:
        asyncio.run(main())
    finally:
        services.close()


def _browser_secret(settings: Settings) -> str:
    """A random key kept in data_dir, so browsers keep their conversations across restarts."""
    import secrets

    path = settings.data_dir / "browser-state.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()


def _check_templates_fit(store: Store, prompts: PromptBuilder, settings: Settings) -> None:
    limit = prompts.max_model_len - settings.max_tokens
    for template in store.published_templates():
        n = len(prompts.prefix_ids(system_text(template.chain)))
        if n > limit:
            raise SettingsError(
                f"PREFIXDESK_MAX_MODEL_LEN is {prompts.max_model_len}, but template {template.name!r} alone is "
                f"{n} tokens and answers need {settings.max_tokens} more; raise PREFIXDESK_MAX_MODEL_LEN "
                f"or lower PREFIXDESK_MAX_TOKENS"
            )


def _run_cache_background(app: FastAPI, services: Services) -> None:
    from contextlib import asynccontextmanager

    from admin.cache_view import cache_background

    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        async with cache_background(settings=services.settings, engine=services.engine, store=services.store,
                                    desk=services.desk), inner(a) as state:
            yield state

    app.router.lifespan_context = lifespan
