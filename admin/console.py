"""What the console needs, built once from the app's Services: the prefix meter and the operators."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from admin import auth
from admin.templates import PrefixMeter


@dataclass
class Console:
    services: object  # app.server.Services (not imported: app.server imports this module)
    meter: PrefixMeter
    demo: bool  # PREFIXDESK_ADMIN_DEMO: a weak password was accepted, the page says so
    throttle: auth.LoginThrottle = field(default_factory=lambda: auth.LoginThrottle(5))
    sessions: auth.SessionClock = field(default_factory=lambda: auth.SessionClock(28800))

    @property
    def store(self):
        return self.services.store

    @property
    def engine(self):
        return self.services.engine

    def operator(self, name: str | None, token: str | None = None) -> str:
        """The caller's operator name; raises auth.NotAuthorized (also for an expired login)."""
        name = auth.require_operator(store=self.store, name=name)
        self.sessions.check(token)
        return name

    def check_login(self, name: str, password: str) -> bool:
        if self.throttle.locked(name):
            logging.getLogger(__name__).warning("console login of %r refused: too many failed attempts", name)
            return False
        ok = auth.check_login(store=self.store, name=name, password=password)
        if not ok:
            self.throttle.record_failure(name)
        return ok


def build_console(services) -> Console:
    """Sync the settings' operator account and set up the console's parts (nothing starts yet)."""
    settings = services.settings
    auth.sync_settings_operator(store=services.store, settings=settings)
    meter = PrefixMeter(services.prompts, services.engine.info.block_size, services.prompts.max_model_len,
                        settings.max_tokens)
    return Console(services=services, meter=meter, demo=settings.admin_demo,
                   throttle=auth.LoginThrottle(settings.admin_login_attempts),
                   sessions=auth.SessionClock(settings.admin_session_ttl_s))
