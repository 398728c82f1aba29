"""The README documents every setting exactly as the code declares it, and the two set-up commands."""

from pathlib import Path

from app.settings import markdown_table

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_the_readme_settings_table_is_exactly_the_generated_one():
    start = README.index("| variable | default | what it does |")
    table = README[start:README.index("\n\n", start)]
    assert table == markdown_table(), "regenerate README's table: python -c 'from app.settings import markdown_table; print(markdown_table())'"


def test_the_readme_starts_with_the_two_setup_commands():
    setup = README.split("## Set-up", 1)[1].split("##", 1)[0]
    assert "make run" in setup and "make test" in setup
