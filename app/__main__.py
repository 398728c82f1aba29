"""``python -m app``: serve the chat (/) on one shared vLLM engine. ``--help`` lists the settings.

``--api-only`` serves only /healthz and the OpenAI-compatible /v1 (no chat, no console, no Gradio
import): the web tier the GPU benchmarks run (bench/gpu.sh), or an API-only deployment.
"""

from __future__ import annotations

import logging
import os
import sys


def main(argv: list[str]) -> int:
    from app.settings import SettingsError, help_text, load_settings

    if "-h" in argv or "--help" in argv:
        print(help_text())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"prefixdesk: cannot start: {exc}", file=sys.stderr)
        return 2

    if settings.web_processes > 1 and "--worker" not in argv:
        from app.web.workers import supervise

        return supervise(settings, worker_args=[a for a in argv if a == "--api-only"])

    from app.engine import EngineStartError
    from app.engine.models.aliases import ModelNotPrepared
    from app.web.server import build_services, create_api_app, create_app, serve

    try:
        services = build_services(settings)
    except (SettingsError, EngineStartError, ModelNotPrepared) as exc:
        print(f"prefixdesk: cannot start: {exc}", file=sys.stderr)
        return 2
    app = create_api_app(services) if "--api-only" in argv else create_app(services)
    info = services.engine.info
    print(f"prefixdesk: serving on http://{settings.host}:{settings.port} — {info.model}"
          + (f" ({info.precision})" if info.precision else ""), flush=True)
    serve(services, app, reuse_port="--worker" in argv)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.exit(main(sys.argv[1:]))
