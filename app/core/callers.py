"""Who is calling: the client's address and tenant, believed only from what this server can trust.

A request's peer is the TCP address that connected. Behind a reverse proxy every peer is the proxy,
so the proxy names the real client in a header (``X-Forwarded-For``) and the tenant in another
(``PREFIXDESK_TENANT_HEADER``). Anyone can send those headers, so they count only when the peer is
one of ``PREFIXDESK_TRUSTED_PROXIES``; from any other peer they are ignored (the address) or
refused (the tenant).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from app.settings import parse_networks

MAX_TENANT_CHARS = 100


class TenantRefused(PermissionError):
    """A tenant was named by a caller that may not name one; the message says who may."""


@dataclass(frozen=True)
class Caller:
    address: str  # the client's IP address: the key of every per-client limit
    tenant: str  # "" when there is one tenant (or no trusted proxy named one)


class ProxyTrust:
    """Decides what a request's headers may claim, from the settings."""

    def __init__(self, trusted_proxies: str, *, forwarded_header: str = "x-forwarded-for", tenant_header: str = ""):
        self.networks = parse_networks(trusted_proxies)
        self.forwarded_header = forwarded_header.lower()
        self.tenant_header = tenant_header.lower()

    def trusts(self, peer: str) -> bool:
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in net for net in self.networks)

    def caller(self, peer: str | None, headers: Mapping[str, str]) -> Caller:
        """The client behind a request whose TCP peer is ``peer``; raises TenantRefused when an untrusted
        peer names a tenant (it would read another tenant's cache timing)."""
        peer = peer or "unknown"
        trusted = self.trusts(peer)
        address = peer
        if trusted and self.forwarded_header:
            address = self._forwarded_client(headers.get(self.forwarded_header, "")) or peer
        tenant = headers.get(self.tenant_header, "").strip() if self.tenant_header else ""
        if tenant and not trusted:
            raise TenantRefused(
                f"The tenant header {self.tenant_header!r} is accepted only from the reverse proxy "
                "(PREFIXDESK_TRUSTED_PROXIES); send the request through it."
            )
        if len(tenant) > MAX_TENANT_CHARS:
            raise TenantRefused(f"The tenant name has {len(tenant):,} characters; the limit is {MAX_TENANT_CHARS}.")
        return Caller(address, tenant)

    def _forwarded_client(self, value: str) -> str:
        """The rightmost address in X-Forwarded-For that is not one of our proxies: the one the
        outermost trusted proxy saw. Addresses left of it were written by the client and prove nothing."""
        for hop in reversed([h.strip() for h in value.split(",") if h.strip()]):
            if not self.trusts(hop):
                try:
                    return str(ipaddress.ip_address(hop))
                except ValueError:
                    return ""
        return ""
