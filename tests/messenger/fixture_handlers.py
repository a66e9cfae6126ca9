"""Deterministic handlers for transport tests (test fixtures, not product code).

`scale` multiplies the float column `x` by header["factor"] (default 2) and echoes `id`, so a
result proves which request it answers. Child worker processes import this module by path
(`--handler fixture_handlers:scale`, with this folder on PYTHONPATH)."""

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def scale(header, tables):
    t = tables["batch"]
    factor = header.get("factor", 2.0)
    if header.get("sleep"):
        time.sleep(header["sleep"])
    if header.get("fail"):
        raise ValueError(f"asked to fail: {header['fail']}")
    x = pc.multiply(t.column("x"), pa.scalar(factor, pa.float64()))
    out = pa.table({"id": t.column("id"), "x": x})
    if header.get("repeat"):  # a result larger than the request
        out = pa.concat_tables([out] * header["repeat"])
    return {"worker_pid": os.getpid()}, {"out": out}


def sink(header, tables):
    """Consumes the batch and answers its row count: the one-way throughput handler."""
    return {"received_rows": sum(t.num_rows for t in tables.values())}, {}


def batch(n, start=0, seed=None):
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"batch": pa.table({"id": ids, "x": ids.astype(np.float64) * 0.5})}


KEPT = []


def keep(header, tables):
    """Retains its input (like a cache of zero-copy views would): the shared memory segment the
    input lives in must then never be overwritten."""
    KEPT.append(tables["batch"])
    return {}, {"out": tables["batch"]}
