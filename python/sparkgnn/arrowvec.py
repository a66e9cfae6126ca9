"""Vectors in Arrow columns, without per-row Python work.

Why this module exists: rows of float32 vectors cross three boundaries (Spark <-> Python worker,
Python worker <-> DL worker, Parquet). Packed float32 binary reaches Python faster than
array<float> (docs/PLATFORM.md measures both), and mapInArrow cannot return fixed_size_list. So on the
Spark side vectors travel as `binary` (one packed float32 row per value); between the graph glue and
the DL handler they travel as fixed_size_list<float32> (the natural Arrow tensor row); user-facing
outputs are list<float>. Every conversion here is a buffer view, not a Python loop.
Only numpy and pyarrow are imported (the messenger and the graph glue use this too).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

FLOAT_BYTES = 4
# The DL side (dl/tensors.py) copies any vector buffer that is not 64-byte aligned, so CPU kernels
# take the same code path whatever route the rows came by; buffers built here start aligned, so on
# the in-process route nothing is copied twice.
ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """An uninitialised array whose data starts on an ALIGNMENT-byte boundary (numpy's own large
    allocations start 16 bytes into a page)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = (-buffer.ctypes.data) % ALIGNMENT
    return buffer[start : start + nbytes].view(dtype).reshape(shape)


def _as_float32_matrix(values: np.ndarray) -> np.ndarray:
    matrix = np.ascontiguousarray(values, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-d array of vectors, got shape {matrix.shape}")
    return matrix


def pack_binary(values: np.ndarray) -> pa.BinaryArray:
    """[n, w] float32 -> binary array whose i-th value holds row i's 4*w bytes."""
    matrix = _as_float32_matrix(values)
    n, width = matrix.shape
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(width * FLOAT_BYTES)
    return pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(matrix.reshape(-1).view(np.uint8))]
    )


def unpack_binary(array, width: int | None = None) -> np.ndarray:
    """Binary (or chunked binary) column of packed float32 rows -> [n, w] float32 (a view when possible)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    n = len(array)
    if n == 0:
        return np.zeros((0, width or 0), dtype=np.float32)
    if array.null_count:
        raise ValueError(f"{array.null_count} vector values are null")
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=n + 1, offset=array.offset * 4)
    lengths = np.diff(offsets)
    row_bytes = int(lengths[0])
    if (lengths != row_bytes).any() or row_bytes % FLOAT_BYTES:
        raise ValueError("packed vectors have differing or non-float32 byte lengths")
    if width is not None and row_bytes != width * FLOAT_BYTES:
        raise ValueError(f"packed vectors are {row_bytes // FLOAT_BYTES} floats wide, expected {width}")
    data = np.frombuffer(
        array.buffers()[2], dtype=np.uint8, count=int(offsets[-1] - offsets[0]), offset=int(offsets[0])
    )
    return data.view(np.float32).reshape(n, row_bytes // FLOAT_BYTES)


def to_fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
    """[n, w] float32 -> fixed_size_list<float32>[w] (zero copy)."""
    matrix = _as_float32_matrix(values)
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def to_list(values: np.ndarray) -> pa.ListArray:
    """[n, w] float32 -> list<float32> (what Spark and users see as array<float>)."""
    matrix = _as_float32_matrix(values)
    n, width = matrix.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * np.int32(width))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.reshape(-1)))


def is_float_list(kind: pa.DataType) -> bool:
    """Whether the Arrow type `kind` is a (fixed-size) list of floats, e.g. an h or state column."""
    return (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind)) and pa.types.is_floating(kind.value_type)


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns of `schema` worth Parquet's dictionary encoding (pq.write_table's use_dictionary):
    all but float vector columns. WHY: embedding values hardly repeat, so the dictionary pass over a
    vector column is wasted work that falls back to plain pages, and a reader decodes such a file
    about 2.3x slower (400K rows of 128 floats: 1.21 s against 0.53 s)."""
    return [field.name for field in schema if not is_float_list(field.type)]


def parquet_options(schema: pa.Schema, unique: tuple[str, ...] = ()) -> dict:
    """pq.write_table's keywords for a table of vector columns (h, state, x) beside plain ones (id,
    y): the vector columns without a dictionary (dictionary_columns), uncompressed and without
    statistics, the others snappy (as Spark writes) with statistics; `unique`: plain columns
    whose values never repeat (a layer's ids), also without a dictionary. WHY: float embeddings
    neither compress nor have useful min/max, so both passes are wasted work on every row that
    only make the file slower to write (docs/ARCHITECTURE.md, "Parquet settings")."""
    vectors = {field.name for field in schema if is_float_list(field.type)}
    plain = [field.name for field in schema if field.name not in vectors]
    return {
        "use_dictionary": [name for name in plain if name not in unique],
        "compression": {name: ("none" if name in vectors else "snappy") for name in schema.names},
        "write_statistics": plain,
    }


def to_numpy_matrix(array, width: int | None = None) -> np.ndarray:
    """Any vector column (list, large_list, fixed_size_list of float/double, or packed binary) ->
    [n, w] float32. Raises ValueError naming the problem for ragged widths or nulls."""
    if isinstance(array, pa.ChunkedArray):
        array = (
            array.combine_chunks()
            if array.num_chunks != 1
            else (array.chunk(0) if array.num_chunks else pa.array([], array.type))
        )
    kind = array.type
    if pa.types.is_binary(kind):
        return unpack_binary(array, width)
    if array.null_count:
        raise ValueError(f"{array.null_count} vector values are null")
    n = len(array)
    if n == 0 and width is not None:
        # An empty column says nothing about the width (senders build empty tables with a
        # placeholder type, e.g. a zero-edge partition's states): the caller's width wins.
        return np.zeros((0, width), dtype=np.float32)
    if pa.types.is_fixed_size_list(kind):
        row_width = kind.list_size
        flat = array.flatten()
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = np.asarray(array.offsets)
        lengths = np.diff(offsets)
        row_width = int(lengths[0]) if n else (width or 0)
        if n and (lengths != row_width).any():
            bad = np.flatnonzero(lengths != row_width)
            raise ValueError(
                f"{len(bad)} vectors differ in width from the first ({row_width}); first rows: {bad[:5].tolist()}"
            )
        flat = array.flatten()
    else:
        raise ValueError(f"column of type {kind} is not a vector column")
    if width is not None and n and row_width != width:
        raise ValueError(f"vectors are {row_width} wide, expected {width}")
    values = flat.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values, dtype=np.float32).reshape(n, row_width)
