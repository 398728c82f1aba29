"""Who a request is from: the peer address, or what a trusted proxy says — never what anyone says."""

import pytest

from app.core.callers import ProxyTrust, TenantRefused, parse_networks


def test_without_trusted_proxies_the_peer_is_the_client_and_forwarded_headers_are_ignored():
    trust = ProxyTrust("", tenant_header="x-tenant")
    caller = trust.caller("203.0.113.5", {"x-forwarded-for": "198.51.100.1"})
    assert (caller.address, caller.tenant) == ("203.0.113.5", "")
    with pytest.raises(TenantRefused, match="accepted only from the reverse proxy"):
        trust.caller("203.0.113.5", {"x-tenant": "victim"})


def test_a_trusted_proxy_names_the_client_and_the_tenant():
    trust = ProxyTrust("127.0.0.1, 10.0.0.0/8", tenant_header="x-tenant")
    caller = trust.caller("127.0.0.1", {"x-forwarded-for": "198.51.100.1", "x-tenant": "acme"})
    assert (caller.address, caller.tenant) == ("198.51.100.1", "acme")


def test_addresses_a_client_wrote_into_x_forwarded_for_are_skipped():
    trust = ProxyTrust("127.0.0.1, 10.0.0.0/8")
    # The client sent "1.2.3.4"; our proxies appended the real client, then each other.
    caller = trust.caller("127.0.0.1", {"x-forwarded-for": "1.2.3.4, 198.51.100.7, 10.1.2.3"})
    assert caller.address == "198.51.100.7"
    assert trust.caller("127.0.0.1", {"x-forwarded-for": "not-an-ip"}).address == "127.0.0.1"
    assert trust.caller("127.0.0.1", {}).address == "127.0.0.1"


def test_a_tenant_name_is_bounded_and_bad_networks_name_themselves():
    trust = ProxyTrust("127.0.0.1", tenant_header="x-tenant")
    with pytest.raises(TenantRefused, match="The tenant name has 101 characters; the limit is 100."):
        trust.caller("127.0.0.1", {"x-tenant": "t" * 101})
    with pytest.raises(ValueError, match="'10.0.0.300' is not an IP address or network"):
        parse_networks("127.0.0.1, 10.0.0.300")
