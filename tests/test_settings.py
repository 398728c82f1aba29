"""Settings: declared once, parsed by type, each check names the variable and says what to do."""

from pathlib import Path

import pytest

from app.settings import SETTINGS, Settings, SettingsError, help_text, load_settings


def test_every_field_of_settings_is_a_declared_setting_with_help():
    assert [s.name for s in SETTINGS] == list(Settings.__dataclass_fields__)
    assert all(s.help.endswith(".") for s in SETTINGS)


def test_values_are_parsed_by_their_type():
    s = load_settings(environ={"PREFIXDESK_PORT": "8080", "PREFIXDESK_TOP_P": "0.5", "PREFIXDESK_IGNORE_EOS": "yes",
                               "PREFIXDESK_ENFORCE_EAGER": "", "PREFIXDESK_DATA_DIR": "/tmp/x"})
    assert (s.port, s.top_p, s.ignore_eos, s.enforce_eager, s.data_dir) == (8080, 0.5, True, None, Path("/tmp/x"))
    assert s.database_url == "sqlite:////tmp/x/prefixdesk.db"


@pytest.mark.parametrize(("environ", "message"), [
    ({"PREFIXDESK_PORT": "70000"}, "PREFIXDESK_PORT must be between 1 and 65535, not 70000. Port of the web server"),
    ({"PREFIXDESK_PORT": "eighty"}, "PREFIXDESK_PORT: invalid literal for int() with base 10: 'eighty'. Port of"),
    ({"PREFIXDESK_IGNORE_EOS": "maybe"}, "PREFIXDESK_IGNORE_EOS: expected true/false, got 'maybe'. Answers always"),
    ({"PREFIXDESK_UI_LANGUAGE": "fr"}, "PREFIXDESK_UI_LANGUAGE must be zh or en, not 'fr'. Language of"),
    ({"PREFIXDESK_TRUSTED_PROXIES": "10.0.0.300"}, "PREFIXDESK_TRUSTED_PROXIES is invalid: '10.0.0.300' is not an IP "
                                                   "address or network (e.g. 127.0.0.1 or 10.0.0.0/8). Comma-separated"),
    ({"PREFIXDESK_RATE_LIMIT_PER_MINUTE": "-1"}, "PREFIXDESK_RATE_LIMIT_PER_MINUTE must be at least 0, not -1."),
    ({"PREFIXDESK_MAX_TOKENS": "4096"}, "PREFIXDESK_MAX_TOKENS must be between 1 and max_model_len - 1 (4095). Most"),
    ({"PREFIXDESK_WEB_PROCESSES": "65"}, "PREFIXDESK_WEB_PROCESSES must be between 0 and 64, not 65. Web processes"),
    ({"PREFIXDESK_TENANT_HEADER": "X-Tenant"}, "PREFIXDESK_TENANT_HEADER needs PREFIXDESK_TRUSTED_PROXIES: only a "
                                               "proxy may name the tenant."),
    ({"PREFIXDESK_REPLICA_KV_EVENTS": "http://a:8001"}, "PREFIXDESK_REPLICA_KV_EVENTS is invalid: 'http://a:8001' is "
                                                        "not REPLICA_URL=tcp://HOST:PORT."),
])
def test_a_bad_value_stops_with_the_variable_and_what_is_wrong(environ, message):
    with pytest.raises(SettingsError) as exc:
        load_settings(environ=environ)
    assert str(exc.value).startswith(message)


def test_help_lists_every_variable_with_its_default():
    text = help_text()
    assert "  PREFIXDESK_PORT (default 7860)\n      Port of the web server (chat at /, admin console at /admin)." in text
    assert "  PREFIXDESK_MODEL (default (empty))" in text
    assert text.count("  PREFIXDESK_") == len(SETTINGS)
