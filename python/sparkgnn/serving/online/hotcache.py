"""Hot-row cache: keep the rows that requests touch most in the fastest memory a worker has.

WHY: an online worker answers each request by gathering rows of pre(x), h^(l) and the merged
states (serving.stored.StoredLayers) for the request's neighbourhood. Accesses are heavily skewed
(a few hub vertices are in almost every computation graph), so a small copy of the hottest rows
on the accelerator (or, on a CPU-only worker, in a compact pinned-size torch tensor) serves most
gathers. Which rows are hot is decided ONCE, at attach time, from the graph and the PE store's
workload metrics, never by watching traffic: the decision is reproducible and costs nothing per
request.

Placement policies (CACHE_POLICIES; each returns G row indices, hottest first, at most `capacity`):
  off     nothing hot: the baseline a cache is measured against.
  degree  GSM's degree-based cache: highest OUT-degree first. A vertex is fetched when it is the
          in-neighbour (message source) of a vertex in the computation graph, so its out-degree
          counts how many vertices can pull it. From the store's "degrees" table (out_degree,
          pe/metrics.degrees), or from G's edges when the store has no such table.
  fap     Quiver section 5.2 step (i): sort by feature access probability (the store's "fap"
          table, pe/metrics.fap: expected accesses per request within K hops) and keep the top.
Ties go to the lower row index, so the hot set is a pure function of (graph, store, capacity).

Budget rule (attach_hot_cache): ONE ranking of vertices and the SAME hot rows in every array. A
vertex's bytes across all cached arrays (pre(x), every h^(l), every state) are its cost, and the
hottest floor(capacity_bytes / bytes_per_vertex) vertices are hot everywhere; i.e. each array gets
the same fraction of its rows. WHY not per array: the metrics rank vertices, not (vertex, layer),
and a vertex in a computation graph is fetched at several layers of the same request (HE fetches
h^(l) of its neighbours, EXACT their states and values), so splitting by vertex keeps those
fetches hitting or missing together.

Results are the same bytes as `array[rows]` (rows are copied, never recomputed), so answers with a
cache equal answers without one exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sparkgnn.errors import SparkGNNError
from sparkgnn.registry import Registry

if TYPE_CHECKING:
    from sparkgnn.serving.stored import StoredLayers

__all__ = ["CACHE_POLICIES", "HotCacheError", "HotRows", "attach_hot_cache", "cache_stats", "detach_hot_cache"]


class HotCacheError(SparkGNNError, ValueError):
    """A hot cache cannot be built as asked (unknown policy, bad capacity, missing metrics)."""


Policy = Callable[[Any, Any, int], np.ndarray]
CACHE_POLICIES: Registry[Policy] = Registry("hot cache policy", HotCacheError)


def _top(score: np.ndarray, capacity: int) -> np.ndarray:
    """Rows of the `capacity` highest scores, highest first, ties to the lower row (lexsort's
    last key is the primary one)."""
    capacity = max(0, min(int(capacity), len(score)))
    if capacity == 0:
        return np.empty(0, np.int64)
    order = np.lexsort((np.arange(len(score)), -np.asarray(score, dtype=np.float64)))
    return order[:capacity].astype(np.int64)


def _aligned_column(store, graph, table: str, column: str) -> np.ndarray | None:
    """Column `column` of the store's metrics table `table` in G's row order (float64), or None
    when the store lacks the table or the column. A table that does not cover G is refused: the
    store was verified against G, so a gap means a damaged or foreign metrics table."""
    if table not in store.metric_tables:
        return None
    t = store.metrics_table(table)
    if column not in t.column_names:
        return None
    ids = t.column("id").to_numpy().astype(np.int64, copy=False)
    pos, found = graph.id_index.lookup(ids)
    out = np.zeros(graph.num_nodes, np.float64)
    out[pos[found]] = t.column(column).to_numpy().astype(np.float64, copy=False)[found]
    covered = np.zeros(graph.num_nodes, bool)
    covered[pos[found]] = True
    if not covered.all():
        raise HotCacheError(
            f"metrics table {table!r} of {store!r} lacks {int((~covered).sum())} of G's "
            f"{graph.num_nodes} vertices: it was not computed on this graph"
        )
    return out


@CACHE_POLICIES.register("off")
def off_policy(store, graph, capacity: int) -> np.ndarray:
    """Nothing hot."""
    return np.empty(0, np.int64)


@CACHE_POLICIES.register("degree")
def degree_policy(store, graph, capacity: int) -> np.ndarray:
    """Highest out-degree first (GSM): the store's degrees.out_degree, else counted from G."""
    score = _aligned_column(store, graph, "degrees", "out_degree") if store is not None else None
    if score is None:
        score = graph.out_degree().astype(np.float64)
    return _top(score, capacity)


