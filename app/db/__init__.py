"""The database package: every query of the app lives in one of its modules, as a function of a
Session; ``Database`` runs them off the event loop (see core.py)."""

from app.db.core import Database, StoreError, migrate, open_database

__all__ = ["Database", "StoreError", "migrate", "open_database"]
