"""What the console works with, built once from the app's services and handed to every tab."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from admin.access import AdminAccess
from admin.exports import ExportFiles
from admin.i18n import TEXT
from admin.templates import PrefixMeter, Templates
from app.core.catalog import TemplateCatalog
from app.core.desk import Desk
from app.core.warmup import probe_token
from app.db import Database
from app.engine import Engine
from app.settings import Settings


@dataclass(frozen=True)
class AdminContext:
    settings: Settings
    db: Database
    engine: Engine
    desk: Desk
    catalog: TemplateCatalog
    meter: PrefixMeter
    templates: Templates
    access: AdminAccess
    probe_id: int  # the token a warmup sends after a prefix (see app/core/warmup.py)
    exports: ExportFiles  # exported transcripts, removed after EXPORT_TTL_S and at shutdown

    @property
    def language(self) -> str:
        return self.settings.ui_language

    @property
    def text(self) -> dict[str, str]:
        return TEXT[self.settings.ui_language]


def build_admin_context(*, settings: Settings, db: Database, engine: Engine, desk: Desk, catalog: TemplateCatalog,
                  access: AdminAccess, exports: ExportFiles | None = None) -> AdminContext:
    """``exports``: where exported transcripts go (the server's: inside the console's own folder, removed at
    shutdown); None puts each in a private folder of its own in the temp folder, removed after its time."""
    prompts = desk.prompts
    meter = PrefixMeter(prompts, engine.info.block_size, prompts.max_model_len, settings.max_tokens)
    exports = exports or ExportFiles(Path(tempfile.gettempdir()))
    return AdminContext(settings=settings, db=db, engine=engine, desk=desk, catalog=catalog, meter=meter,
                   templates=Templates(db, meter, catalog), access=access, probe_id=probe_token(prompts.tokenizer),
                   exports=exports)
