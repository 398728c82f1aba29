"""Operator passwords: a weak one refuses to start unless demo mode says otherwise; hashes are salted."""

import pytest

from admin.passwords import hash_password, verify_password
from app.settings import SettingsError, load_settings


@pytest.mark.parametrize("password", ["admin", "password", "changeme", "Changeme", "short7!"])
def test_a_weak_admin_password_refuses_to_start(password):
    with pytest.raises(SettingsError, match="PREFIXDESK_ADMIN_PASSWORD is too weak .* PREFIXDESK_ADMIN_DEMO=true"):
        load_settings(environ={"PREFIXDESK_ADMIN_PASSWORD": password})


def test_demo_mode_accepts_a_weak_password_and_no_password_leaves_the_console_closed():
    assert load_settings(environ={"PREFIXDESK_ADMIN_PASSWORD": "admin", "PREFIXDESK_ADMIN_DEMO": "true"}).admin_demo
    defaults = load_settings(environ={})
    assert (defaults.admin_user, defaults.admin_password, defaults.admin_demo) == ("admin", "", False)
    assert "admin_password" not in repr(defaults)


def test_passwords_are_stored_as_salted_scrypt_hashes():
    a, b = hash_password("correct horse battery"), hash_password("correct horse battery")
    assert a != b and a.startswith("scrypt$16384$8$1$")
    assert verify_password("correct horse battery", a) and not verify_password("correct horse batterY", a)
