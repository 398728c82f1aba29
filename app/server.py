"""Composes the process: settings → store → engine → desk → one FastAPI app with the Gradio UIs.

Start-up order matters: the database and templates are checked before the (slow) engine starts,
and every template must fit the model's context, so a bad setting fails fast with its name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import gradio as gr
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from app.chat import build_chat
from app.desk import Desk
from app.engine import Engine, build_engine
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
    """Open the store (seeding templates), start the engine, and check the templates fit it."""
    store = open_store(settings.database_url)
    added = store.seed_templates(settings.templates_dir)
    if added:
        log.info("seeded %d templates from %s", added, settings.templates_dir)
    engine = engine or build_engine(settings)
    prompts = PromptBuilder(
        settings.tokenizer or engine.info.model,
        max_model_len=engine.info.max_model_len,
        max_tokens=settings.max_tokens,
        drop_oldest_turns=settings.drop_oldest_turns,
        trust_remote_code=settings.trust_remote_code,
    )
    _check_templates_fit(store, prompts, settings)
    return Services(settings, store, engine, prompts, Desk(store=store, engine=engine, prompts=prompts))


def create_app(services: Services) -> FastAPI:
    app = FastAPI(title="prefixdesk", docs_url=None, redoc_url=None)

    @app.get("/healthz")
    async def healthz():
        ok = await services.engine.check_health()
        info = services.engine.info
        body = {"ok": ok, "model": info.model, "demo_model": info.is_demo_model, "block_size": info.block_size,
                "num_blocks": info.num_blocks}
        return JSONResponse(body, status_code=200 if ok else 503)

    from app.openai_api import build_openai_router

    app.include_router(build_openai_router(services.desk))  # /v1: OpenAI-compatible chat on the templates
    chat = build_chat(services.desk, services.engine.info, language=services.settings.ui_language)
    chat.queue(default_concurrency_limit=None)
    return gr.mount_gradio_app(app, chat, path="", footer_links=[])


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
