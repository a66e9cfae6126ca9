"""Original id -> dense index (0..N-1), vectorised.

Why: ids need not be dense (Cora uses paper ids up to 1.1M), but tensors index rows densely.
One sorted copy of the ids plus searchsorted maps millions of ids per call without a Python dict
(a dict of 20M ints costs GBs and a per-row loop). Dense ids 0..N-1 in order skip the search.
Ids spread over at most TABLE_SPAN_FACTOR x N values (dense ids with holes, e.g. a graph with the
serving query pool removed) get a direct table instead: serving maps every request's ids, and a
gather beats a binary search with its cache misses (docs/ARCHITECTURE.md, "Serving modes and CGP").
"""

from __future__ import annotations

import numpy as np

TABLE_SPAN_FACTOR = 4


class IdIndex:
    """Maps original vertex ids to their row position in `ids`."""

    def __init__(self, ids: np.ndarray):
        self.ids = np.asarray(ids, dtype=np.int64)
        n = len(self.ids)
        self.identity = bool(n == 0 or (self.ids[0] == 0 and self.ids[-1] == n - 1 and np.all(np.diff(self.ids) == 1)))
        self._table = None
        if self.identity:
            self._order = None
            self._sorted = self.ids
        else:
            self._order = np.argsort(self.ids, kind="stable")
            self._sorted = self.ids[self._order]
            lo, hi = int(self._sorted[0]), int(self._sorted[-1])
            if hi - lo + 1 <= TABLE_SPAN_FACTOR * n + 1024:
                table = np.full(hi - lo + 1, -1, np.int64)
                table[self._sorted[::-1] - lo] = self._order[::-1]  # first occurrence wins
                self._table, self._lo = table, lo

    def lookup(self, query) -> tuple[np.ndarray, np.ndarray]:
        """Return (dense index, found mask). Positions whose id is unknown hold 0 in the index."""
        query = np.asarray(query, dtype=np.int64)
        n = len(self.ids)
        if n == 0:
            return np.zeros(query.shape, np.int64), np.zeros(query.shape, bool)
        if self.identity:
            found = (query >= 0) & (query < n)
            return np.where(found, query, 0), found
        table = self._table
        if table is not None:
            off = query - self._lo
            inside = (off >= 0) & (off < len(table))
            idx = table[np.where(inside, off, 0)]
            found = inside & (idx >= 0)
            return np.where(found, idx, 0), found
        order = self._order
        assert order is not None, "a non-identity index always has its sort order"
        pos = np.minimum(np.searchsorted(self._sorted, query), n - 1)
        found = self._sorted[pos] == query
        return np.where(found, order[pos], 0), found

    def duplicates(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids that occur more than once, their counts), ascending by id."""
        if self.identity or len(self._sorted) < 2:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        repeated = self._sorted[1:] == self._sorted[:-1]
        if not repeated.any():
            return np.empty(0, np.int64), np.empty(0, np.int64)
        values, counts = np.unique(self._sorted, return_counts=True)
        many = counts > 1
        return values[many], counts[many]
