"""Operator accounts: created from the settings or ``python -m admin``, stored as scrypt hashes."""

from __future__ import annotations

from admin.passwords import hash_password, verify_password
from app.db import Database
from app.db import operators as db_operators
from app.db.rows import OperatorRow
from app.settings import Settings, password_weakness

class WeakPassword(ValueError):
    """The password would be easy to guess; the message says what a good one needs."""


def create(db: Database, *, name: str, password: str) -> None:
    """Add an operator; raises WeakPassword or db_operators.OperatorExists (nothing is written then)."""
    name = name.strip()
    if not name:
        raise ValueError("an operator needs a name")
    _check_strength(password)
    db.run(db_operators.add, name=name, password_hash=hash_password(password))


def set_password(db: Database, *, name: str, password: str) -> None:
    """Set (or create) ``name``'s password and enable the account; raises WeakPassword."""
    _check_strength(password)
    db.run(db_operators.set_hash, name=name, password_hash=hash_password(password))


def disable(db: Database, *, name: str) -> None:
    """Lock ``name`` out: their console sessions end at once."""
    db.run(db_operators.disable, name=name)


def list_all(db: Database) -> list[OperatorRow]:
    return db.run(db_operators.list_all)


def sync_settings_operator(db: Database, settings: Settings) -> None:
    """Make PREFIXDESK_ADMIN_USER/PASSWORD an active operator (the settings validated its strength)."""
    if not settings.admin_password:
        return
    stored = db.run(db_operators.password_hash, name=settings.admin_user)
    if stored is None or not verify_password(settings.admin_password, stored):
        db.run(db_operators.set_hash, name=settings.admin_user, password_hash=hash_password(settings.admin_password),
               source="settings")


def _check_strength(password: str) -> None:
    weakness = password_weakness(password)
    if weakness:
        raise WeakPassword(f"that password is too weak: {weakness}")
