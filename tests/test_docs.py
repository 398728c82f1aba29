"""The docs say what the code is: docs/settings.md holds every setting exactly as the code declares it,
docs/architecture.md's file map names every package and module of app/ and admin/ and nothing that is not
there, the README starts with the two set-up commands, and every relative link in README.md and docs/ leads
to a file that exists."""

import re
from pathlib import Path

from app.settings import markdown_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
SETTINGS_DOC = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_settings_page_table_is_exactly_the_generated_one():
    start = SETTINGS_DOC.index("| variable | default | what it does |")
    table = SETTINGS_DOC[start:SETTINGS_DOC.index("\n\n", start)]
    assert table == markdown_table(), ("regenerate docs/settings.md's table: "
                                       "python -c 'from app.settings import markdown_table; print(markdown_table())'")


def test_the_readme_starts_with_the_two_setup_commands():
    setup = README.split("## Set-up", 1)[1].split("##", 1)[0]
    assert "make run" in setup and "make test" in setup


def _file_map() -> list[str]:
    """The paths docs/architecture.md's file map names: the first word of each line that starts one."""
    block = ARCHITECTURE.split("## The file map", 1)[1].split("```\n", 2)[1]
    return [line.split()[0] for line in block.splitlines() if line and not line[0].isspace()]


def _packages_and_modules() -> set[str]:
    """Every package (as ``folder/``) and module under app/ and admin/; migrations/ counts as one folder."""
    found = set()
    for top in ("app", "admin"):
        for path in (ROOT / top).rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative:
                found.add(relative.split("/migrations/")[0] + "/migrations/")
            elif path.name == "__init__.py":
                found.add(relative.removesuffix("__init__.py"))
            else:
                found.add(relative)
    return found


def test_every_path_the_file_map_names_exists():
    named = _file_map()
    assert [p for p in named if not (ROOT / p).exists() or p.endswith("/") != (ROOT / p).is_dir()] == []
    assert len(named) == len(set(named)), "a path is named twice"


def test_the_file_map_names_every_package_and_module_of_app_and_admin():
    assert sorted(_packages_and_modules() - set(_file_map())) == []


def test_every_relative_link_in_the_readme_and_docs_leads_to_a_file():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in MARKDOWN_LINK.findall(page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
