"""Shared helpers of the streaming tests (imported by this unique module name, never through
conftest): a Cora serving set-up on disk (G, two models, a verified PE store, requests), bad
requests and malformed files, and answer comparisons against QueryEngine."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from sparkgnn.serving.request import Request, write_requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(ROOT, "spark_jobs", "stream_queries.py")


@dataclass
class StreamSetup:
    graph_dir: str  # G (Cora without the query pool)
    graph: object  # GraphData of G
    model_path: str  # the model the store was computed for
    other_model_path: str  # same architecture, other weights: the store is stale for it
    store: str
    requests: list  # valid requests of mixed sizes


def sage_model(in_dim: int, out: int, seed: int):
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.models import Model

    torch.manual_seed(seed)
    return Model.from_pyg(GraphSAGE(in_dim, 16, 2, out_channels=out).eval())


def build_setup(root: str) -> StreamSetup:
    from sparkgnn.datasets import load_cora
    from sparkgnn.graph import write_graph_dir
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.serving.workload import make_workload

    wl = make_workload(load_cora(), (8, 32, 96), 2, seed=7)
    graph_dir = os.path.join(root, "graph")
    write_graph_dir(wl.graph_G, graph_dir, overwrite=True)
    model = sage_model(wl.graph_G.feature_dim, 7, seed=1)
    model_path = os.path.join(root, "model_a")
    model.save(model_path)
    other = os.path.join(root, "model_b")
    sage_model(wl.graph_G.feature_dim, 7, seed=2).save(other)
    store = os.path.join(root, "store")
    precompute_local(wl.graph_G, model, store)
    from sparkgnn.graph import read_graph_dir

    return StreamSetup(graph_dir, read_graph_dir(graph_dir), model_path, other, store, wl.requests)


def write_one_per_file(folder: str, requests) -> list[str]:
    return [write_requests(os.path.join(folder, f"{r.request_id}.parquet"), [r]) for r in requests]


def bad_requests(graph, like: Request) -> dict:
    """Requests that parse but are invalid for G, by the problem they have."""
    q = like.qid
    unknown = Request(
        "bad-unknown-id", q, like.x, np.concatenate([like.src, [10**12]]), np.concatenate([like.dst, [q[0]]])
    )
    wide = Request("bad-width", q, np.zeros((len(q), graph.feature_dim + 3), np.float32), like.src, like.dst)
    x_nan = like.x.copy()
    x_nan[0, 0] = np.nan
    nan = Request("bad-nan", q, x_nan, like.src, like.dst)
    return {"edges name an id": unknown, "width": wide, "NaN": nan}


def write_malformed(folder: str) -> dict:
    """Malformed request files -> the words their dead-letter reason must contain."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "zz-garbage.parquet"), "wb") as fh:
        fh.write(b"this is not parquet at all")
    pq.write_table(
        pa.table({"request_id": ["r"], "kind": ["node"], "node": [1]}),
        os.path.join(folder, "zz-missing-columns.parquet"),
    )
    from sparkgnn.serving.request import SCHEMA

    pq.write_table(
        pa.table(
            {
                "request_id": ["r"],
                "kind": ["vertex"],
                "node": pa.array([1], pa.int64()),
                "x": pa.array([[1.0]], pa.list_(pa.float32())),
                "src": pa.array([None], pa.int64()),
                "dst": pa.array([None], pa.int64()),
            },
            schema=SCHEMA,
        ),
        os.path.join(folder, "zz-bad-kind.parquet"),
    )
    return {
        "zz-garbage.parquet": "not a readable Parquet file",
        "zz-missing-columns.parquet": "lacks column(s)",
        "zz-bad-kind.parquet": "kind not in",
    }


def engine_answers(engine, requests) -> dict:
    return {r.request_id: engine.answer(r) for r in requests}


def assert_rows_equal_answers(table: pa.Table, expected: dict) -> None:
    """Each expected request id appears exactly once, without error, with QueryEngine's answer."""
    rid = table.column("request_id").to_pylist()
    for name, answer in expected.items():
        assert rid.count(name) == 1, (name, rid.count(name))
        row = table.slice(rid.index(name), 1).to_pylist()[0]
        assert row["error"] is None, (name, row["error"])
        np.testing.assert_array_equal(np.array(row["qid"], np.int64), answer.qid)
        h = np.array(row["h"], np.float32)
        np.testing.assert_array_equal(h, answer.h)
        if answer.pred is not None:
            np.testing.assert_array_equal(np.array(row["pred"], np.int64), answer.pred)


def job_env() -> dict:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def job_command(
    setup: StreamSetup, requests_dir: str, out: str, checkpoint: str, *extra: str, model: str | None = None
) -> list[str]:
    return [
        sys.executable,
        JOB,
        "--graph",
        setup.graph_dir,
        "--model",
        model or setup.model_path,
        "--store",
        setup.store,
        "--requests",
        requests_dir,
        "--out",
        out,
        "--checkpoint",
        checkpoint,
        "--torch-threads",
        "1",
        *extra,
    ]
