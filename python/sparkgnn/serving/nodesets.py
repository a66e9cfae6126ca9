"""Set operations on vertex index arrays through reusable dense marks (O(len) each).

WHY: a request's plan is a handful of set operations (unique, union, intersection, membership,
unique-with-inverse) over arrays of 10^4-10^6 union indices drawn from a dense range 0..N+B-1.
numpy's unique/isin sort or hash on every call; marking a preallocated bool/int array and reading
it back costs a gather (the saving is measured in docs/ARCHITECTURE.md, "Serving modes and CGP").
The buffers are allocated once per ServingContext (N + the largest
batch seen) and are always left clean, so every call starts from all-False / all -1.

Not thread-safe: every operation writes the marks, so ServingContext.sets hands each thread its own.
"""

from __future__ import annotations

import numpy as np

from sparkgnn.npsets import dedupe_sorted


class NodeSets:
    def __init__(self, size: int):
        self._mark = np.zeros(0, bool)
        self._pos = np.zeros(0, np.int64)
        self.ensure(size)

    def ensure(self, size: int) -> None:
        if size > len(self._mark):
            size = max(int(size), int(len(self._mark) * 1.25))
            self._mark = np.zeros(size, bool)
            self._pos = np.full(size, -1, np.int64)

    def unique(self, *arrays: np.ndarray) -> np.ndarray:
        """Sorted distinct values of the concatenation of `arrays`."""
        touched = np.concatenate(arrays) if len(arrays) != 1 else np.asarray(arrays[0])
        if len(touched) * 16 <= len(self._mark):  # few values: sorting them is cheaper
            return dedupe_sorted(np.sort(touched)).astype(np.int64, copy=False)
        mark = self._mark
        mark[touched] = True
        out = np.flatnonzero(mark)
        mark[out] = False
        return out

    def member(self, values: np.ndarray, of: np.ndarray) -> np.ndarray:
        """Boolean mask: values[i] in `of`."""
        mark = self._mark
        mark[of] = True
        out = mark[values]
        mark[of] = False
        return out

    def intersect(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Sorted distinct values present in both."""
        return self.unique(a[self.member(a, b)]) if len(a) and len(b) else np.empty(0, np.int64)

    def unique_inverse(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted distinct values, position of each value in them)."""
        uniq = self.unique(values)
        pos = self._pos
        pos[uniq] = np.arange(len(uniq))
        inv = pos[values]
        pos[uniq] = -1
        return uniq, inv

    def positions(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """For each value its index in `keys` (distinct), -1 when absent."""
        pos = self._pos
        pos[keys] = np.arange(len(keys))
        out = pos[values]
        pos[keys] = -1
        return out
