"""The keys that own stored conversations: issued by this server, of fixed size, checked on every use.

A browser keeps its key in Gradio's BrowserState (the page's localStorage) and sends it with every
event, so whatever a browser sends is untrusted until checked: a key is a random id and an HMAC of
it under a secret that stays in the data dir (``session-key.key``; not the BrowserState secret,
which every page carries). A value that is not such a key — the empty string, an old uuid, another
kind of key, 900,000 characters of anything — counts as no key at all.

The scriptable ``/chat`` owns its conversations by the Gradio session it runs in; its keys are of
another kind, derived from the session hash, which the browser path refuses.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

BROWSER_KIND = "b"
API_KIND = "a"
_PART_CHARS = 22  # 16 bytes in unpadded base64url
_BROWSER_KEY = re.compile(r"b\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{22}")
MAX_SESSION_KEY_CHARS = 64  # the conversations.session_key column; both kinds are shorter


class SessionKeys:
    def __init__(self, secret: str):
        if not secret:
            raise ValueError("the session-key secret is empty")
        self._secret = secret.encode()

    def mint_browser(self) -> str:
        """A new browser key: ``b.<random id>.<its HMAC>``, 47 characters."""
        ident = _b64(secrets.token_bytes(16))
        return f"{BROWSER_KIND}.{ident}.{self._mac(BROWSER_KIND, ident)}"

    def browser(self, value: object) -> str | None:
        """``value`` if this server issued it as a browser key, else None (checked before any read)."""
        if not isinstance(value, str) or len(value) != 47 or not _BROWSER_KEY.fullmatch(value):
            return None
        _, ident, mac = value.split(".")
        return value if hmac.compare_digest(mac, self._mac(BROWSER_KIND, ident)) else None

    def api(self, session_hash: str) -> str:
        """The key of ``/chat`` conversations run in the Gradio session ``session_hash``: ``a.<HMAC>``."""
        return f"{API_KIND}.{self._mac(API_KIND, session_hash)}"

    def _mac(self, kind: str, ident: str) -> str:
        digest = hmac.new(self._secret, f"{kind}\0{ident}".encode(), hashlib.sha256).digest()
        return _b64(digest)[:_PART_CHARS]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")
