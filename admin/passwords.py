"""Operator passwords: salted scrypt hashes, checked on a thread (never on the event loop)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

# scrypt cost: about 50 ms and 16 MiB per check on one core, slow enough to make guessing expensive.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1


def hash_password(password: str) -> str:
    """``scrypt$n$r$p$salt$hash`` (hex) for ``password`` with a fresh random salt."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str | None) -> bool:
    """Whether ``password`` matches ``stored``; with no stored hash it spends the same time and says no,
    so timing does not tell which names exist."""
    try:
        scheme, n, r, p, salt, digest = (stored or DUMMY_HASH).split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    got = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p))
    return hmac.compare_digest(got.hex(), digest) and stored is not None


DUMMY_HASH = hash_password(secrets.token_hex(8))