@CACHE_POLICIES.register("fap")
def fap_policy(store, graph, capacity: int) -> np.ndarray:
    """Highest feature access probability first (Quiver): needs the store's "fap" table."""
    if int(capacity) <= 0:
        return np.empty(0, np.int64)
    score = _aligned_column(store, graph, "fap", "fap") if store is not None else None
    if score is None:
        have = ", ".join(store.metric_tables) if store is not None else "no store given"
        raise HotCacheError(
            f"hot cache policy 'fap' ranks vertices by the PE store's 'fap' metrics table, which "
            f"{store!r} lacks (it has: {have or 'none'}); precompute the store with workload metrics"
        )
    return _top(score, capacity)


def hot_rows(policy: str, store, graph, capacity: int) -> np.ndarray:
    """G row indices `policy` keeps hot within `capacity` rows (hottest first)."""
    if int(capacity) < 0:
        raise HotCacheError(f"capacity must be >= 0 rows, got {capacity}")
    rows = np.asarray(CACHE_POLICIES.lookup(policy)(store, graph, int(capacity)), dtype=np.int64)
    return rows[: int(capacity)]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device` when it is usable here, else the CPU: "cuda" is asked for by deployments that may
    land on a CPU-only worker, which must still serve (from a CPU copy) rather than fail."""
    dev = torch.device(device or "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    return dev


class HotRows:
    """One dense host array [N, ...] with its hot rows copied to `device` (slot map row -> slot).

    `gather(rows)` returns `array[rows]` as a tensor on the device: hot rows from the device copy,
    the others from the host array (then moved). It counts hits and misses per row (thread-safe:
    an online server gathers from several threads)."""

    def __init__(self, array: np.ndarray, rows: np.ndarray, device: str | torch.device | None = "cpu", name: str = ""):
        if array.ndim < 1:
            raise HotCacheError(f"HotRows needs an array of rows, got shape {array.shape}")
        self.host = array
        self.name = name
        self.device = resolve_device(device)
        rows = np.asarray(rows, dtype=np.int64)
        _, first = np.unique(rows, return_index=True)
        rows = rows[np.sort(first)]  # duplicates dropped, priority order kept
        if len(rows) and (rows.min() < 0 or rows.max() >= len(array)):
            raise HotCacheError(f"hot rows must lie in 0..{len(array) - 1}")
        self.rows = rows
        self.slot = np.full(len(array), -1, np.int64)
        self.slot[rows] = np.arange(len(rows), dtype=np.int64)
        self.hot = torch.from_numpy(np.ascontiguousarray(array[rows])).to(self.device)
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def _host_rows(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.host[rows]).to(self.device)

    def gather(self, rows: np.ndarray) -> torch.Tensor:
        rows = np.asarray(rows, dtype=np.int64)
        slots = self.slot[rows]
        hit = slots >= 0
        n_hit = int(hit.sum())
        with self._lock:
            self.hits += n_hit
            self.misses += len(rows) - n_hit
        if n_hit == len(rows):
            return self.hot.index_select(0, torch.from_numpy(slots).to(self.device))
        if n_hit == 0:
            return self._host_rows(rows)
        out = torch.empty((len(rows), *self.host.shape[1:]), dtype=self.hot.dtype, device=self.device)
        hit_t = torch.from_numpy(np.flatnonzero(hit)).to(self.device)
        miss_t = torch.from_numpy(np.flatnonzero(~hit)).to(self.device)
        out[hit_t] = self.hot.index_select(0, torch.from_numpy(slots[hit]).to(self.device))
        out[miss_t] = self._host_rows(rows[~hit])
        return out

    @property
    def hot_bytes(self) -> int:
        return int(self.hot.numel() * self.hot.element_size())

    def stats(self) -> dict:
        total = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hits / total if total else 0.0,
            "hot_rows": len(self.rows),
            "hot_bytes": self.hot_bytes,
        }

    def reset_stats(self) -> None:
        with self._lock:
            self.hits = self.misses = 0

    def __repr__(self) -> str:
        return f"HotRows({self.name or 'array'}, {len(self.rows)}/{len(self.host)} rows hot on {self.device})"


def _array_name(key: tuple[str, int]) -> str:
    return f"{key[0]}{key[1]}"


def attach_hot_cache(
    stored: StoredLayers,
    policy: str,
    capacity_bytes: int,
    store,
    graph,
    device: str | torch.device | None = "cpu",
) -> dict:
    """Route `stored`'s lookups through HotRows holding the `policy`'s hottest vertices within
    `capacity_bytes` in total (module doc: the same rows hot in every array). Replaces a cache
    attached before. Returns the plan: policy, device, hot_rows, bytes_per_vertex, hot_bytes.
    `store`: the PEStore (its metrics tables rank the vertices); `graph`: G, the graph `stored`
    is aligned to."""
    if int(capacity_bytes) < 0:
        raise HotCacheError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
    CACHE_POLICIES.lookup(policy)  # refuse an unknown name before any work
    arrays = stored.arrays()
    n = graph.num_nodes
    for key, a in arrays.items():
        if len(a) != n:
            raise HotCacheError(f"array {_array_name(key)} has {len(a)} rows but G has {n} vertices")
    per_vertex = sum(int(np.prod(a.shape[1:], dtype=np.int64)) * a.itemsize for a in arrays.values())
    capacity = min(n, int(capacity_bytes) // per_vertex) if per_vertex else n
    rows = hot_rows(policy, store, graph, capacity)
    dev = resolve_device(device)
    stored.cache = {key: HotRows(a, rows, dev, name=_array_name(key)) for key, a in arrays.items()}
    stored.cache_policy = policy
    return {
        "policy": policy,
        "device": str(dev),
        "hot_rows": int(len(rows)),
        "bytes_per_vertex": per_vertex,
        "hot_bytes": sum(c.hot_bytes for c in stored.cache.values()),
    }


def detach_hot_cache(stored: StoredLayers) -> None:
    """Lookups go straight to the host arrays again."""
    stored.cache = {}
    stored.cache_policy = None


def cache_stats(stored: StoredLayers) -> dict:
    """Hits, misses and hit rate over every cached array (a row gathered from two arrays counts
    twice), the hot rows and bytes, and the same per array under "arrays" ("h0", "h1", "state1",
    ...). An uncached StoredLayers reports zeros."""
    per = {c.name: c.stats() for c in stored.cache.values()}
    hits = sum(s["hits"] for s in per.values())
    misses = sum(s["misses"] for s in per.values())
    return {
        "policy": stored.cache_policy,
        "hits": hits,
        "misses": misses,
        "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "hot_rows": max((s["hot_rows"] for s in per.values()), default=0),
        "hot_bytes": sum(s["hot_bytes"] for s in per.values()),
        "arrays": per,
    }
