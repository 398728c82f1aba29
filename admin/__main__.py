"""``python -m admin``: operator accounts and exports, without starting the engine.

    python -m admin create-user NAME        # asks for the password (or reads PASSWORD from stdin)
    python -m admin set-password NAME
    python -m admin disable-user NAME
    python -m admin list-users
    python -m admin export-templates DIR    # the templates/ file format, current versions
    python -m admin export-table TABLE [--format csv|json]   # any table, e.g. audit or messages
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from admin import operators
    from app.db import open_database
    from app.db import templates as db_templates
    from app.settings import SettingsError, load_settings

    parser = argparse.ArgumentParser(prog="python -m admin", description="prefixdesk operator tools")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("create-user", "set-password", "disable-user"):
        sub.add_parser(name).add_argument("name")
    sub.add_parser("list-users")
    sub.add_parser("export-templates").add_argument("folder", type=Path)
    export = sub.add_parser("export-table")
    export.add_argument("table")
    export.add_argument("--format", choices=("csv", "json"), default="csv")
    args = parser.parse_args(argv)

    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"python -m admin: {exc}", file=sys.stderr)
        return 2
    db = open_database(settings.database_url)
    try:
        if args.command in ("create-user", "set-password"):
            password = _read_password()
            if args.command == "create-user":
                operators.create(db, name=args.name, password=password)
            else:
                operators.set_password(db, name=args.name, password=password)
            print(f"operator {args.name!r} can now log in at /admin")
        elif args.command == "disable-user":
            operators.disable(db, name=args.name)
            print(f"operator {args.name!r} is disabled")
        elif args.command == "list-users":
            for o in operators.list_all(db):
                print(f"{o.name}\t{o.source}\t{o.created_at:%Y-%m-%d %H:%M}\t{'disabled' if o.disabled else 'active'}")
        elif args.command == "export-templates":
            args.folder.mkdir(parents=True, exist_ok=True)
            for file_name, content in db.run(db_templates.export_files):
                (args.folder / file_name).write_text(content, encoding="utf-8")
                print(args.folder / file_name)
        elif args.command == "export-table":
            _export_table(settings.database_url, args.table, args.format)
    except (ValueError, LookupError) as exc:
        print(f"python -m admin: {exc}", file=sys.stderr)
        return 1
    finally:
        db.close()
    return 0


def _read_password() -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\n")
    password = getpass.getpass("password: ")
    if getpass.getpass("again: ") != password:
        raise ValueError("the two passwords differ; nothing was changed")
    return password


def _export_table(database_url: str, table: str, fmt: str) -> None:
    import csv
    import json

    import sqlite_utils

    if not database_url.startswith("sqlite:///"):
        raise ValueError("export-table reads SQLite databases only")
    db = sqlite_utils.Database(database_url.removeprefix("sqlite:///"))
    private = ("operators", "admin_sessions", "alembic_version")
    if table in private or table not in db.table_names():
        names = [t for t in db.table_names() if t not in private]
        raise LookupError(f"no exportable table {table!r}; choose one of: {', '.join(names)}")
    rows = list(db[table].rows)
    if fmt == "json":
        json.dump(rows, sys.stdout, ensure_ascii=False, indent=2, default=str)
        print()
    else:
        writer = csv.DictWriter(sys.stdout, fieldnames=db[table].columns_dict)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
