"""EdgeIndex: the out-edges and in-edges of any vertex rows of one graph, kept up to date across
update batches from the change alone (what the refresh kernel's planning reads instead of
passing over every edge; pe/refresh_kernel.py, pe/follow.py).

An index holds, for a prefix of the graph's edges (the "base"), two CSR groupings (edge
positions sorted by source row and by destination row, with each row's start), and treats the
edges after the base (the "tail": edges inserted since the index was built) by a scan of the
tail alone. A lookup returns edge positions in increasing order, the order a mask over all
edges (np.flatnonzero) gives, so a plan built from the index lists its edges, and sums its
messages, exactly as one built by passing over every edge.

WHY a tail and not a CSR rebuilt per batch: graph.updates.apply appends the inserted edges of an
update that removes nothing after the old ones (positions unchanged), so the index of the new
graph is the old one with a longer tail -- O(1) to advance, O(tail) per lookup; the tail is
folded into the base (a sort of all edges) once it outgrows a fraction of the base. An update
that removes edges or vertices renumbers the kept edges (apply is then O(E) itself): the base
is remapped in one vectorised pass (no sort: kept edges and vertices keep their order), the
inserted edges start a new tail.
"""

from __future__ import annotations

import numpy as np

from sparkgnn import npsets

# the tail is folded into the base (an O(E log E) rebuild) past this fraction of the base's edges
TAIL_FRACTION = 0.125
TAIL_MIN = 4096


def _csr(keys: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(edge positions sorted by key, stable; start of each key's run [num_rows + 1])."""
    order = np.argsort(keys, kind="stable").astype(np.int64, copy=False)
    starts = np.zeros(num_rows + 1, np.int64)
    np.cumsum(np.bincount(keys, minlength=num_rows), out=starts[1:])
    return order, starts


def _runs(order: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The entries of `order` in the runs of `rows` (concatenated)."""
    lo = starts[rows]
    n = starts[rows + 1] - lo
    total = int(n.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(total, dtype=np.int64)
    return order[offsets]


class EdgeIndex:
    """Out- and in-edges by vertex row of one graph (module doc). Build with `of(graph)`, then
    `advance(applied)` per update; `out_edges(rows)` / `in_edges(rows)` give sorted edge positions."""

    def __init__(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        num_nodes: int,
        base_len: int,
        by_src: tuple[np.ndarray, np.ndarray],
        by_dst: tuple[np.ndarray, np.ndarray],
    ):
        self.src, self.dst, self.num_nodes, self.base_len = src, dst, int(num_nodes), int(base_len)
        self.by_src, self.by_dst = by_src, by_dst

    @classmethod
    def of(cls, graph) -> EdgeIndex:
        """The index of `graph` (every edge in the base: O(E log E))."""
        src = np.asarray(graph.edge_src, np.int64)
        dst = np.asarray(graph.edge_dst, np.int64)
        n = int(graph.num_nodes)
        return cls(src, dst, n, len(src), _csr(src, n), _csr(dst, n))

    @property
    def num_edges(self) -> int:
        return len(self.src)

    def advance(self, applied) -> EdgeIndex:
        """The index of `applied.graph` (`applied`: this index's graph to the next, graph.updates.Applied,
        one update or several composed): O(1) for an update that removes nothing and inserts no
        vertex (its edges are appended to the tail), one vectorised O(E) remap otherwise."""
        graph = applied.graph
        src = np.asarray(graph.edge_src, np.int64)
        dst = np.asarray(graph.edge_dst, np.int64)
        n_old, n_new = len(applied.new_rows), len(applied.old_rows)
        removed = np.asarray(applied.removed_edges, np.int64)
        n_edges = len(applied.kept_edges) + len(removed)
        if n_old != self.num_nodes or n_edges != self.num_edges:
            raise ValueError(
                f"EdgeIndex.advance: the update is of a graph of {n_old} vertices and {n_edges} edges, "
                f"this index's has {self.num_nodes} and {self.num_edges}"
            )
        # every vertex kept in place and none inserted (kept rows come first, in the old order)
        same_rows = n_new == n_old and (n_new == 0 or int(applied.old_rows[-1]) == n_old - 1)
        grows_only = same_rows and not len(removed)
        if grows_only:
            index = EdgeIndex(src, dst, n_new, self.base_len, self.by_src, self.by_dst)
        else:
            keep = np.ones(self.num_edges, bool)
            keep[removed] = False
            rank = np.cumsum(keep) - 1  # old position -> new position of a kept edge
            base_len = int(keep[: self.base_len].sum())  # kept base edges come first, in order

            def remap(grouping: tuple[np.ndarray, np.ndarray], keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                order = grouping[0]
                order = rank[order[keep[order]]]  # still sorted by key: kept vertices keep their order
                starts = np.zeros(n_new + 1, np.int64)
                np.cumsum(np.bincount(keys[:base_len], minlength=n_new), out=starts[1:])
                return order, starts

            index = EdgeIndex(src, dst, n_new, base_len, remap(self.by_src, src), remap(self.by_dst, dst))
        if index.num_edges - index.base_len > max(TAIL_MIN, TAIL_FRACTION * index.base_len):
            return EdgeIndex.of(graph)
        return index

    def _lookup(self, rows: np.ndarray, grouping: tuple[np.ndarray, np.ndarray], keys: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return np.zeros(0, np.int64)
        if int(rows.min()) < 0 or int(rows.max()) >= self.num_nodes:
            raise ValueError(f"EdgeIndex: vertex rows must lie in [0, {self.num_nodes})")
        found = _runs(*grouping, npsets.unique(rows))
        if self.num_edges > self.base_len:
            member = np.zeros(self.num_nodes, bool)
            member[rows] = True
            tail = np.flatnonzero(member[keys[self.base_len :]]) + self.base_len
            found = np.concatenate([found, tail])
        return np.sort(found)

    def out_edges(self, rows: np.ndarray) -> np.ndarray:
        """Sorted positions of the edges whose source is one of `rows`."""
        return self._lookup(rows, self.by_src, self.src)

    def in_edges(self, rows: np.ndarray) -> np.ndarray:
        """Sorted positions of the edges whose destination is one of `rows`."""
        return self._lookup(rows, self.by_dst, self.dst)
