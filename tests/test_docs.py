"""The README documents every setting and the two set-up commands."""

import re
from pathlib import Path

import pytest

from app.settings import SETTINGS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
DOCUMENTED = dict(re.findall(r"^\| `(PREFIXDESK_[A-Z0-9_]+)` \| ([^|]+) \|", README, flags=re.M))


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.env)
def test_every_setting_is_in_the_readme_table_with_its_default(setting):
    assert setting.env in DOCUMENTED, f"{setting.env} is missing from README.md's settings table"
    default = setting.default
    shown = "(empty)" if default in ("", None) else f"`{str(default).lower() if isinstance(default, bool) else default}`"
    assert DOCUMENTED[setting.env].strip() == shown


def test_the_readme_table_lists_no_setting_that_does_not_exist():
    assert set(DOCUMENTED) == {s.env for s in SETTINGS}


def test_the_readme_starts_with_the_two_setup_commands():
    setup = README.split("## Set-up", 1)[1].split("##", 1)[0]
    assert "make run" in setup and "make test" in setup
