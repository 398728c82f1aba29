"""What the console needs, built once from the app's Services: the prefix meter and the operators."""

from __future__ import annotations

from dataclasses import dataclass

from admin import auth
from admin.templates import PrefixMeter


@dataclass
class Console:
    services: object  # app.server.Services (not imported: app.server imports this module)
    meter: PrefixMeter
    demo: bool  # PREFIXDESK_ADMIN_DEMO: a weak password was accepted, the page says so

    @property
    def store(self):
        return self.services.store

    @property
    def engine(self):
        return self.services.engine

    def operator(self, name: str | None) -> str:
        """The caller's operator name; raises auth.NotAuthorized."""
        return auth.require_operator(store=self.store, name=name)

    def check_login(self, name: str, password: str) -> bool:
        return auth.check_login(store=self.store, name=name, password=password)


def build_console(services) -> Console:
    """Sync the settings' operator account and set up the console's parts (nothing starts yet)."""
    settings = services.settings
    auth.sync_settings_operator(store=services.store, settings=settings)
    meter = PrefixMeter(services.prompts, services.engine.info.block_size, services.prompts.max_model_len,
                        settings.max_tokens)
    return Console(services=services, meter=meter, demo=settings.admin_demo)
