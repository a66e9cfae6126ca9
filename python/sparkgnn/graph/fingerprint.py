"""Content fingerprint of a graph ("sgfp1"), computed once at write time and stored in graph.json.

Why this shape: the PE store and the serving path refuse stale state by comparing fingerprints,
so the fingerprint must (a) change whenever ids, features or edges change, (b) be cheap to read
later (it is a string in graph.json), and (c) be computable in ONE streaming pass over chunks or
Spark partitions in any order, because big graphs are written chunk by chunk and Spark has no
global row order. Hence a multiset hash: every vertex row and every edge row is hashed to 64
bits, the row hashes are summed modulo 2**64 (order independent, mergeable across chunks), and
the two sums plus the counts are hashed with BLAKE2b.

Row hashes (all arithmetic uint64, wrapping):
  vertex: mix(mix(id ^ SALT_ID) + sum_j bits(x_j) * K_j)  with K_j = mix(j + SALT_K) | 1, where
          bits() is the float32 bit pattern after `x + 0.0` (so -0.0 hashes like 0.0). Because
          every K_j is odd, changing any single feature value always changes the row sum.
  edge:   mix(mix(mix(src ^ SALT_SRC) + dst) + bits(weight))   (bits(weight) = 0 without weights);
          with an `edge_attr` vector a of width D: mix(that + sum_j bits(a_j) * K'_j), K'_j the odd
          keys of a salt of their own, so an attribute change always changes the row sum
Ids are the ORIGINAL ids, so the fingerprint does not depend on the dense index, the row order or
the file layout. Labels and splits are deliberately excluded: embeddings do not depend on them,
so relabelling a graph must not invalidate its PEs.
  fingerprint = blake2b-128("sgfp1|v=N|e=E|f=F|w=0/1[|a=D]|<vertex sum hex>|<edge sum hex>")
(`|a=D` only for a graph with edge attributes, so every other graph keeps its fingerprint).
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from sparkgnn.errors import GraphValidationError

ALGO = "sgfp1"
HEX_DIGITS = 32  # blake2b-128
_HEX = re.compile(f"[0-9a-f]{{{HEX_DIGITS}}}")
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SALT_ID = np.uint64(0x9E3779B97F4A7C15)
_SALT_K = np.uint64(0x632BE59BD9B4E019)
_SALT_SRC = np.uint64(0xD6E8FEB86659FD93)
_SALT_ATTR = np.uint64(0x2545F4914F6CDD1D)
_MASK = (1 << 64) - 1
# Rows hashed per step: bounds the temporary uint64 [rows, F] block to ~64 MB.
_BLOCK_ELEMS = 8_000_000


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a cheap, well-mixed bijection on uint64 (wraps silently in numpy)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _float_bits(values: np.ndarray) -> np.ndarray:
    canon = np.ascontiguousarray(values, dtype=np.float32) + np.float32(0.0)
    return canon.view(np.uint32).astype(np.uint64)


def _feature_keys(dim: int, salt: np.uint64 = _SALT_K) -> np.ndarray:
    return _mix(np.arange(dim, dtype=np.uint64) + salt) | np.uint64(1)


def vertex_hash_sum(ids: np.ndarray, x: np.ndarray) -> int:
    """Sum (mod 2**64) of the vertex row hashes of one chunk."""
    ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
    x = np.asarray(x)
    n, dim = (x.shape[0], x.shape[1]) if x.ndim == 2 else (x.shape[0], 0)
    keys = _feature_keys(dim)
    step = max(1, _BLOCK_ELEMS // max(dim, 1))
    total = 0
    for start in range(0, n, step):
        stop = min(n, start + step)
        if dim:
            feats = (_float_bits(x[start:stop]) * keys).sum(axis=1, dtype=np.uint64)
        else:
            feats = np.zeros(stop - start, dtype=np.uint64)
        rows = _mix(_mix(ids[start:stop] ^ _SALT_ID) + feats)
        total = (total + int(rows.sum(dtype=np.uint64))) & _MASK
    return total


def edge_hash_sum(
    src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None = None, edge_attr: np.ndarray | None = None
) -> int:
    """Sum (mod 2**64) of the edge row hashes of one chunk (src/dst are ORIGINAL ids; edge_attr
    [E, D] float32 or None)."""
    src = np.asarray(src, dtype=np.int64).view(np.uint64)
    dst = np.asarray(dst, dtype=np.int64).view(np.uint64)
    wbits = _float_bits(weight) if weight is not None else np.uint64(0)
    rows = _mix(_mix(_mix(src ^ _SALT_SRC) + dst) + wbits)
    if edge_attr is not None:
        attr = np.asarray(edge_attr).reshape(len(rows), -1)
        keys = _feature_keys(attr.shape[1], _SALT_ATTR)
        rows = _mix(rows + (_float_bits(attr) * keys).sum(axis=1, dtype=np.uint64))
    return int(rows.sum(dtype=np.uint64))


class FingerprintAccumulator:
    """Feed vertex and edge chunks in any order; read `.hexdigest()` at the end. Partial sums
    from other processes (e.g. Spark tasks) can be merged with `add_partial`."""

    def __init__(self, feature_dim: int, has_weight: bool, edge_attr_dim: int = 0):
        self.feature_dim = int(feature_dim)
        self.has_weight = bool(has_weight)
        self.edge_attr_dim = int(edge_attr_dim)
        self.num_vertices = 0
        self.num_edges = 0
        self._vsum = 0
        self._esum = 0

    def add_vertices(self, ids: np.ndarray, x: np.ndarray) -> None:
        self.add_partial(vertices=len(ids), vertex_sum=vertex_hash_sum(ids, x))

    def add_edges(
        self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None = None, edge_attr: np.ndarray | None = None
    ) -> None:
        if (edge_attr is not None) != bool(self.edge_attr_dim):
            raise ValueError(
                f"edge_attr given {edge_attr is not None}, but the graph's edge_attr_dim is {self.edge_attr_dim}"
            )
        self.add_partial(edges=len(src), edge_sum=edge_hash_sum(src, dst, weight, edge_attr))

    def add_partial(self, vertices: int = 0, vertex_sum: int = 0, edges: int = 0, edge_sum: int = 0) -> None:
        self.num_vertices += int(vertices)
        self.num_edges += int(edges)
        self._vsum = (self._vsum + int(vertex_sum)) & _MASK
        self._esum = (self._esum + int(edge_sum)) & _MASK

    def hexdigest(self) -> str:
        text = (
            f"{ALGO}|v={self.num_vertices}|e={self.num_edges}|f={self.feature_dim}"
            f"|w={int(self.has_weight)}"
            + (f"|a={self.edge_attr_dim}" if self.edge_attr_dim else "")
            + f"|{self._vsum:016x}|{self._esum:016x}"
        )
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def check_fingerprint(value, source: str = "graph fingerprint") -> str:
    """`value` if it is a graph fingerprint (32 lower-case hex digits), else GraphValidationError.
    Fingerprints become path parts (PE stores, refresh pieces): one read from graph.json or a
    manifest must not name `../` or an absolute path."""
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise GraphValidationError(
            f"{source} {str(value)[:80]!r} is not a graph fingerprint ({HEX_DIGITS} lower-case hex digits)"
        )
    return value


def fingerprint_arrays(ids, x, src_ids, dst_ids, weight=None, edge_attr=None) -> str:
    """Fingerprint of a whole graph held in memory (edges given by ORIGINAL ids)."""
    attr_dim = 0 if edge_attr is None else int(np.asarray(edge_attr).reshape(len(src_ids), -1).shape[1])
    acc = FingerprintAccumulator(np.asarray(x).shape[1], weight is not None, attr_dim)
    acc.add_vertices(ids, x)
    acc.add_edges(src_ids, dst_ids, weight, edge_attr)
    return acc.hexdigest()
