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
    from app.log_text import OneLineFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"prefixdesk: cannot start: {exc}", file=sys.stderr)
        return 2

    if settings.web_processes != 1 and "--worker" not in argv:
        from app.cluster.spec import count_gpus
        from app.cluster.tier import processes_for, supervise

        if processes_for(settings, gpu_count=count_gpus(), cpus=os.cpu_count() or 1) > 1:
            return supervise(settings, worker_args=tuple(a for a in argv if a == "--api-only"))

    from app.engine import EngineStartError
    from app.engine.models.aliases import ModelNotPrepared
    from app.web.connections import raise_file_limit, total_connections
    from app.server import build_services, create_api_app, create_app, serve

    try:
        total_connections(settings, raise_file_limit())  # before the engine's slow start
        services = build_services(settings)
    except (SettingsError, EngineStartError, ModelNotPrepared) as exc:
        print(f"prefixdesk: cannot start: {exc}", file=sys.stderr)
        return 2
    app = create_api_app(services) if "--api-only" in argv else create_app(services)
    info = services.engine.info
    print(f"prefixdesk: serving on http://{settings.host}:{settings.port} — {info.model}"
          + (f" ({info.precision})" if info.precision else ""), flush=True)
    serve(services, app)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    sys.exit(main(sys.argv[1:]))
