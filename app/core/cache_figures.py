"""What customers are told about the cache: never more than every customer shares anyway.

Without tenants every customer's prompts share one cache namespace, so an exact count of cached
tokens is an oracle: a right guess of another customer's recent message came back with 480 tokens
cached, a wrong one with 384. The figures shown to customers (the chat's caption, ``/chat``) and
to ``/v1`` callers are therefore capped at the template's own prefix in whole KV blocks — the part
every customer of the template shares — unless the request ran in a cache namespace of its own (a
tenant's salt, or a ``/v1`` caller's own ``cache_salt``): then every cached block is its own.

The chat's caption says only what share of that shared prefix was read from the cache (``reused_percent``):
the prompt's length, or a count of tokens, differs between the versions of a live split, and would tell a
customer which arm they are on.

The database keeps the true number; the console shows it to operators.
"""

from __future__ import annotations


def shared_prefix_tokens(num_prefix_tokens: int, block_size: int) -> int:
    """Tokens of a template's prefix that fill whole KV blocks: what its customers share."""
    return num_prefix_tokens // block_size * block_size


def shown_cached_tokens(num_cached_tokens: int | None, *, shared_tokens: int, own_namespace: bool) -> int | None:
    """The cached-token figure a caller may see: the true one in a namespace of its own, else at most
    ``shared_tokens`` (None stays None: an answer that never reached the engine)."""
    if num_cached_tokens is None or own_namespace:
        return num_cached_tokens
    return min(num_cached_tokens, shared_tokens)


def reused_percent(num_cached_tokens: int | None, shared_tokens: int | None) -> int | None:
    """The share (0-100, rounded down) of the shared prefix that came from the cache: 100 when the prefix fills no
    whole block (nothing to read, so nothing missed: a short version's caption reads like a long one's); None for
    a row that is no customer's copy."""
    if shared_tokens is None:
        return None
    if shared_tokens == 0:
        return 100
    return min(num_cached_tokens or 0, shared_tokens) * 100 // shared_tokens
