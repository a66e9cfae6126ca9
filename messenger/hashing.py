"""Payload hashes, by name, so the header can say which one it used.

WHY a registry: the receiver must verify with exactly the algorithm the sender used, and the
sender picks the fastest one it has. xxh3 (from `xxhash`, a dependency of torch-geometric) is fast
enough that hashing a batch costs a small fraction of sending it; blake2b (stdlib, an order of
magnitude slower; figures in messenger/README.md) is the fallback when xxhash is missing. Both ends
must know the name, or the message is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any, Protocol

HAVE_XXHASH = True
try:  # pragma: no cover - import guard
    import xxhash
except ImportError:  # pragma: no cover
    HAVE_XXHASH = False


class Hasher(Protocol):
    """What `digest` needs of a hash object (hashlib's and xxhash's both have it)."""

    def update(self, data: Any, /) -> None: ...

    def hexdigest(self) -> str: ...


def _blake2b() -> Hasher:
    return hashlib.blake2b(digest_size=16)


HASHERS: dict[str, Callable[[], Hasher]] = {"blake2b": _blake2b}
if HAVE_XXHASH:
    HASHERS["xxh3_64"] = xxhash.xxh3_64

DEFAULT = "xxh3_64" if "xxh3_64" in HASHERS else "blake2b"


def digest(chunks: Iterable, algorithm: str = DEFAULT) -> str:
    """`algorithm:hexdigest` over the chunks in order (anything exposing the buffer protocol)."""
    try:
        hasher = HASHERS[algorithm]()
    except KeyError:
        raise KeyError(f"unknown payload hash algorithm {algorithm!r}; known: {sorted(HASHERS)}") from None
    for chunk in chunks:
        hasher.update(chunk)
    return f"{algorithm}:{hasher.hexdigest()}"
