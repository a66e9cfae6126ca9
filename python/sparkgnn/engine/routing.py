"""Routing rows to a chosen partition with Spark's own shuffle.

Why: the executor decides which partition needs which row (vertex-cut mirrors, partial states),
but DataFrame.repartition(n, col) hashes the column. Spark's HashPartitioning puts a row in
pmod(murmur3(key, 42), n), so for every partition p we find one small long key whose hash lands in
p ("representative key"), write it in column `k`, and repartition on `k`: the row lands exactly in p.
Adaptive coalescing must be off (engine.session.REQUIRED_CONF) so shuffle partition i is task i.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# Kinds of routed rows (column `kind`).
OWN, SRC, STATE, DST, EDGE = 0, 1, 2, 3, 4
PE_STATE = 5  # a vertex's merged aggregation state, kept for the PE store (never routed onwards)

ROW_SCHEMA_DDL = "k long, pt int, kind int, id long, aux long, w float, v binary"
ROW_SCHEMA = pa.schema(
    [
        ("k", pa.int64()),
        ("pt", pa.int32()),
        ("kind", pa.int32()),
        ("id", pa.int64()),
        ("aux", pa.int64()),
        ("w", pa.float32()),
        ("v", pa.binary()),
    ]
)
OUTPUT_SCHEMA_DDL = "id long, h array<float>"
OUTPUT_PRED_SCHEMA_DDL = "id long, h array<float>, pred long"
# What the last step returns when its tasks write the output files themselves (one row per partition).
FILES_SCHEMA_DDL = "pt int, rows long, bytes long"

PARTITION_EXPR = "pmod(hash({col}), {n})"


def partition_expr(column: str, partitions: int) -> str:
    """SQL for the partition that owns a vertex id (the same hash Spark's repartition(id) uses)."""
    return PARTITION_EXPR.format(col=column, n=int(partitions))


def partition_column(column: str, partitions: int):
    """partition_expr as a Spark Column (int)."""
    from pyspark.sql import functions as F

    return F.expr(partition_expr(column, partitions)).cast("int")


_KEYS: dict[int, np.ndarray] = {}


def partition_keys(spark, partitions: int) -> np.ndarray:
    """Representative key per partition: key[p] (the smallest non-negative id) hashes into
    partition p under Spark's hash. Found with `owner_partition`, the numpy port of that hash which
    the files exchange and prepare already place vertices with and which tests hold against Spark
    itself, so no Spark job runs for it (on a cold JVM that job took seconds). `spark` is not read;
    callers pass the session the keys are used with."""
    count = int(partitions)
    if count not in _KEYS:
        candidates = np.arange(64 * count + 1024, dtype=np.int64)
        owners, first = np.unique(owner_partition(candidates, count), return_index=True)
        missing = sorted(set(range(count)) - {int(p) for p in owners})
        if missing:
            raise RuntimeError(f"no representative routing key found for partitions {missing[:5]}")
        _KEYS[count] = candidates[first]  # owners are sorted, first[i] the first id owned by partition i
    return _KEYS[count]


def route(df, partitions: int):
    """Shuffle routed rows so that every row lands in partition `pt` (via its key `k`)."""
    return df.repartition(int(partitions), "k")


def key_expr(keys: np.ndarray, pt_column: str) -> str:
    """SQL expression mapping a partition column to its representative key. The key must be a long:
    Spark hashes an int and a long of the same value differently."""
    return f"cast(element_at(array({', '.join(str(int(k)) for k in keys)}), {pt_column} + 1) as long)"


def make_rows(
    keys: np.ndarray,
    pt: np.ndarray,
    kind: int,
    ids: np.ndarray,
    v: pa.Array,
    aux: np.ndarray | None = None,
    w: np.ndarray | None = None,
) -> pa.RecordBatch:
    """Build a batch of routed rows (vectorised)."""
    n = len(ids)
    pt = np.asarray(pt, dtype=np.int32)
    routed_keys = np.where(pt >= 0, keys[np.clip(pt, 0, len(keys) - 1)], -1).astype(np.int64)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(routed_keys),
            pa.array(pt),
            pa.array(np.full(n, kind, dtype=np.int32)),
            pa.array(np.asarray(ids, dtype=np.int64)),
            pa.array(np.full(n, -1, dtype=np.int64) if aux is None else np.asarray(aux, dtype=np.int64)),
            pa.array(np.ones(n, dtype=np.float32) if w is None else np.asarray(w, dtype=np.float32)),
            v,
        ],
        schema=ROW_SCHEMA,
    )


def split_batches(batch: pa.RecordBatch, max_rows: int = 32768):
    """Spark converts Arrow batches to rows batch by batch; moderate sizes keep memory flat."""
    for start in range(0, batch.num_rows, max_rows):
        yield batch.slice(start, max_rows)


def _rotl32(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix(h1: np.ndarray, word: np.ndarray) -> np.ndarray:
    k1 = _rotl32(word * np.uint32(0xCC9E2D51), 15) * np.uint32(0x1B873593)
    h1 = _rotl32(h1 ^ k1, 13)
    return h1 * np.uint32(5) + np.uint32(0xE6546B64)


def spark_hash_long(ids: np.ndarray, seed: int = 42) -> np.ndarray:
    """Spark SQL's `hash(id)` of a long column (Murmur3_x86_32.hashLong with seed 42), vectorised,
    as int32. Why: tasks that read vertex files themselves (the files exchange's feature scan)
    must place each vertex in the partition Spark's `pmod(hash(id), n)` gives it everywhere else."""
    words = np.ascontiguousarray(ids, dtype=np.int64).view(np.uint32).reshape(-1, 2)  # little-endian: low, high
    with np.errstate(over="ignore"):
        h1 = np.full(len(words), seed, dtype=np.uint32)
        h1 = _mix(h1, words[:, 0].copy())
        h1 = _mix(h1, words[:, 1].copy())
        h1 ^= np.uint32(8)
        h1 ^= h1 >> np.uint32(16)
        h1 *= np.uint32(0x85EBCA6B)
        h1 ^= h1 >> np.uint32(13)
        h1 *= np.uint32(0xC2B2AE35)
        h1 ^= h1 >> np.uint32(16)
    return h1.view(np.int32)


def owner_partition(ids: np.ndarray, partitions: int) -> np.ndarray:
    """`partition_expr(id, n)` computed in numpy: pmod(hash(id), n), int32."""
    return np.mod(spark_hash_long(ids).astype(np.int64), int(partitions)).astype(np.int32)
