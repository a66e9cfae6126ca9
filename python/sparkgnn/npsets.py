"""Set operations on integer arrays by sorting: numpy's np.unique, setdiff1d, intersect1d and
union1d, with the same results.

WHY: numpy 2.4's np.unique (which setdiff1d, intersect1d and union1d call) finds an integer
array's distinct values through a hash table before sorting them, and on the machines measured
that costs 10-60x a sort of the whole array (1M int64 ids: 0.22 s against 0.019 s with 200K
distinct, 0.87 s with 1M distinct; setdiff1d of 1M and 300K ids 1.26 s against 0.03 s). Vertex
and edge id sets are exactly such arrays: prepare's passes, the local indexes of a layer's
slice, k-hop frontiers, refresh and serving plans take their distinct ids here. An array that is
not of integers (or booleans) goes to numpy unchanged (its NaN rule, object arrays).
"""

from __future__ import annotations

import numpy as np

_SORTED_KINDS = "iub"  # signed and unsigned integers, booleans


def unique(values) -> np.ndarray:
    """np.unique(values): the sorted distinct values of the flattened array."""
    array = np.asarray(values)
    if array.dtype.kind not in _SORTED_KINDS:
        return np.unique(array)
    return dedupe_sorted(np.sort(array, axis=None))


def dedupe_sorted(array: np.ndarray) -> np.ndarray:
    """The distinct values of an array sorted ascending, in order."""
    if len(array) < 2:
        return array
    keep = np.empty(len(array), bool)
    keep[0] = True
    np.not_equal(array[1:], array[:-1], out=keep[1:])
    return array[keep]


def setdiff(a, b) -> np.ndarray:
    """np.setdiff1d(a, b): the sorted distinct values of `a` that are not in `b`."""
    distinct = unique(a)
    return distinct[~np.isin(distinct, np.asarray(b))] if np.size(b) else distinct


def intersect(a, b) -> np.ndarray:
    """np.intersect1d(a, b): the sorted distinct values in both `a` and `b`."""
    a, b = np.asarray(a), np.asarray(b)
    distinct = unique(a)
    return distinct[np.isin(distinct, b)].astype(np.result_type(a, b), copy=False)  # numpy's common dtype


def union(a, b) -> np.ndarray:
    """np.union1d(a, b): the sorted distinct values in `a` or `b`."""
    return unique(np.concatenate([np.ravel(a), np.ravel(b)]))


__all__ = ["dedupe_sorted", "intersect", "setdiff", "union", "unique"]
