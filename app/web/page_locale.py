"""Gradio's own words on the chat page and the console in the server's language (``PREFIXDESK_UI_LANGUAGE``),
whatever the browser's.

Gradio's frontend picks the words of its buttons and messages ("Copy message", "Clear", "Loading", a table's
"Search"…) by the browser's language, once, as its page starts: a zh console opened in an English browser spoke
English around its Chinese labels, and an English one Chinese in a Chinese browser. Each page now tells Gradio its
language before Gradio's script runs: a script placed first in the page's ``<head>`` (Gradio's page template,
given one line more) gives ``navigator.language`` the page's locale, so Gradio picks it and sets ``<html lang>`` to
it. Gradio's own Chinese lacks some of its keys (``GRADIO_ZH_CN_MISSING``, its English keys it has no Chinese for);
those come with the page's translations (``translations``).
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import jinja2
from markupsafe import Markup

from app.web.gradio_state import set_in_config

# The locale of Gradio's words for each UI language.
LOCALES = {"zh": "zh-CN", "en": "en"}
# Gradio's English keys that its zh-CN file has no words for, in Chinese (tests/web/test_page_locale.py holds them
# to Gradio's bundled files).
GRADIO_ZH_CN_MISSING: dict[str, str] = json.loads(
    (Path(__file__).with_name("static") / "gradio_zh_cn.json").read_text(encoding="utf-8"))
CONFIG_KEY = "pd_locale"  # the page's locale, in its Gradio config
TEMPLATE = "frontend/index.html"  # the page Gradio serves (share.html only for share links, which are off)
SCRIPT = ("(()=>{{const l={locale};const d=(k,v)=>Object.defineProperty(navigator,k,{{get:()=>v,configurable:true}});"
          "d('language',l);d('languages',Object.freeze([l]));}})();")


def translations(language: str, own: dict[str, dict[str, str]] | None = None) -> gr.I18n:
    """The page's ``gr.I18n``: ``own`` (the page's own words for some of Gradio's keys, by locale) over the
    Chinese Gradio lacks, under the page's locale. (Gradio starts its words from the page's translations only when
    it has some: the English page names its locale with none of its own.)"""
    locale = LOCALES[language]
    words = {loc: dict(w) for loc, w in (own or {}).items()}
    base = GRADIO_ZH_CN_MISSING if locale == "zh-CN" else {}
    words[locale] = {**base, **words.get(locale, {})}
    return gr.I18n(**words)


def speak(blocks: gr.Blocks, language: str) -> None:
    """``blocks``' page starts in ``language``'s locale (call before mounting). The page template is given the
    script once per process."""
    _install()
    set_in_config(blocks, **{CONFIG_KEY: LOCALES[language]})


def locale_script(config: object) -> Markup:
    """The first script of a page whose config names its locale (nothing for any other page)."""
    locale = config.get(CONFIG_KEY) if isinstance(config, dict) else None
    if locale not in LOCALES.values():
        return Markup("")
    return Markup(f"<script>{SCRIPT.format(locale=json.dumps(locale))}</script>")


class _FirstInHead(jinja2.BaseLoader):
    """Gradio's templates, with the locale script first in its page's ``<head>``."""

    def __init__(self, loader: jinja2.BaseLoader):
        self.loader = loader

    def get_source(self, environment, template):
        source, filename, uptodate = self.loader.get_source(environment, template)
        if template == TEMPLATE:
            source = source.replace("<head>", "<head>{{ pd_locale_script(config) }}", 1)
        return source, filename, uptodate


def _install() -> None:
    from gradio.routes import templates

    env = templates.env
    if isinstance(env.loader, _FirstInHead):
        return
    source, _, _ = env.loader.get_source(env, TEMPLATE)
    if "<head>" not in source:  # a Gradio whose page this cannot place the script in: say so at start
        raise RuntimeError(f"Gradio's {TEMPLATE} has no <head>: the page's locale cannot be set")
    env.loader = _FirstInHead(env.loader)
    env.globals["pd_locale_script"] = locale_script
    if env.cache is not None:  # a page rendered before this
        env.cache.clear()
