"""In-memory lookup of stored vectors by node id (pyarrow + numpy, no Spark, no per-id loop).

WHY sorted arrays + searchsorted: ids are arbitrary longs (not dense), Spark writes rows in no
particular order, and serving asks for a few thousand ids at a time. Sorting a layer's ids once
(O(n log n)) makes every later batch an O(m log n) vectorised search, with no dict of n Python
ints. Vector columns are read as either Arrow fixed_size_list<float32> (pyarrow writers) or
list<float> (what Spark writes for array<float>); both flatten to one contiguous [n, w] block.
"""

from __future__ import annotations

import numpy as np

from sparkgnn import npsets
from sparkgnn.errors import SparkGNNError


class UnknownIds(SparkGNNError, KeyError):
    """Lookup of ids the store has no rows for."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def vectors(column, width: int | None, what: str) -> np.ndarray:
    """Arrow list / fixed_size_list column (possibly chunked) -> float32 [n, width]."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    n = len(column)
    if column.null_count:
        raise ValueError(f"{what}: {column.null_count} null vectors")
    flat = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if width is None:
        width = flat.size // n if n else 0
    if flat.size != n * width:
        raise ValueError(f"{what}: expected {n} vectors of width {width}, got {flat.size} values")
    if not pa.types.is_fixed_size_list(column.type):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False)
        if n and (lengths.min() != width or lengths.max() != width):
            raise ValueError(f"{what}: vector lengths range {lengths.min()}..{lengths.max()}, expected {width}")
    return flat.reshape(n, width)


class SortedTable:
    """ids sorted ascending with the matching rows of each vector column."""

    def __init__(self, ids: np.ndarray, columns: dict[str, np.ndarray], what: str):
        order = np.argsort(ids, kind="stable")
        self.ids = np.ascontiguousarray(ids[order])
        if len(self.ids) > 1 and (self.ids[1:] == self.ids[:-1]).any():
            dup = npsets.unique(self.ids[1:][self.ids[1:] == self.ids[:-1]])
            raise ValueError(f"{what}: {len(dup)} duplicate ids, e.g. {dup[:5].tolist()}")
        self.columns = {k: v[order] for k, v in columns.items()}
        self.what = what

    def positions(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        pos = np.searchsorted(self.ids, ids)
        pos_c = np.minimum(pos, max(len(self.ids) - 1, 0))
        found = (pos < len(self.ids)) & (self.ids[pos_c] == ids) if len(self.ids) else np.zeros(len(ids), bool)
        if not found.all():
            missing = npsets.unique(ids[~found])
            raise UnknownIds(f"{self.what}: {len(missing)} unknown id(s), e.g. {missing[:5].tolist()}")
        return pos_c

    def take(self, ids, name: str) -> np.ndarray:
        return self.columns[name][self.positions(ids)]
