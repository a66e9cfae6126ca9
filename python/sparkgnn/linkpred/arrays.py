"""Arrow list<float> columns <-> numpy [N, F] float32 matrices (the node outputs `h`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def matrix(column: pa.Array | pa.ChunkedArray, width: int | None = None) -> np.ndarray:
    """[N, F] float32 from a list<float> column whose rows all have one length."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if n == 0:
        return np.zeros((0, width or 0), dtype=np.float32)
    return values.reshape(n, -1)


def ids(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
